"""One spelling for the paths every command takes: ``--labels`` a label folder, ``--out`` what the command writes.

Commands that took these as positionals keep them (old command lines still run); the flag is the spelling the docs
use. Giving both, with different values, or neither, is one line.
"""

from __future__ import annotations

import argparse

from core.errors import SettingError


def path_argument(parser: argparse.ArgumentParser, dest: str, flag: str, help: str) -> None:
    """``dest`` as a positional (optional) and as ``flag``; ``resolve_paths`` then picks the one given."""
    parser.add_argument(dest, nargs="?", default=None, help=f"{help} (or {flag})")
    parser.add_argument(flag, dest=f"{dest}_flag", default=None, metavar=dest.upper(), help=help)


def resolve_paths(args: argparse.Namespace, *pairs: tuple[str, str]) -> argparse.Namespace:
    """Each ``(dest, flag)`` of ``path_argument``: the value given, as ``args.dest``."""
    for dest, flag in pairs:
        given, named = getattr(args, dest), getattr(args, f"{dest}_flag")
        if given is not None and named is not None and given != named:
            raise SettingError(f"{dest} given twice ({given} and {flag} {named}): give one")
        if given is None and named is None:
            raise SettingError(f"{flag} is required ({dest})")
        setattr(args, dest, named if named is not None else given)
        delattr(args, f"{dest}_flag")
    return args


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, with a mistake on the command line in one line (``error: …``, exit 2) where argparse
    prints its whole usage first."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (`{self.prog} --help` lists the flags)\n")
