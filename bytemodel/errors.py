"""User-facing errors.

Anything the user can cause (a bad path, a corrupt file, a wrong flag) raises a subclass of
BytemodelError with a one-line message. The CLI prints that line and exits with status 2; it never
shows a traceback for these. Programming errors stay ordinary exceptions.
"""


class BytemodelError(Exception):
    """A problem with the user's input: printed as one line by the CLI."""


class SourceError(BytemodelError):
    """A training source (file, directory, reader) cannot be used."""


class CheckpointError(BytemodelError):
    """A checkpoint is missing, corrupt or incompatible."""


class TokenizerError(BytemodelError):
    """A tokenizer file is corrupt or does not match."""


class ConfigError(BytemodelError):
    """An invalid setting (flag value, config key, preset name)."""


class CompressError(BytemodelError):
    """A .bmz file is corrupt, foreign, or needs another checkpoint or backend."""
