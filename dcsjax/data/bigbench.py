"""BIG-bench, offline and real: the task files shipped in the `bigbench==1.0.0` sdist.

`fetch_bigbench()` downloads the sdist from the package index once and unpacks its
`benchmark_tasks/**/task.json` into the cache; where the index no longer serves it, the user gives a copy of
the sdist or a BIG-bench checkout (`dcsjax fetch bigbench --from PATH`) and the cache takes its task files.
`bigbench_items("known_unknowns")` reads a task whose examples carry `target_scores`. A task made of
subtasks (`logical_deduction`) reads them all; `bigbench:logical_deduction/three_objects` reads one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Sequence

from dcsjax.data.items import Item, ItemError, check_item
from dcsjax.errors import DcsjaxError, FetchError
from dcsjax.cache import cache_dir, cache_lock, sha256_file

SDIST = "bigbench==1.0.0"
SDIST_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
# pip >= 24.1 refuses to prepare this sdist's metadata (it declares a file:// dependency), even for a bare
# `download --no-deps`. pip 24.0, itself fetched from the index as a wheel and run from it, still saves it.
DOWNLOADER = "pip==24.0"
# Where the index no longer serves the sdist, a copy of it, or a BIG-bench checkout, given by the user.
SOURCE_ENV = "DCSJAX_BIGBENCH"
HOW_TO_GIVE = (f"give a copy instead: `dcsjax fetch bigbench --from PATH` (or {SOURCE_ENV}=PATH), PATH being "
               f"bigbench-1.0.0.tar.gz (SHA-256 {SDIST_SHA256}) or a BIG-bench checkout "
               "(git clone https://github.com/google/BIG-bench)")


class BigBenchUnavailable(FetchError):
    """The package index answered but does not carry the sdist, and no copy was given: BIG-bench's task files
    cannot be had on this machine."""


def tasks_root() -> Path:
    return cache_dir() / "bigbench" / "benchmark_tasks"


def fetch_bigbench(quiet: bool = False, source: str | Path | None = None) -> Path:
    """BIG-bench's task files in the cache: from the sdist on the index, or from `source` (the sdist file or a
    checkout; else `$DCSJAX_BIGBENCH`) where the index does not serve it. A given `source` replaces what the
    cache holds; the cache's COMPLETE file names where its tasks came from."""
    root = tasks_root()
    done = root.parent / "COMPLETE"
    if done.exists() and source is None:
        return root
    with cache_lock("bigbench"):
        if done.exists() and source is None:  # another process fetched it while this one waited
            return root
        source = source or os.environ.get(SOURCE_ENV) or None
        from dcsjax.cache import CACHE_HINT
        from dcsjax.errors import writing

        with writing(root, CACHE_HINT):
            return _install(root, done, quiet, Path(source) if source else None)


def _install(root: Path, done: Path, quiet: bool, source: Path | None) -> Path:
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        staging = Path(tmp) / "tasks"
        if source is not None and not source.exists():
            raise FetchError(f"{source}: no such file or folder (BIG-bench's sdist or a checkout of it)")
        if source is None or source.is_file():
            sdist = source or _download_sdist(Path(tmp), quiet)
            if (got := sha256_file(sdist)) != SDIST_SHA256:
                raise FetchError(f"{sdist}: SHA-256 {got}, expected {SDIST_SHA256} ({SDIST}'s sdist)")
            _unpack_tasks(sdist, staging)
            origin = SDIST if source is None else f"{SDIST} from {source.resolve()}"
        else:
            _copy_tasks(source, staging)
            origin = f"checkout {source.resolve()}"
        if root.exists():
            import shutil

            shutil.rmtree(root)
        os.replace(staging, root)
    done.write_text(origin + "\n")
    return root


def _download_sdist(folder: Path, quiet: bool) -> Path:
    if not quiet:
        print(f"fetching BIG-bench: pip download {SDIST} (source distribution)", file=sys.stderr)
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(folder)]
    proc = subprocess.run([*pip, DOWNLOADER], capture_output=True, text=True)
    wheels = list(folder.glob("pip-*.whl"))
    if wheels:
        proc = subprocess.run([sys.executable, str(wheels[0] / "pip"), *pip[3:], "--no-binary", ":all:", SDIST],
                              capture_output=True, text=True)
    sdists = list(folder.glob("bigbench-*.tar.gz"))
    if sdists:
        return sdists[0]
    said = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("ERROR")]
    if any("No matching distribution" in line for line in said):
        raise BigBenchUnavailable(f"{SDIST} is not on the package index any more ({' '.join(said)}); {HOW_TO_GIVE}")
    raise FetchError(f"pip download {SDIST} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n{HOW_TO_GIVE}")


def _unpack_tasks(sdist: Path, staging: Path) -> None:
    with tarfile.open(sdist) as tar:
        for member in tar:
            parts = member.name.split("/")
            if member.isfile() and parts[-1] == "task.json" and "benchmark_tasks" in parts:
                target = staging / Path(*parts[parts.index("benchmark_tasks") + 1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, target.open("wb") as dst:
                    dst.write(src.read())


def _copy_tasks(checkout: Path, staging: Path) -> None:
    """The task files of a BIG-bench checkout (its root, its `bigbench/` or its `benchmark_tasks/`), laid out
    as in the sdist."""
    import shutil

    base = checkout.resolve()
    candidates = (base, base / "benchmark_tasks", base / "bigbench" / "benchmark_tasks")
    tasks = next((c for c in candidates if c.name == "benchmark_tasks" and c.is_dir()), None)
    files = sorted(tasks.rglob("task.json")) if tasks else []
    if not files:
        raise FetchError(f"{checkout}: no benchmark_tasks/**/task.json in it: not a BIG-bench checkout")
    for path in files:
        target = staging / path.relative_to(tasks)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def bigbench_items(task: str, idk_choice: str | Sequence[str] | None = None) -> tuple[list[Item], list[ItemError]]:
    """Items of a BIG-bench task (or all its subtasks) and error records for examples that fail checks."""
    root = fetch_bigbench(quiet=True)
    path = root / task / "task.json"
    if not path.is_file():
        known = sorted(p.parent.relative_to(root).as_posix() for p in root.glob("*/task.json"))
        close = [k for k in known if task.split("/")[0] in k][:10]
        raise DcsjaxError(f"BIG-bench has no task {task!r}" + (f"; did you mean one of {close}?" if close else ""))
    data = _read_json(path)
    subtasks = sorted(p.parent for p in path.parent.glob("*/task.json"))
    if not data.get("examples") and subtasks:
        items, errors = [], []
        for sub in subtasks:
            i, e = bigbench_items(sub.relative_to(root).as_posix(), idk_choice)
            items += i
            errors += e
        return items, errors
    return _task_items(task, data, idk_choice, str(path))


def _read_json(path: Path) -> dict:
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise DcsjaxError(f"{path}:{line}: not UTF-8 (byte 0x{data[err.start]:02x})") from err
    except json.JSONDecodeError as err:
        raise DcsjaxError(f"{path}: broken JSON at line {err.lineno}: {err.msg}") from err


def _task_items(task: str, data: dict, idk_choice: str | Sequence[str] | None, where: str) -> tuple[list[Item], list[ItemError]]:
    prefix = data.get("task_prefix", "") or ""
    items: list[Item] = []
    errors: list[ItemError] = []
    for index, example in enumerate(data.get("examples", [])):
        here = f"{where} example {index}"
        scores = example.get("target_scores")
        if not isinstance(scores, dict):
            errors.append(ItemError(here, "no target_scores: not a multiple-choice example"))
            continue
        choices = tuple(scores)
        values = [float(v) for v in scores.values()]
        best = max(values) if values else 0.0
        correct = tuple(i for i, v in enumerate(values) if v == best and v > 0)
        idk = _find_choice(choices, idk_choice)
        text = str(example.get("input", "")).strip()
        question = f"{prefix.strip()}\n{text}" if prefix.strip() else text
        source = {"benchmark": f"bigbench:{task}", "example": index, "input": text}
        comment = example.get("comment")
        if isinstance(comment, dict) and "question_index" in comment:  # BBQ: examples generated from templates
            source["template"] = f"{comment.get('category', task)}/{comment['question_index']}"
        item = Item(id=f"{task}/{index}", question=question, choices=choices, correct=correct, idk=idk, source=source)
        checked = check_item(item, here)
        (items if isinstance(checked, Item) else errors).append(checked)
    return items, errors


def _find_choice(choices: tuple[str, ...], text: str | Sequence[str] | None) -> int | None:
    """Index of the card's IDK choice (one text, or several: BBQ words it ten ways), matched after stripping
    whitespace and case, so ' Unknown' counts."""
    if text is None:
        return None
    wanted = {t.strip().casefold() for t in ([text] if isinstance(text, str) else text)}
    for i, choice in enumerate(choices):
        if choice.strip().casefold() in wanted:
            return i
    return None
