"""``python -m evaluation.pairs``: a run's tokens/s over another's, paired over the prompts both decoded."""

from __future__ import annotations

import json

import pytest

from evaluation import pairs


def write_results(folder, runs: dict[str, list[tuple[int, float]]], mode: str = "sample") -> None:
    """run label → [(new tokens, seconds) per prompt]; a partial last line as an interrupted eval leaves."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"mode": mode, "run": run, "family": run.split("[")[0], "params": {}, "prompt": i,
                         "stats": {"new_tokens": n, "wall_s": s}})
             for run, per_prompt in runs.items() for i, (n, s) in enumerate(per_prompt)]
    (folder / "results.jsonl").write_text("\n".join(lines) + '\n{"mode": "sam')


def test_the_ratio_is_tokens_per_second_over_the_shared_prompts(tmp_path, capsys):
    write_results(tmp_path / "eval", {"specdecpp[h=0.8]": [(40, 4.0), (40, 5.0), (40, 8.0)],
                                      "confidence[threshold=0.6]": [(40, 5.0), (40, 5.0)]})
    [(a, b, interval, n)] = pairs.main([str(tmp_path / "eval"), "specdecpp/confidence"])
    assert (a, b, n) == ("specdecpp[h=0.8]", "confidence[threshold=0.6]", 2)
    assert interval.value == pytest.approx((80 / 9.0) / (80 / 10.0))  # prompt 2 is not in both
    assert interval.low <= interval.value <= interval.high
    assert "specdecpp[h=0.8] / confidence[threshold=0.6]: 1.111" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["spec/confidence"], "no run named 'spec': the runs are confidence"),
    (["specdecpp"], "pairs are A/B"),
    (["specdecpp/confidence", "--mode", "greedy"], "no mode 'greedy'"),
])
def test_bad_names_are_one_line_errors(tmp_path, capsys, args, message):
    write_results(tmp_path / "eval", {"specdecpp[h=0.8]": [(40, 4.0), (40, 5.0)],
                                      "confidence[threshold=0.6]": [(40, 5.0), (40, 5.0)]})
    with pytest.raises(SystemExit) as e:
        pairs.main([str(tmp_path / "eval"), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_folder_without_finished_runs_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        pairs.main([str(tmp_path / "none"), "a/b"])
    assert "no results.jsonl" in capsys.readouterr().err
    write_results(tmp_path / "partial", {})  # only the partial line an interrupted eval leaves
    with pytest.raises(SystemExit):
        pairs.main([str(tmp_path / "partial"), "a/b"])
    assert "holds no finished run yet" in capsys.readouterr().err


@pytest.mark.parametrize("wall", [float("nan"), 0.0, -1.0])
def test_a_damaged_time_is_one_line_not_a_nan_ratio(tmp_path, capsys, wall):
    write_results(tmp_path / "eval", {"specdecpp[h=0.8]": [(40, 4.0), (40, wall)],
                                      "confidence[threshold=0.6]": [(40, 5.0), (40, 5.0)]})
    with pytest.raises(SystemExit):
        pairs.main([str(tmp_path / "eval"), "specdecpp/confidence"])
    err = capsys.readouterr().err
    assert "records wall_s" in err and err.count("\n") == 1
