"""``make bench-labels`` on the tiny pair: which prompts it times, and its report."""

import dataclasses

import pytest
import yaml

from data_gen import bench
from data_gen.labeler import Prompt


def test_the_bench_times_train_prompts_of_about_the_median_length():
    records = [{"split": split, "prompt": Prompt(i, [1] * length, "target")}
               for i, (split, length) in enumerate([("train", 9), ("val", 5), ("train", 3), ("train", 7), ("train", 5),
                                                    ("train", 1), ("test", 6), ("train", 5)])]
    chosen = bench.bench_records(records, 3)
    assert [len(r["prompt"].input_ids) for r in chosen] == [3, 5, 5]  # of 1 3 5 5 7 9
    assert {r["split"] for r in chosen} == {"train"}
    assert len(bench.bench_records(records, 50)) == 6  # every train prompt when asked for more


def test_the_bench_reports_labeling_against_batch_1_generate(label_config, tmp_path, capsys):
    cfg = dataclasses.asdict(label_config(categories=["target"]))
    (tmp_path / "labels.yaml").write_text(yaml.safe_dump(cfg))
    assert bench.main(["--config", str(tmp_path / "labels.yaml"), "--bench_prompts", "4", "--backends",
                       "[transformers]"]) == 0
    out = capsys.readouterr().out
    assert "timing 4 prompts in 2 batches of <= 3" in out
    for line in ("target.generate, batch 1", "labeled target positions, batch 3", "labeling time: target generation"):
        assert line in out


@pytest.mark.parametrize("args, message", [(["--bench_prompts", "0"], "must be 1 or more"),
                                           (["--backends", "[onnx]"], "--backends takes distinct ones of"),
                                           (["--split_fractions", "[0, 1, 0]"], "train split holds no prompt")])
def test_a_bench_with_nothing_to_time_is_one_line(label_config, tmp_path, capsys, args, message):
    cfg = dataclasses.asdict(label_config(categories=["target"]))
    (tmp_path / "labels.yaml").write_text(yaml.safe_dump(cfg))
    assert bench.main(["--config", str(tmp_path / "labels.yaml"), "--backends", "[transformers]", *args]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err
