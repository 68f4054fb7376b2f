"""BIG-bench, offline and real: the task files shipped in the `bigbench==1.0.0` sdist on the package index.

`fetch_bigbench()` downloads the sdist once and unpacks its `benchmark_tasks/**/task.json` into the cache;
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
from dcsjax.checkpoints.paths import cache_dir, cache_lock

SDIST = "bigbench==1.0.0"
SDIST_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
# pip >= 24.1 refuses to prepare this sdist's metadata (it declares a file:// dependency), even for a bare
# `download --no-deps`. pip 24.0, itself fetched from the index as a wheel and run from it, still saves it.
DOWNLOADER = "pip==24.0"


def tasks_root() -> Path:
    return cache_dir() / "bigbench" / "benchmark_tasks"


def fetch_bigbench(quiet: bool = False) -> Path:
    root = tasks_root()
    done = root.parent / "COMPLETE"
    if done.exists():
        return root
    with cache_lock("bigbench"):
        if done.exists():  # another process fetched it while this one waited
            return root
        return _fetch_bigbench(root, done, quiet)


def _fetch_bigbench(root: Path, done: Path, quiet: bool) -> Path:
    from dcsjax.checkpoints.paths import CACHE_HINT
    from dcsjax.errors import writing

    with writing(root, CACHE_HINT):
        return _unpack_bigbench(root, done, quiet)


def _unpack_bigbench(root: Path, done: Path, quiet: bool) -> Path:
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        if not quiet:
            print(f"fetching BIG-bench: pip download {SDIST} (source distribution)", file=sys.stderr)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", tmp]
        proc = subprocess.run([*pip, DOWNLOADER], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("pip-*.whl"))
        if wheels:
            proc = subprocess.run([sys.executable, str(wheels[0] / "pip"), *pip[3:], "--no-binary", ":all:", SDIST],
                                  capture_output=True, text=True)
        sdists = list(Path(tmp).glob("bigbench-*.tar.gz"))
        if not sdists:
            raise FetchError(f"pip download {SDIST} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        from dcsjax.checkpoints.fetch import sha256_file

        if (got := sha256_file(sdists[0])) != SDIST_SHA256:
            raise FetchError(f"{sdists[0].name}: SHA-256 {got}, expected {SDIST_SHA256}")
        staging = Path(tmp) / "tasks"
        with tarfile.open(sdists[0]) as tar:
            for member in tar:
                parts = member.name.split("/")
                if member.isfile() and parts[-1] == "task.json" and "benchmark_tasks" in parts:
                    rel = Path(*parts[parts.index("benchmark_tasks") + 1:])
                    target = staging / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(member) as src, target.open("wb") as dst:
                        dst.write(src.read())
        if root.exists():
            import shutil

            shutil.rmtree(root)
        os.replace(staging, root)
    done.write_text(SDIST + "\n")
    return root


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
