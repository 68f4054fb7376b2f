"""Errors a user can act on. Each message names the file, item or key at fault."""


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


class InputError(DcsjaxError, ValueError):
    """A text or item cannot be scored as given (empty, too long, ...)."""
