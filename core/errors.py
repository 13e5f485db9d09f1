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


def run_main(main) -> None:
    """Run a command's ``main()`` as its ``__main__`` block: bad input (a ``UserError``) ends in one line on
    stderr and exit status 2, a bug in its traceback; otherwise exit 0 (whatever ``main`` returns is for callers)."""
    import sys

    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)
