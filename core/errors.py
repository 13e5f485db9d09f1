"""The one error type for bad user input (a config, a file, a model, a prompt table).

Every entry point prints its message as one line and exits with status 2; the stages raise subclasses that name
themselves (``LabelingError``, ``HeadFileError``, ``EvalError``, ``ShardError``), a setting out of its range raises
``SettingError``, and core modules raise ``UserError`` itself.
"""

from __future__ import annotations


class UserError(RuntimeError):
    """A problem with the user's input, reported as one clear line."""


class SettingError(UserError, ValueError):
    """A setting outside the values it may take (a non-positive weight, an unknown name), as the user gave it."""
