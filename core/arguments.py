"""One flag style for every command: ``--snake_case`` words, as LightningCLI and the label and eval configs spell
them (``--trainer.max_epochs``, ``--prompts.limit``), and one spelling for the paths every command takes:
``--labels`` a label folder, ``--out`` what the command writes.

Old spellings keep working and stay out of the help: a flag's ``--kebab-case`` form, and the positionals of the
commands that took their paths so. Giving a path both ways, with different values, or neither, is one line.
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


class OneSpellingHelp(argparse.HelpFormatter):
    """Help that lists each flag under its first spelling only (the ``--snake_case`` one)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        first = action.option_strings[0]
        return first if action.nargs == 0 else f"{first} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


class CommandParser(argparse.ArgumentParser):
    """argparse's parser with the project's flag style: ``--snake_case`` flags, each also accepted as
    ``--kebab-case``; a mistake on the command line is one line (``error: …``, exit 2) where argparse prints its
    whole usage first."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", OneSpellingHelp)
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: str, **kwargs):
        if any(n.startswith("--") and "-" in n[2:] for n in names):
            raise TypeError(f"flags are spelled --snake_case here: {names}")
        kebab = [n.replace("_", "-") for n in names if n.startswith("--") and "_" in n]
        return super().add_argument(*names, *kebab, **kwargs)

    def error(self, message: str):
        self.exit(2, f"error: {message} (`{self.prog} --help` lists the flags)\n")
