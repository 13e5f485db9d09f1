"""The one error type for bad user input (a config, a file, a model, a prompt table).

Every entry point prints its message as one line and exits with status 2; the stages raise subclasses that name
themselves (``LabelingError``, ``HeadFileError``, ``EvalError``), and core modules raise ``UserError`` itself.
"""

from __future__ import annotations


class UserError(RuntimeError):
    """A problem with the user's input, reported as one clear line."""
