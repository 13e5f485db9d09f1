"""Bad input is one line before any work: a timing or calibration file whose numbers cannot price a round or map a
confidence, a NaN in a sampling setting, a GPU the machine lacks, a benchmark count below one, an output path that is
a folder or another tool's file. Each case here was accepted (or ended in a traceback) before it was checked."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from test_eval_latency import timing_file
from test_never_lose_data import python_sigint  # noqa: F401  (a fixture)

from core.errors import SettingError, UserError
from core.sampling import Sampling
from decoding.costs import TimingFileError, read_timing
from decoding.estimates import CalibratedConfidence, EstimateFileError

NAN = float("nan")


def write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("field, value, words", [
    ("t_step", NAN, "target's decode step after 128 is nan"), ("t_step", -0.5, "target's decode step"),
    ("d_step", -0.05, "draft's decode step"), ("d_step", NAN, "draft's decode step"),
    ("t_verify", -1.0, "target's verify is -1.0"), ("t_prefill", NAN, "target's prefill is nan")])
def test_a_timing_file_that_cannot_price_a_round_is_refused_naming_the_field(tmp_path, field, value, words):
    path = write(tmp_path / "timing.json", timing_file(**{field: value}))
    with pytest.raises(TimingFileError, match=words):
        read_timing(path)
    assert read_timing(write(tmp_path / "good.json", timing_file()))  # the same file with sound numbers reads


@pytest.mark.parametrize("q, acceptance, words", [
    ([0.1, NAN], [0.2, 0.5], "q must hold probabilities"), ([0.1, 5.0], [0.2, 0.5], "q must hold probabilities"),
    ([0.1, 0.5], [0.2, 1.5], "acceptance must hold"), ([0.9, 0.1], [0.2, 0.5], "non-decreasing"),
    ([0.1, 0.5, 0.9], [0.2, 0.5], "equal length"), ([], [], "equal length")])
def test_a_calibration_file_that_maps_nothing_sound_is_refused(tmp_path, q, acceptance, words):
    path = write(tmp_path / "calibration.json", {"estimate": "calibrated_confidence", "rows": 10, "q": q,
                                                 "acceptance": acceptance})
    with pytest.raises(EstimateFileError, match=f"{path}.*{words}"):
        CalibratedConfidence.load(path)


def test_an_export_with_a_bad_timing_or_calibration_writes_nothing(tmp_path):
    from decoding.runtimes.hf_export import write_folder
    from heads.export import export_head
    from heads.resnet import ResNetHead

    head = export_head(ResNetHead(hidden_size=8, depth=1), tmp_path / "stop.safetensors",
                       draft={"name": "tiny-draft", "source": "test"}, vocab_size=16, label={"kind": "test"},
                       role="stop", threshold={"name": "h", "value": 0.5, "rule": "test"}, metrics={})
    bad_timing = write(tmp_path / "timing.json", timing_file(t_step=-0.5))
    with pytest.raises(UserError, match="target's decode step"):
        write_folder(head, tmp_path / "out", timing=bad_timing)
    bad_calibration = write(tmp_path / "calibration.json", {"estimate": "calibrated_confidence", "rows": 1,
                                                             "q": [0.1, NAN], "acceptance": [0.2, 0.5]})
    with pytest.raises(UserError, match="q must hold probabilities"):
        write_folder(head, tmp_path / "out", timing=write(tmp_path / "good.json", timing_file()),
                     calibration=bad_calibration)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("setting", [dict(temperature=NAN), dict(temperature=math.inf), dict(top_p=NAN)])
def test_a_nan_sampling_setting_is_refused(setting):
    with pytest.raises(SettingError, match="bad sampling settings"):
        Sampling(**setting)


def test_a_labeling_or_eval_config_with_a_nan_temperature_is_refused_when_parsed(tmp_path, tiny_pair, capsys):
    from data_gen.__main__ import main
    from evaluation.config import Mode

    with pytest.raises(SettingError, match="bad sampling settings"):
        Mode(name="sample", temperature=NAN)
    draft, target = tiny_pair
    path = tmp_path / "labels.yaml"
    path.write_text(f"draft: {{path: {draft}}}\ntarget: {{path: {target}}}\nprompts: {{source: humaneval}}\n"
                    f"output_dir: {tmp_path / 'labels'}\nsampling:\n  temperature: .nan\n")
    assert main(["--config", str(path)]) == 2
    assert "bad sampling settings" in capsys.readouterr().err
    assert not (tmp_path / "labels").exists()


def test_an_eval_on_a_gpu_the_machine_lacks_is_one_line(monkeypatch, tmp_path):
    from test_eval_run import make_cfg

    from evaluation.config import EvalError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EvalError, match="torch sees no CUDA GPU"):
        make_cfg(tmp_path, device="cuda")


@pytest.mark.parametrize("overrides, words", [({"accelerator": "gpu"}, "torch sees no CUDA GPU"),
                                              ({"accelerator": "tpu"}, "accelerator must be"),
                                              ({"devices": 0}, "devices must be auto or a count of at least 1"),
                                              ({"num_nodes": 0}, "num_nodes must be at least 1")])
def test_labeling_lightning_settings_are_checked_before_anything_is_written(label_config, monkeypatch, tmp_path,
                                                                           overrides, words):
    from data_gen.run import LabelingError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LabelingError, match=words):
        label_config(**overrides)
    assert not (tmp_path / "labels").exists()


@pytest.mark.parametrize("flags, words", [(["--repeats", "0"], "--repeats must be at least 1"),
                                          (["--prefill", "-5"], "--prefill must be at least 1"),
                                          (["--cache", "256", "0"], "--cache must be at least 1"),
                                          (["--verify_lengths", "1"], "each >= 2")])
def test_bench_timing_counts_below_one_are_one_line(flags, words):
    from evaluation.bench_timing import parse_args

    with pytest.raises(SettingError, match=words):
        parse_args(flags)


def test_bench_timing_out_a_folder_another_file_or_a_path_under_a_file_is_one_line(tmp_path):
    from evaluation.bench_timing import parse_args

    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"a label folder": "manifest"}')
    for out, words in [(tmp_path, "is a folder"), (manifest, "is not a timing file"),
                       (manifest / "timing.json", "is a file, not a folder")]:
        with pytest.raises(SettingError, match=words):
            parse_args(["--out", str(out)])
    assert manifest.read_text() == '{"a label folder": "manifest"}'
    timing = tmp_path / "timing.json"
    timing.write_text('{"models": []}')
    assert parse_args(["--out", str(timing)]).out == str(timing)  # its own earlier file is replaced


def test_calibrate_refuses_a_folder_or_another_tools_file_before_it_fits(tmp_path, capsys):
    from decoding.calibrate import main

    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"a label folder": "manifest"}')
    for out, words in [(tmp_path, "is a folder"), (manifest, "is not a calibration file"),
                       (manifest / "calibration.json", "is a file, not a folder")]:
        with pytest.raises(SystemExit) as stop:
            main(["--labels", str(tmp_path / "no-labels"), "--out", str(out)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1
    assert manifest.read_text() == '{"a label folder": "manifest"}'


def test_train_all_refuses_a_heads_folder_that_is_a_file_or_in_use_before_it_trains(tmp_path, capsys):
    from core.runfolder import FolderInUse, folder_lock
    from pipeline.train_all import main

    labels = str(tmp_path / "no-labels")  # never read: both refusals come first
    afile = tmp_path / "heads"
    afile.write_text("not a folder")
    with pytest.raises(SettingError, match="--heads_dir .* is a file"):
        main(["--labels", labels, "--heads_dir", str(afile), "--out", str(tmp_path / "out")])
    held = tmp_path / "held"
    with folder_lock(held, "a training run"):
        with pytest.raises(FolderInUse, match="in use by a training run"):
            main(["--labels", labels, "--heads_dir", str(held), "--out", str(tmp_path / "out")])


def test_an_export_into_a_folder_another_export_holds_stops_in_one_line(tmp_path):
    from core.runfolder import FolderInUse, folder_lock
    from decoding.runtimes.hf_export import write_folder
    from heads.export import export_head
    from heads.resnet import ResNetHead

    head = export_head(ResNetHead(hidden_size=8, depth=1), tmp_path / "stop.safetensors",
                       draft={"name": "tiny-draft", "source": "test"}, vocab_size=16, label={"kind": "test"},
                       role="stop", threshold={"name": "h", "value": 0.5, "rule": "test"}, metrics={})
    out = tmp_path / "out"
    with folder_lock(out, "an export"):
        with pytest.raises(FolderInUse, match="in use by an export"):
            write_folder(head, out)
    assert write_folder(head, out) == out and (out / "custom_generate" / "generate.py").is_file()
    assert write_folder(head, out) == out  # its own earlier export is replaced


def test_the_smoke_run_deletes_only_its_own_outputs(tmp_path):
    from scripts.smoke import MARKER, clear

    root = tmp_path / "smoke"
    (root / "labels").mkdir(parents=True)
    (root / "notes.txt").write_text("mine")
    with pytest.raises(SettingError, match="holds files no smoke run wrote"):
        clear(root)  # unmarked, with a file of the user's: nothing deleted
    assert (root / "labels").is_dir() and (root / "notes.txt").read_text() == "mine"
    (root / "notes.txt").unlink()
    (root / "labels" / "important.arrow").write_text("mine")
    with pytest.raises(SettingError, match="holds files no smoke run wrote"):
        clear(root)  # unmarked, under a name a smoke run writes: no run of ours marked it, nothing deleted
    assert (root / "labels" / "important.arrow").read_text() == "mine"
    shutil.rmtree(root / "labels")
    clear(root)  # empty: marked
    assert (root / MARKER).is_file()
    (root / "labels").mkdir()
    (root / "notes.txt").write_text("mine")
    clear(root)  # marked: its own outputs go, the user's file stays
    assert not (root / "labels").exists() and (root / "notes.txt").read_text() == "mine"


def test_report_only_on_a_folder_without_an_eval_is_one_line(tmp_path, capsys):
    from test_eval_run import make_cfg

    from evaluation.__main__ import main

    cfg = make_cfg(tmp_path)
    config = tmp_path / "eval.yaml"
    config.write_text(f"output_dir: {tmp_path / 'empty'}\nmodes: [{{name: sample}}]\n"
                      "policies: [{family: target_only}]\n")
    assert main(["--config", str(config), "--draft.path", cfg.draft.path, "--target.path", cfg.target.path,
                 "--prompts.source", cfg.prompts.source, "--report_only", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds none" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "empty" / "report.md").exists()


@pytest.mark.parametrize("command", ["data_gen", "evaluation", "data_gen.corpus"])
@pytest.mark.parametrize("content, words", [("", "is empty"), ("- a\n- list\n", "not a mapping"),
                                            (None, "no such file"), ("max_new_tokens: [1, 2\n", "not a YAML file")])
def test_a_config_file_that_holds_no_settings_is_one_line(tmp_path, capsys, command, content, words):
    import importlib

    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_text(content)
    main = importlib.import_module(command if command == "data_gen.corpus" else f"{command}.__main__").main
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


def test_a_setting_of_the_wrong_type_is_one_line_without_the_usage(capsys):
    from data_gen.corpus import main

    assert main(["--min_body_lines", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "min_body_lines" in err and len(err.splitlines()) == 1 and "usage" not in err


def test_a_label_folder_made_with_relative_model_paths_audits_from_another_directory(tiny_pair, prompt_file,
                                                                                     tmp_path, monkeypatch):
    import os
    import shutil

    from data_gen import audit
    from data_gen.run import run_labels
    from testing.tiny import label_config

    work = tmp_path / "work"
    work.mkdir()
    for role, path in zip(("draft", "target"), tiny_pair):
        shutil.copytree(path, work / role)
    monkeypatch.chdir(work)
    run_labels(label_config("draft", "target", prompt_file, work / "labels", max_new_tokens=4, batch_size=4),
               quiet=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # undone by monkeypatch
    assert audit.main([str(work / "labels"), "--rows", "4"]) == 0
    assert audit.main([str(work / "labels"), "--rows", "4", "--seed", "-1"]) == 2  # before any model loads


def _exit_of(main, capsys, **kwargs) -> tuple[int, list[str]]:
    from core.interrupt import run_main

    with pytest.raises(SystemExit) as stop:
        run_main(main, **kwargs)
    return stop.value.code, capsys.readouterr().err.strip().splitlines()


def test_every_command_ends_a_ctrl_c_or_bad_input_in_one_line(capsys, python_sigint):
    """``run_main``, the one wrapper of the commands: Ctrl-C is 130 (also when a library caught it and exited its
    own way, as Lightning does with exit 1 after a Ctrl-C), bad input 2 (a library's kind too, when named), one
    line each; a bug keeps its traceback."""
    import signal

    def ctrl_c():
        raise KeyboardInterrupt

    def caught_then_exit():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raise SystemExit(1) from None

    class LibraryMisconfiguration(Exception):
        pass

    def misconfigured():
        raise LibraryMisconfiguration("no val\n  split")

    assert _exit_of(ctrl_c, capsys) == (130, ["interrupted: stopped by Ctrl-C"])
    assert _exit_of(caught_then_exit, capsys) == (130, ["interrupted: stopped by Ctrl-C"])
    assert _exit_of(misconfigured, capsys, also=(LibraryMisconfiguration,)) == (2, ["error: no val split"])
    with pytest.raises(LibraryMisconfiguration):
        _exit_of(misconfigured, capsys)
    assert _exit_of(lambda: None, capsys) == (0, [])


def test_eval_overwrite_refuses_files_named_as_an_evals_that_no_eval_wrote(tmp_path):
    from test_eval_fakes import fake_engine
    from test_eval_run import make_cfg
    from test_never_lose_data import QUICK

    from evaluation.config import EvalError
    from evaluation.run import run_eval

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "loglik.jsonl").write_text("my own notes\n")
    (folder / "selection.json").write_text("{}")
    with pytest.raises(EvalError, match="no evaluation's settings.json"):
        run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=True, **QUICK), fake_engine(), quiet=True)
    assert (folder / "loglik.jsonl").read_text() == "my own notes\n" and (folder / "selection.json").is_file()
    assert sorted(p.name for p in folder.iterdir()) == ["loglik.jsonl", "selection.json"]


def test_labeling_overwrite_refuses_a_shard_no_run_recorded_instead_of_deleting_it(label_config, tmp_path):
    from data_gen.run import LabelingError, run_labels

    run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    stray = out / "train" / "someone-elses.arrow"
    stray.write_bytes(b"not ours")
    with pytest.raises(LabelingError, match="someone-elses.arrow is not listed"):
        run_labels(label_config(), quiet=True)
    with pytest.raises(LabelingError, match="someone-elses.arrow is not a shard any labeling run recorded"):
        run_labels(label_config(seed=5, overwrite=True), quiet=True)
    assert stray.read_bytes() == b"not ours" and (out / "manifest.json").exists()
    stray.unlink()
    run_labels(label_config(seed=5, overwrite=True), quiet=True)  # its own earlier run is started over


def test_gpu_schedule_refuses_an_output_it_would_clobber_and_a_verifier_before_any_work(tmp_path):
    from evaluation.schedule import main

    head = tmp_path / "trained.safetensors"
    head.write_bytes(b"a trained head")
    labels = str(tmp_path / "never-read")
    with pytest.raises(SettingError, match="exists and is not a schedule"):
        main(["--labels", labels, "--out", str(head)])
    with pytest.raises(SettingError, match="is a folder"):
        main(["--labels", labels, "--out", str(tmp_path)])
    with pytest.raises(SettingError, match="--seed >= 0"):
        main(["--labels", labels, "--seed", "-1"])
    assert head.read_bytes() == b"a trained head" and not list(tmp_path.glob(".*tmp*"))


def test_report_only_refuses_results_of_other_settings_or_without_them(tmp_path):
    """The report states the config's settings: results made with others (or with none recorded), and files under
    the report's names that no eval wrote, are refused in one line, and nothing is written."""
    import dataclasses

    from test_eval_run import fake_engine, make_cfg

    from evaluation.config import EvalError
    from evaluation.run import check_report_folder, run_eval
    from evaluation.rundir import RunDir

    cfg = make_cfg(tmp_path)
    out = run_eval(cfg, fake_engine(), quiet=True)
    assert check_report_folder(cfg) == out
    with pytest.raises(EvalError, match="other settings than the config's \\(modes"):
        check_report_folder(dataclasses.replace(cfg, max_new_tokens=50))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "results.jsonl").write_bytes(RunDir(out).results.read_bytes())
    (bare / "report.md").write_text("mine")
    with pytest.raises(EvalError, match="holds none \\(no settings.json\\)"):
        check_report_folder(dataclasses.replace(cfg, output_dir=str(bare)))
    (out / "report.md").unlink()
    (out / "report.md").write_text("mine")  # a user's file where the ledger lists the eval's
    RunDir(out).ledger.path.write_text("\n".join(n for n in RunDir(out).ledger.claimed() if n != "report.md") + "\n")
    with pytest.raises(EvalError, match="report.md under an evaluation's names"):
        check_report_folder(cfg)
    assert (bare / "report.md").read_text() == "mine" and (out / "report.md").read_text() == "mine"


def test_labeling_overwrite_refuses_a_run_record_no_labeling_run_wrote(label_config, tmp_path):
    """A ``run.json`` of someone else's: not the labeling run's to start over, with or without --overwrite."""
    from data_gen.run import LabelingError, run_labels

    out = tmp_path / "labels"
    out.mkdir()
    (out / "run.json").write_text('{"mine": 1}')
    for overwrite in (False, True):
        with pytest.raises(LabelingError, match="is not a labeling run's record"):
            run_labels(label_config(output_dir=str(out), overwrite=overwrite), quiet=True)
    assert (out / "run.json").read_text() == '{"mine": 1}'


@pytest.mark.parametrize("argv, words", [
    (["eval", "--config", "configs/eval/llamacpp.yaml", "--goals.sprinter_vs_sd", "-4"],
     "goals.sprinter_vs_sd must be a ratio above 0"),
    (["eval", "--config", "configs/eval/llamacpp.yaml", "--goals.sprinter_pass_drop", "-0.5"],
     "goals.sprinter_pass_drop must be a share of 0 or more"),
    (["corpus", "--min_prompts", "-3", "--out", "unused"], "min_prompts must be at least 0, got -3"),
    (["bench-timing", "--verify", "2", "--verify_short", "5"], "--verify_short must be 0 (skip) or from 2 to --verify - 1 (1), got 5"),
])
def test_nonsense_numbers_are_one_line_before_any_work(argv, words, capsys):
    from specheads.cli import main

    try:
        code = main(argv)
    except SystemExit as e:  # the commands run by ``core.interrupt.run_main`` exit with their status
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
