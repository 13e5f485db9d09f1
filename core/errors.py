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


def parse_settings(parser, argv: list[str] | None = None):
    """``parser.parse_args(argv)`` for a jsonargparse parser made with ``exit_on_error=False``: a ``--config`` file
    that is missing, empty or not a mapping of settings, and every error of the parse, become one ``SettingError``
    line naming the file or the setting (where argparse would print its whole usage first)."""
    import sys
    from argparse import ArgumentError
    from pathlib import Path

    from core.arguments import snake_flag  # that module raises this module's errors

    args = with_out_flag(parser, [snake_flag(a) for a in (sys.argv[1:] if argv is None else argv)])
    configs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    configs += [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    for config in configs:
        check_config_file(Path(config), parser.prog)
    try:
        return parser.parse_args(args)
    except ArgumentError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise SettingError(" ".join(lines) + f" (`{parser.prog} --help` lists the settings)") from None


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
