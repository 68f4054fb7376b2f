"""The one owner of the results layout: paths, record fingerprints, the locked writer and the readers.

    OUTPUT/.lock                               held by the one process that writes here
    OUTPUT/summary.json                        one row per (model, task, protocol), merged, written atomically
    OUTPUT/<model>/<task>/<protocol>.jsonl     one record per item, appended and fsynced as they finish
    OUTPUT/<model>/<task>/errors.jsonl         items that could not be loaded, with where and why
    OUTPUT/<model>/<task>/<protocol>.errors.jsonl  items that protocol could not score (its latest attempt)
    OUTPUT/<model>/<task>/fingerprints.json    fingerprint -> the settings it stands for

Every record carries the fingerprint of what made it: the model (file checksum, card, dtype, document
start), the task (its card and a digest of its items), the protocol and its settings (loadings, prompt,
chat template or not, option order) and the code (version and a digest of dcsjax's sources). A resumed
run reuses only records whose fingerprint equals its own; any other record makes it stop with a message
that names what differs (or, asked to replace them, move the old file aside to `<protocol>.jsonl.stale`, then
`.stale.2`, ...: never overwritten).

Readers never write: a broken line is skipped with a warning naming file and line, and a second record
of an item is ignored (the first is kept), both counted. Only the writer, holding the lock, repairs the
one thing a kill leaves behind in its own file: a last line cut short.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from dcsjax.errors import DcsjaxError, writing

SUMMARY = "summary.json"
LOCK = ".lock"
FINGERPRINTS = "fingerprints.json"
ERRORS = "errors"
SUMMARY_KEY = ("model", "task", "protocol")


class ResultsError(DcsjaxError):
    """A results folder cannot be used as asked: locked, unwritable, or holding records of other settings."""


# ------------------------------------------------------------------------------------------------ layout
def task_folder(output: Path, model: str, task_slug: str) -> Path:
    return Path(output) / model / task_slug


def records_path(output: Path, model: str, task_slug: str, protocol: str) -> Path:
    return task_folder(output, model, task_slug) / f"{protocol}.jsonl"


def protocol_errors_path(output: Path, model: str, task_slug: str, protocol: str) -> Path:
    """The items `protocol` could not score, a file per protocol: a run of one protocol never rewrites
    another's (a failed item is retried by the next run of its protocol, which starts this file anew)."""
    return task_folder(output, model, task_slug) / f"{protocol}.{ERRORS}.jsonl"


def result_files(root: Path) -> Iterable[tuple[str, str, str, Path]]:
    """(model, task, protocol, path) of every records file of the results layout under `root`
    (ROOT/model/task/protocol.jsonl, beside the fingerprints.json its writer kept); any other .jsonl file
    there (a copy put aside, notes) is skipped with a warning naming it, never read as a model or protocol."""
    for path in sorted(Path(root).glob("*/*/*.jsonl")):
        if path.stem == ERRORS or path.stem.endswith(f".{ERRORS}"):
            continue
        why = _not_records(path)
        if why is None:
            yield path.parent.parent.name, path.parent.name, path.stem, path
        else:
            warnings.warn(f"{path}: skipped, {why}", stacklevel=2)


def _not_records(path: Path) -> str | None:
    """Why `path` is not a records file of this layout, or None: its folder has the writer's fingerprints.json
    and its first record carries one of them (an empty file holds no records to misread)."""
    known = path.parent / FINGERPRINTS
    if not known.is_file():
        return f"not in the results layout (no {FINGERPRINTS} beside it)"
    with path.open("rb") as f:
        first = next((line for line in f if line.strip()), None)
    if first is None:
        return None
    try:
        fingerprint = json.loads(first).get("fingerprint")
        fingerprints = json.loads(known.read_text())
    except (ValueError, AttributeError):
        return "its first line is no record of this layout"
    return None if fingerprint in fingerprints else f"its records carry no fingerprint of {known}"


# ------------------------------------------------------------------------------------------------ fingerprints
def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def digest(obj: Any, n: int = 16) -> str:
    """A short hex digest of a JSON-able object (key order does not matter)."""
    return hashlib.sha256(canonical(obj).encode()).hexdigest()[:n]


@lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """dcsjax's version and a digest of its Python sources: a record is reused only by the same code."""
    from dcsjax import __version__

    package = Path(__file__).resolve().parents[1]  # the dcsjax package
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return {"dcsjax": __version__, "sources": h.hexdigest()[:12]}


def environment() -> dict:
    """The versions and devices a run used, for summary.json: dcsjax (its source digest, and its git
    commit where it runs from a checkout), Python, jax, jaxlib, flax, transformers, numpy, the devices."""
    import platform
    import subprocess
    from importlib import metadata

    import jax

    def version(package):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    package = Path(__file__).resolve().parents[1]  # the dcsjax package
    try:
        commit = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    devices = jax.devices()
    return {**code_version(), "git_commit": commit, "python": platform.python_version(),
            **{name: version(name) for name in ("jax", "jaxlib", "flax", "transformers", "numpy")},
            "devices": {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices),
                        "processes": jax.process_count()}}


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """'key: old -> new' for every leaf that differs between two settings dicts."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


# ------------------------------------------------------------------------------------------------ readers
@dataclass
class ReadReport:
    """What a reader skipped, so that callers can count it."""
    broken: list[str] = field(default_factory=list)  # "file:line: why"
    duplicates: list[str] = field(default_factory=list)  # "file:line: id"


def read_jsonl(path: Path, report: ReadReport | None = None, key: str | None = "id") -> list[dict]:
    """The records of a JSONL file, never changing it. A line that is not a JSON object (or is cut short)
    is skipped with a warning naming file and line; with `key`, a second record of the same key too."""
    path = Path(path)
    report = report if report is not None else ReadReport()
    if not path.exists():
        return []
    records, seen = [], set()
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
            except (UnicodeDecodeError, ValueError) as err:
                why = "cut short" if not line.endswith(b"\n") else f"not a JSON record ({err})"
                report.broken.append(f"{path}:{number}: {why}")
                warnings.warn(f"{path}:{number}: skipped, {why}", stacklevel=2)
                continue
            if key is not None:
                if record.get(key) in seen:
                    report.duplicates.append(f"{path}:{number}: {record.get(key)}")
                    warnings.warn(f"{path}:{number}: skipped, a second record of {record.get(key)!r}", stacklevel=2)
                    continue
                seen.add(record.get(key))
            records.append(record)
    return records


def read_records(path: Path, report: ReadReport | None = None) -> list[dict]:
    """A protocol's records (one per item id); see `read_jsonl`."""
    return read_jsonl(path, report)


def read_errors(folder: Path) -> list[dict]:
    """A task's error records ({"where", "error"}): the items that could not be loaded, then each protocol's
    that could not be scored; an item may fail under several protocols."""
    paths = [Path(folder) / f"{ERRORS}.jsonl", *sorted(Path(folder).glob(f"*.{ERRORS}.jsonl"))]
    return [e for path in paths for e in read_jsonl(path, key=None)]


def model_facts(root: Path, model: str) -> dict:
    """What the records of `model` under a results folder say of it (their fingerprints' model part: file
    checksum or hub revision, dtype, variant, parameters); {} where nothing says."""
    for path in sorted(Path(root).glob(f"{model}/*/{FINGERPRINTS}")):
        try:
            for settings in json.loads(path.read_text()).values():
                if isinstance(settings, dict) and isinstance(settings.get("model"), dict):
                    return settings["model"]
        except ValueError:
            warnings.warn(f"{path}: not readable JSON; skipped", stacklevel=2)
    return {}


def read_summary(output: Path) -> dict:
    path = Path(output) / SUMMARY
    if not path.exists():
        return {"rows": []}
    try:
        summary = json.loads(path.read_text())
        if not isinstance(summary.get("rows"), list):
            raise ValueError("no list of rows")
    except (ValueError, AttributeError) as err:
        raise ResultsError(f"{path}: not a dcsjax summary ({err}); move it away to start a new one") from err
    return summary


def check_readable(output: Path) -> None:
    """The JSON files a run reads back (summary.json, each task's fingerprints.json), parsed before any
    scoring: a broken one is named now, not after an hour of scoring."""
    read_summary(output)
    for path in sorted(Path(output).glob(f"*/*/{FINGERPRINTS}")):
        try:
            known = json.loads(path.read_text())
            if not isinstance(known, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as err:
            raise ResultsError(f"{path}: not a fingerprints file ({err}); the records beside it cannot be "
                               "resumed without it: restore it, or move the folder away to score anew") from err


# ------------------------------------------------------------------------------------------------ writing
def json_safe(obj: Any) -> Any:
    """NaN and infinities become null: the files stay valid JSON for every reader."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy scalars
        return json_safe(obj.item())
    return obj


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write to a temporary file beside `path`, fsync, rename: a reader sees the old file or the new one."""
    write_text_atomic(path, json.dumps(json_safe(obj), indent=1, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into a temporary file `.NAME.<random>` beside `path`, fsynced, renamed over it. A kill between
    the two leaves the temporary file, which the next run removes (`remove_temporaries`)."""
    path = Path(path)
    with writing(path):
        _write_then_rename(path, text)


def _write_then_rename(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; a results file is as readable as any other
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_temporaries(output: Path) -> list[Path]:
    """The temporary files a killed run left beside summary.json, fingerprints.json and errors.jsonl, removed
    (called with the folder's lock held, so no writer is between its write and its rename)."""
    output = Path(output)
    stray = [*output.glob(f".{SUMMARY}.*"), *output.glob(f"*/*/.{FINGERPRINTS}.*"), *output.glob(f"*/*/.{ERRORS}.jsonl.*")]
    for path in stray:
        path.unlink(missing_ok=True)
        warnings.warn(f"{path}: removed, a temporary file a stopped run left", stacklevel=2)
    return stray


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def stale_path(path: Path) -> Path:
    """Where records of other settings go aside: `<file>.stale`, or `<file>.stale.2`, `.3`, ... when earlier
    ones are there (a set aside file is never overwritten)."""
    candidate, n = path.with_name(path.name + ".stale"), 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.stale.{n}")
    return candidate


def append_jsonl(path: Path, records: list[dict]) -> None:
    """Append whole lines and fsync: a kill loses at most the line being written."""
    if not records:
        return
    with writing(path), Path(path).open("a") as f:
        for r in records:
            f.write(json.dumps(json_safe(r), allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def repair_cut_tail(path: Path) -> None:
    """The writer's one repair: drop a last line that a kill cut short (it has no newline)."""
    path = Path(path)
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        line = data.count(b"\n") + 1
        warnings.warn(f"{path}:{line}: a last line cut short by a kill; it is redone", stacklevel=2)
        with path.open("r+b") as f:
            f.truncate(keep)


class FileLock:
    """An exclusive, non-blocking lock on a file; the OS releases it when the process dies (even killed)."""

    def __init__(self, path: Path, what: str):
        self.path, self.what, self._fd = Path(path), what, None

    def __enter__(self) -> "FileLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise ResultsError(f"cannot write to {self.path.parent}: {err.strerror or err}") from err
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(self._fd)
            self._fd = None
            raise ResultsError(f"{self.what} is being written by {holder}; wait for it to finish or use "
                               "another output") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"process {os.getpid()}".encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


class ResultsWriter:
    """The one writer of a results folder, holding its lock for as long as it is open.

    with ResultsWriter(output) as w:
        done = w.resume(path, fingerprint, settings)   # records of this fingerprint already written
        w.append(path, records)
        w.update_summary(rows)
    """

    def __init__(self, output: Path, replace_stale: bool = False):
        self.output = Path(output)
        self.replace_stale = replace_stale
        self._lock = FileLock(self.output / LOCK, f"results folder {self.output}")

    def __enter__(self) -> "ResultsWriter":
        self._lock.__enter__()
        try:
            check_readable(self.output)
            remove_temporaries(self.output)
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._lock.__exit__(*exc)

    def _mkdir(self, folder: Path) -> None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ResultsError(f"cannot write to {folder}: {err.strerror or err}") from err

    def resume(self, path: Path, fingerprint: str, settings: dict) -> list[dict]:
        """Records already in `path` for this fingerprint. Records of another fingerprint stop the run with
        a message naming what differs, or, with `replace_stale`, the old file is moved to `.stale`."""
        path = Path(path)
        self._mkdir(path.parent)
        self._record_fingerprint(path.parent, fingerprint, settings)
        repair_cut_tail(path)
        records = read_records(path)
        stale = [r for r in records if r.get("fingerprint") != fingerprint]
        if stale:
            known = json.loads((path.parent / FINGERPRINTS).read_text())
            old = known.get(stale[0].get("fingerprint"))
            why = ("; ".join(differences(old, settings)) if old is not None
                   else "they carry no fingerprint that this folder knows")
            if not self.replace_stale:
                raise ResultsError(
                    f"{path} holds {len(stale)} record(s) made with other settings ({why}). Use another --output, "
                    "or --replace-stale to move them aside to " + path.name + ".stale and score anew")
            aside = stale_path(path)
            os.replace(path, aside)
            warnings.warn(f"{path}: {len(stale)} record(s) of other settings moved to {aside.name} ({why})",
                          stacklevel=2)
            return []
        return records

    def _record_fingerprint(self, folder: Path, fingerprint: str, settings: dict) -> None:
        path = folder / FINGERPRINTS
        known = json.loads(path.read_text()) if path.exists() else {}
        if known.get(fingerprint) != json_safe(settings):
            known[fingerprint] = settings
            write_json_atomic(path, known)

    def append(self, path: Path, records: list[dict]) -> None:
        append_jsonl(path, records)

    def forget(self, path: Path) -> None:
        """Remove a file the run is about to write anew (a protocol's errors, whose items it retries)."""
        path.unlink(missing_ok=True)

    def write_errors(self, folder: Path, errors: list[dict]) -> None:
        """A task's error records, rewritten whole (they are recomputed from the source each run)."""
        self._mkdir(folder)
        write_text_atomic(folder / f"{ERRORS}.jsonl", "".join(json.dumps(json_safe(e)) + "\n" for e in errors))

    def update_summary(self, rows: list[dict], run: dict | None = None) -> dict:
        """Merge rows into summary.json by (model, task, protocol): a new row replaces the old one of its
        key, every other row stays. `run` (the run's configuration and versions) is kept under `runs` by its
        digest, which each of its rows names in `run`; runs no row names any more are dropped. Written
        atomically, NaN as null."""
        self._mkdir(self.output)
        summary = read_summary(self.output)
        runs = dict(summary.get("runs", {}))
        if run is not None:
            run_id = digest(run, 12)
            runs[run_id] = run
            for row in rows:  # the caller's rows name their run too
                row["run"] = run_id
        merged = {tuple(r[k] for k in SUMMARY_KEY): r for r in summary["rows"]}
        for row in rows:
            merged[tuple(row[k] for k in SUMMARY_KEY)] = row
        named = {r.get("run") for r in merged.values()}
        summary = {**summary, "rows": json_safe(list(merged.values())),
                   "runs": json_safe({k: v for k, v in runs.items() if k in named})}
        write_json_atomic(self.output / SUMMARY, summary)
        return summary
