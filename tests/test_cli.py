"""``specheads``: one command line whose subcommands run the modules as ``python -m`` does."""

from __future__ import annotations

import pytest

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
