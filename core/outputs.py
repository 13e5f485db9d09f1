"""An output file a command writes whole: refused in one line, before any work, where writing it would hurt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from core.errors import SettingError, UserError


def check_output_file(out: Path, flag: str, what: str, ours: Callable[[Path], object]) -> None:
    """``out`` may be a new file where a folder can hold it, or a ``what`` a command of ours wrote (``ours(out)``
    reads it without a ``UserError``), which is replaced; a folder, a path under a file and any other file (a label
    folder's manifest, a user's notes) are refused in one line naming ``flag``."""
    if out.is_dir():
        raise SettingError(f"{flag} {out} is a folder: give the {what} to write")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise SettingError(f"{flag} {out}: {parent} is a file, not a folder")
            break
    if out.exists():
        try:
            ours(out)
        except UserError:
            raise SettingError(f"{flag} {out} exists and is not a {what}: give a new path (or a {what}, which is "
                            "replaced)") from None
