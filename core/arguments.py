"""One flag style for every command: ``--snake_case`` words, as LightningCLI and the label and eval configs spell
them (``--trainer.max_epochs``, ``--prompts.limit``), and one spelling for the paths every command takes:
``--labels`` a label folder, ``--out`` what the command writes.

The settings commands (jsonargparse: labels, eval, corpus) read their flags and ``--config`` files through
``parse_settings``, under the same rules. Old spellings keep working and stay out of the help: a flag's
``--kebab-case`` form, and the positionals of the commands that took their paths so. Giving a path both ways, with
different values, or neither, is one line.
"""

from __future__ import annotations

import argparse
import re
import sys

from core.errors import SettingError


def snake_flag(arg: str) -> str:
    """``--kebab-case[=value]`` as ``--snake_case[=value]``; any other word as it is."""
    if not arg.startswith("--") or len(arg) == 2:
        return arg
    flag, eq, value = arg.partition("=")
    return flag.replace("-", "_").replace("__", "--", 1) + eq + value


def description(doc: str) -> str:
    """A command's ``--help`` description from its module's docstring: the first paragraph whole (not its first line,
    cut mid-sentence), less a leading ``make x``/``specheads x …`` label, which the usage line already names."""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    first = re.sub(r"^``[^`]+``: ", "", first)
    return first[:1].upper() + first[1:]


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


def check_counts(counts: dict[str, int | list[int]]) -> None:
    """Each flag's count (or counts) at least 1 (rows, repeats, tokens), or one ``SettingError`` naming the first
    flag that is not: checked before any model loads or file is written."""
    for flag, value in counts.items():
        values = value if isinstance(value, list) else [value]
        if any(v < 1 for v in values):
            raise SettingError(f"{flag} must be at least 1, got {' '.join(map(str, values))}")


def settings_parser(settings: type, prog: str, description: str):
    """A jsonargparse parser of the dataclass ``settings`` (no ``exit_on_error``: ``parse_settings`` makes its errors
    one line): ``--config FILE`` and a flag per field, each field's docstring its help."""
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # the docstring under each field: its --help
    p = ArgumentParser(prog=prog, description=description, exit_on_error=False)
    p.add_argument("--config", action=ActionConfigFile, help="YAML file with the settings below")
    p.add_class_arguments(settings, None, as_group=False)
    return p


def parse_settings(parser, argv: list[str] | None = None, config: str | None = None):
    """``parser.parse_args(argv)`` for a jsonargparse parser made with ``exit_on_error=False``: a ``--config`` file
    that is missing, empty or not a mapping of settings, and every error of the parse, become one ``SettingError``
    line naming the file or the setting (where argparse would print its whole usage first). ``config``, for the
    commands whose settings come from a file (e.g. ``configs/labels/<file>.yaml``): no arguments at all is one line
    asking for it."""
    import sys
    from argparse import ArgumentError
    from pathlib import Path

    args = with_out_flag(parser, [snake_flag(a) for a in (sys.argv[1:] if argv is None else argv)])
    if config is not None and not args:
        raise SettingError(f"no settings given: pass --config {config} (`{parser.prog} --help` lists the settings)")
    configs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    configs += [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    for config in configs:
        check_config_file(Path(config), parser.prog)
    try:
        return parser.parse_args(args)
    except ArgumentError as e:
        raise one_line(e, f"`{parser.prog} --help`") from None


def one_line(error: Exception, help: str) -> SettingError:
    """A jsonargparse parse error (its message spread over lines: the key, then what it expected) as one
    ``SettingError`` line, ending with the command ``help`` that lists the settings."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return SettingError(" ".join(lines) + f" ({help} lists the settings)")


def with_out_flag(parser, args: list[str]) -> list[str]:
    """``args`` with ``--out`` spelled ``--output_dir`` where ``parser``'s settings name their output so: ``--out``
    is the output of every command (``core.arguments``), whatever its settings call it."""
    known = parser._option_string_actions
    if "--out" in known or "--output_dir" not in known:
        return args
    both = {"--out", "--output_dir"} & {a.split("=", 1)[0] for a in args}
    if len(both) == 2:
        raise SettingError("--out and --output_dir are one setting, the output folder: give one of them")
    return ["--output_dir" + a[len("--out"):] if a == "--out" or a.startswith("--out=") else a for a in args]


def check_config_file(path, prog: str) -> None:
    """A settings file that exists and holds a YAML mapping, or one ``SettingError`` saying which it is not."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SettingError(f"config {path}: no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SettingError(f"config {path}: not a YAML file ({' '.join(str(e).split())})") from None
    if data is None:
        raise SettingError(f"config {path} is empty: it should set the settings (`{prog} --help` lists them)")
    if not isinstance(data, dict):
        raise SettingError(f"config {path} holds a {type(data).__name__}, not a mapping of settings to values")
