"""Errors the workspace raises for bad input. The CLI turns each into one line and exit code 2."""

from __future__ import annotations

import os


class EmbodiedError(Exception):
    """Base class: a user-facing problem with a one-line explanation (no traceback needed)."""


class ConfigError(EmbodiedError):
    """A config key is unknown, misspelt, of the wrong type or out of range."""


class DataError(EmbodiedError):
    """A data file is missing, corrupt, truncated or has the wrong layout.

    The message always starts with the offending file, so that an error raised inside a
    DataLoader worker still says which file was bad.
    """

    def __init__(self, path: str | os.PathLike, reason: str | None = None):
        self.path = str(path)
        self.reason = reason
        super().__init__(self.path if reason is None else f"{self.path}: {reason}")

    def __reduce__(self):
        # Picklable with both fields, so an error raised in a DataLoader worker keeps its type.
        return (type(self), (self.path, self.reason))


class CheckpointError(EmbodiedError):
    """A checkpoint is missing, incomplete, or does not match the model it is loaded into."""


class SimulationError(EmbodiedError):
    """A simulator failed or diverged (NaN state, unstable contact) in a way an episode cannot absorb."""
