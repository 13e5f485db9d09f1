"""``specheads``: one command line whose subcommands run the modules as ``python -m`` does."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from specheads import cli
from specheads.cli import COMMANDS, main


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_runs_its_module(name, capsys):
    assert main([name, "--help"]) == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_the_commands_are_listed_in_pipeline_order_and_an_unknown_one_is_one_line(capsys):
    assert main([]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)
    assert listed.index("corpus") < listed.index("labels") < listed.index("train") < listed.index("eval")
    assert main(["trian"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no command 'trian'") and len(err.splitlines()) == 1


def test_a_subcommands_bad_input_keeps_its_one_line_and_exit_status(capsys, tmp_path):
    assert main(["calibrate", "--labels", str(tmp_path / "none"), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_paths_take_the_one_spelling_and_the_old_positionals(tmp_path, capsys):
    """--labels a label folder and --out an output in audit, snapshot and export-hf, as elsewhere; the positionals
    they took still work; both at once with different values, or neither, is one line."""
    missing = str(tmp_path / "none")
    for argv in (["audit", "--labels", missing], ["audit", missing], ["snapshot", "--labels", missing, "--out",
                 str(tmp_path / "snap")], ["snapshot", missing, str(tmp_path / "snap")],
                 ["export-hf", "--head", missing, "--out", str(tmp_path / "hf")], ["export-hf", missing, str(tmp_path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "none" in err[0], (argv, err)  # the path was read: the error names it
    assert main(["audit", missing, "--labels", str(tmp_path / "other")]) == 2
    assert "given twice" in capsys.readouterr().err
    assert main(["snapshot", "--labels", missing]) == 2
    assert "--out is required" in capsys.readouterr().err


def test_every_flag_is_spelled_snake_case_and_the_kebab_spelling_still_parses(capsys):
    """One flag style, the one the configs use (``--section.key``, ``--snake_case``): every command's help lists
    no ``--kebab-case`` flag, and a flag's old kebab spelling parses to the same setting."""
    import re

    for name in COMMANDS:
        if name == "lightning":
            continue  # LightningCLI's own subcommands (fit, test, …) are argparse's: their help is LightningCLI's
        main([name, "--help"])
        flags = re.findall(r"(?<![\w-])--[a-z0-9][\w.-]*", capsys.readouterr().out)
        assert flags, name
        assert not [f for f in flags if "-" in f[2:]], (name, [f for f in flags if "-" in f[2:]])
    from pipeline.train_all import parse_args

    assert parse_args(["--test-labels", "x", "--heads-dir", "h"]).test_labels == "x"
    assert parse_args(["--test_labels", "x", "--heads_dir", "h"]).heads_dir == "h"
    assert parse_args(["--heads", "h", "--test-lab=x"]).heads_dir == "h"  # an abbreviation, in either spelling


def test_a_kebab_flag_is_refused_where_a_command_defines_it():
    from core.arguments import CommandParser

    with pytest.raises(TypeError, match="snake_case"):
        CommandParser().add_argument("--test-labels")


def test_out_is_the_output_of_the_commands_whose_settings_say_output_dir(tmp_path):
    from evaluation.config import parse

    cfg, _ = parse(["--config", "configs/eval/llamacpp.yaml", "--out", str(tmp_path / "e")])
    assert cfg.output_dir == str(tmp_path / "e")
    from data_gen.__main__ import parser

    from core.arguments import parse_settings

    assert parse_settings(parser(), ["--config", "configs/labels/corpus.yaml", f"--out={tmp_path}/l"]).output_dir == \
        f"{tmp_path}/l"


def test_out_and_output_dir_together_are_one_line():
    from core.errors import SettingError
    from evaluation.config import parse

    with pytest.raises(SettingError, match="--out and --output_dir are one setting"):
        parse(["--config", "configs/eval/llamacpp.yaml", "--out", "a", "--output_dir=b"])


def test_the_settings_commands_read_kebab_flags_too():
    from evaluation.config import parse

    cfg, report_only = parse(["--config", "configs/eval/llamacpp.yaml", "--max-new-tokens", "7", "--report-only",
                              "true", "--hf-peer.enabled", "false"])
    assert cfg.max_new_tokens == 7 and report_only and cfg.hf_peer.enabled is False


def test_the_checkout_commands_run_from_the_checkout_and_are_one_line_from_a_wheel(monkeypatch, capsys):
    """``scripts/`` and ``testing/`` are not installed (``pyproject.toml``): ``specheads smoke`` finds them in the
    checkout beside the package, wherever it is started, and says in one line where it cannot (an installed wheel)."""
    root = Path(cli.__file__).resolve().parent.parent
    pyproject = (root / "pyproject.toml").read_text()
    include = re.search(r"\[tool\.setuptools\.packages\.find\]\ninclude = \[(.*)\]", pyproject)
    assert include and not {"testing", "scripts"} & set(re.findall(r'"(\w+)\*?"', include[1]))
    assert cli.checkout() == root
    elsewhere = [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != root]
    monkeypatch.setattr(sys, "path", elsewhere)
    for name in [m for m in sys.modules if m.split(".")[0] == "scripts"]:
        monkeypatch.delitem(sys.modules, name)
    assert cli.main(["smoke", "--help"]) == 0 and "usage" in capsys.readouterr().out
    monkeypatch.setattr(cli, "checkout", lambda: None)
    assert cli.main(["gpu-check", "--help"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: specheads gpu-check runs from a checkout")


def undocumented(help_text: str) -> list[str]:
    """The options (and positionals) of an argparse or jsonargparse ``--help`` with no description: nothing beside
    the flag but jsonargparse's ``(type: …, default: …)``."""
    entries, section, entry = [], None, None
    for line in help_text.splitlines():
        if line and not line.startswith(" "):  # a section: options, positional arguments, a group's title
            section, entry = line, None
        elif (start := re.match(r"^  (\S.*)$", line)) and section and not section.startswith("usage:"):
            entry = None  # an entry starts two spaces in; its description follows two spaces on, or lines below
            # LightningCLI's "subcommands:" is prose and the subcommands' names, each with its own --help
            if start[1].startswith("-") and section != "subcommands:" or section == "positional arguments:":
                entry = (re.split(r"\s{2,}", start[1], maxsplit=1) + [""])[:2]
                entries.append(entry)
        elif line.strip() and entry is not None:
            entry[1] += " " + line.strip()
    bare = r"\((required, )?type: .*\)$"
    return [flag for flag, text in entries if not re.sub(bare, "", " ".join(text.split())).strip()]


HELP_PAGES = [[name] for name in COMMANDS] + [["lightning", "fit"]]
"""Every command's ``--help``; LightningCLI's ``fit`` holds the training config's settings (its other subcommands take
the same ones)."""


@pytest.mark.parametrize("argv", HELP_PAGES, ids=" ".join)
def test_every_flag_of_every_command_says_what_it_does(argv, capsys):
    """A newcomer reads ``specheads <command> --help``: every flag has a description (the settings commands' from
    the docstring under each field), the usage names ``specheads <command>`` (the way the user ran it, not the module
    behind it), and the description is a whole sentence, not a first line cut mid-way."""
    assert main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: specheads {argv[0]} "), out.splitlines()[0]
    assert "python -m" not in out
    assert not undocumented(out), undocumented(out)
    if len(argv) == 1:
        text = out.split("\n\n")[1]
        assert text.rstrip().endswith("."), text


def test_the_help_check_finds_a_flag_with_no_description():
    page = """usage: x [-h] [--a A] [--b B]

Does x.

options:
  -h, --help  show this help message and exit
  --a A       (type: int, default: 1)
  --b B       what b is
  --some_long_flag_name SOME_LONG_FLAG_NAME
                        (required, type: list[Sweep])
  --c C
  --d D       what d is, (type: str,
              default: x)
"""
    assert undocumented(page) == ["--a A", "--some_long_flag_name SOME_LONG_FLAG_NAME", "--c C"]


@pytest.mark.parametrize("name, config", [("labels", "configs/labels/<file>.yaml"),
                                          ("bench-labels", "configs/labels/<file>.yaml"),
                                          ("eval", "configs/eval/<file>.yaml")])
def test_a_settings_command_with_no_arguments_asks_for_its_config(name, config, capsys):
    """Its settings come from a file: with none given, one line saying which flag to pass (not the first setting
    of a config that was never read)."""
    assert main([name]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: no settings given: pass --config {config} (`specheads {name} --help` lists the settings)"]


def test_generate_takes_a_registered_policy_its_settings_and_the_sampling(monkeypatch, capsys):
    """``--policy`` is one of the registry's (refused before a model loads), ``--param KEY=VALUE`` reaches the
    policy as a keyword argument read as YAML reads a scalar, and top-k/top-p reach the sampling."""
    from decoding.runtimes import llama_cpp

    made = {}

    class Fake:
        def __init__(self, target, draft, **kwargs):
            made["kwargs"] = kwargs

        def generate(self, prompt, *args, **kwargs):
            made["args"] = args
            from decoding.state import DecodeStats

            return "text", DecodeStats(wall_s=1.0, new_tokens=1, target_calls=1, draft_calls=1, discarded=0)

    monkeypatch.setattr(llama_cpp, "SpeculativeLlama", Fake)
    common = ["--target", "t.gguf", "--draft", "d.gguf", "--prompt", "x"]
    llama_cpp.main([*common, "--policy", "specdecpp", "--param", "h=0.3", "--param", "head=h.safetensors",
                    "--top_k", "5", "--top_p", "0.9"])
    assert made["kwargs"] == {"threads": 2, "policy": "specdecpp", "tokenizer": None, "h": 0.3, "head": "h.safetensors"}
    assert made["args"] == (128, 1.0, 5, 0.9)
    with pytest.raises(SystemExit) as e:
        llama_cpp.main([*common, "--policy", "nope"])
    assert e.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        llama_cpp.main([*common, "--param", "h"])
    assert "'h' is not KEY=VALUE" in capsys.readouterr().err


def test_the_command_line_hides_the_libraries_noise_and_not_ours(monkeypatch):
    """``specheads`` hides what ``make``'s ``PYTHONWARNINGS`` hides (deprecations, Lightning's warnings about its
    own settings), Lightning's info lines ("GPU available", "💡 Tip") and transformers' deprecation messages; a
    warning of this project's own modules still prints."""
    import logging
    import warnings

    from transformers.utils import logging as transformers_logging

    transformers_logging.get_logger()
    handlers = logging.getLogger("transformers").handlers
    assert handlers
    for handler in handlers:
        monkeypatch.setattr(handler, "filters", list(handler.filters))
    for name in [*cli.LIBRARY_LOGGERS, "pytorch_lightning", "lightning_fabric"]:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    monkeypatch.setattr(sys, "warnoptions", [])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.quiet()
        cli.quiet()  # once is enough; twice changes nothing
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", DeprecationWarning)
        warnings.warn("will be removed in version 5.40.0", FutureWarning)
        warnings.warn_explicit("Checkpoint directory exists and is not empty.", UserWarning, "model_checkpoint.py",
                               881, module="pytorch_lightning.callbacks.model_checkpoint")
        warnings.warn_explicit("this folder's costs were timed on another device", UserWarning, "hf.py", 361,
                               module="decoding.runtimes.hf")
    assert [str(w.message) for w in seen] == ["this folder's costs were timed on another device"]
    for name in ("pytorch_lightning", "lightning_fabric"):  # what Lightning does as it loads, maybe after quiet()
        logging.getLogger(name).setLevel(logging.INFO)
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.seed"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
        assert logging.getLogger(name).isEnabledFor(logging.WARNING)

    def passes(message: str) -> bool:
        record = logging.LogRecord("transformers.generation.utils", logging.WARNING, "", 0, message, None, None)
        return all(handler.filter(record) for handler in handlers)

    assert not passes("Passing `generation_config` together with generation-related arguments=({'use_cache'}) is "
                      "deprecated and will be removed in future versions.")
    assert not passes("`past_key_values`/`cache_params` are deprecated. Use `cache` instead.")
    assert passes("Setting `pad_token_id` to `eos_token_id`:0 for open-end generation.")
    assert sum(isinstance(f, cli.NoDeprecations) for h in handlers for f in h.filters) == len(handlers)
