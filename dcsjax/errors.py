"""Errors a user can act on. Each message names the file, item or key at fault."""

import contextlib
import errno


class DcsjaxError(Exception):
    """Base class for every error dcsjax raises on purpose."""


class UnknownModelError(DcsjaxError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class FetchError(DcsjaxError):
    """A download, unpacking or checksum step failed."""


class CheckpointError(DcsjaxError):
    """A checkpoint file is missing, truncated, or does not match the config."""


class ConfigError(DcsjaxError):
    """A model config holds an attribute the code does not implement."""


class DiskError(DcsjaxError, OSError):
    """A write the file system refused (full, over quota, read-only, a file too large, no permission)."""


DISK_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up",
               errno.EFBIG: "the file is too large for its file system", errno.EROFS: "a read-only file system",
               errno.EACCES: "no permission to write there", errno.EPERM: "no permission to write there"}


@contextlib.contextmanager
def writing(path, what: str = "what was written before is kept; run the same command again once there is room"):
    """Turn the file system's refusals while writing `path` into one line naming it, its reason and `what`
    the user can do (instead of a traceback from deep in a write)."""
    try:
        yield
    except OSError as err:
        if isinstance(err, DcsjaxError) or err.errno not in DISK_ERRORS:
            raise
        raise DiskError(f"{path}: {DISK_ERRORS[err.errno]} ({errno.errorcode[err.errno]}); {what}") from err


class InputError(DcsjaxError, ValueError):
    """A text or item cannot be scored as given (empty, too long, ...)."""


class Terminated(BaseException):
    """SIGTERM, raised where the process is (as Ctrl-C raises KeyboardInterrupt), so it stops as Ctrl-C does."""


_stop_requested: list[int] = []


def request_stop(signum: int, frame=None) -> None:
    """The SIGTERM handler: a flag that `stop_point` raises from, and `Terminated` at once where an exception
    can surface. Inside a garbage-collection callback, a `__del__` or importlib's module-lock callback, Python
    would print the exception as "ignored" and go on, so there it only leaves the flag for the next stop point."""
    _stop_requested.append(signum)
    if not _in_ignored_callback(frame):
        raise Terminated()


def _in_ignored_callback(frame) -> bool:
    import gc

    hooks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        # importlib's module-lock weakref callback (`cb` in _bootstrap) is one too: a SIGTERM landing in it while
        # a module is imported was printed as "Exception ignored in ... Traceback" and the run went on
        if code in hooks or code.co_name == "__del__" or (code.co_name == "cb" and "importlib" in code.co_filename):
            return True
        frame = frame.f_back
    return False


def clear_stop_request() -> None:
    """Forget a SIGTERM already handled (a second `main()` in the same process starts afresh)."""
    _stop_requested.clear()


def stop_point() -> None:
    """Raise `Terminated` if a SIGTERM arrived; called between writes, where stopping loses nothing."""
    if _stop_requested:
        raise Terminated()
