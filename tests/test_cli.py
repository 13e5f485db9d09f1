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
