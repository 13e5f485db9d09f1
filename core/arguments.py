"""One flag style for every command: ``--snake_case`` words, as LightningCLI and the label and eval configs spell
them (``--trainer.max_epochs``, ``--prompts.limit``), and one spelling for the paths every command takes:
``--labels`` a label folder, ``--out`` what the command writes.

Old spellings keep working and stay out of the help: a flag's ``--kebab-case`` form, and the positionals of the
commands that took their paths so. Giving a path both ways, with different values, or neither, is one line.
"""

from __future__ import annotations

import argparse
import sys

from core.errors import SettingError


def snake_flag(arg: str) -> str:
    """``--kebab-case[=value]`` as ``--snake_case[=value]``; any other word as it is."""
    if not arg.startswith("--") or len(arg) == 2:
        return arg
    flag, eq, value = arg.partition("=")
    return flag.replace("-", "_").replace("__", "--", 1) + eq + value


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
    """argparse's parser with the project's flag style: ``--snake_case`` flags, each also accepted as
    ``--kebab-case`` (read as its snake spelling, so an abbreviation stays as unambiguous as it was); a mistake on
    the command line is one line (``error: …``, exit 2) where argparse prints its whole usage first."""

    def _add_action(self, action: argparse.Action) -> argparse.Action:
        if any(n.startswith("--") and "-" in n[2:] for n in action.option_strings):
            raise TypeError(f"flags are spelled --snake_case here: {action.option_strings}")
        return super()._add_action(action)

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args([snake_flag(a) for a in args], namespace)

    def error(self, message: str):
        self.exit(2, f"error: {message} (`{self.prog} --help` lists the flags)\n")
