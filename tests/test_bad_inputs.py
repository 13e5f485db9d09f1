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


@pytest.mark.parametrize("field", ["sample", "generate_call"])
def test_what_generate_adds_may_be_nothing_measurable_but_not_negative(tmp_path, field):
    """``bench-timing --generate`` clamps at 0 what generate() adds to a step (its sampler) and to a call (an int8
    draft's can be 0); a negative, NaN or infinite one is refused naming the field."""
    timing = timing_file()
    timing["models"][0][field] = {"tokens": 9, "cache": 64, "median_s": 0.0}
    assert read_timing(write(tmp_path / "zero.json", timing))
    for bad in (-0.001, NAN, float("inf"), "0.001"):
        timing["models"][0][field]["median_s"] = bad
        with pytest.raises(TimingFileError, match=f"draft's {field} is"):
            read_timing(write(tmp_path / "bad.json", timing))


def test_a_prefill_of_no_tokens_is_refused_in_one_line(tmp_path):
    timing = timing_file()
    timing["models"][1]["prefill"]["tokens"] = 0
    with pytest.raises(TimingFileError, match="target's prefill is of 0 tokens"):
        read_timing(write(tmp_path / "timing.json", timing))


def test_a_timing_file_of_an_older_layout_is_refused_saying_how_to_time_it_again(tmp_path):
    """A file timed before the draft's catch-up read was is not read as if that read were free."""
    older = timing_file()
    del older["models"][0]["catch_up"]
    with pytest.raises(TimingFileError, match="older layout.*specheads bench-timing"):
        read_timing(write(tmp_path / "older.json", older))


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
    from data_gen.errors import LabelingError

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


@pytest.mark.parametrize("flags", [["--prefill", "100000"], ["--cache", "40", "32765"], ["--verify", "40000"]])
def test_bench_timing_beyond_a_models_context_is_one_line_before_any_timing(tmp_path, flags):
    from evaluation.bench_timing import main

    out = tmp_path / "timing.json"
    with pytest.raises(SettingError, match="its context holds 32768 tokens"):
        main(["--model", "tiny", "--precision", "float32", "--out", str(out), *flags])
    assert not out.exists()


def test_bench_timing_out_a_folder_another_file_or_a_path_under_a_file_is_one_line(tmp_path):
    from evaluation.bench_timing import parse_args
    from evaluation.timers import timing_file

    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"a label folder": "manifest"}')
    timing = tmp_path / "timing.json"
    timing.write_text('{"models": []}')  # shaped like a timing file, and no run of the command wrote it
    for out, words in [(tmp_path, "is a folder"), (manifest, "no `specheads bench-timing` wrote it"),
                       (timing, "no `specheads bench-timing` wrote it"),
                       (manifest / "timing.json", "is a file, not a folder")]:
        with pytest.raises(SettingError, match=words):
            parse_args(["--out", str(out)])
    assert manifest.read_text() == '{"a label folder": "manifest"}'
    timing_file(timing).claim()  # as the command records the file it writes
    assert parse_args(["--out", str(timing)]).out == str(timing)  # its own earlier file is replaced


def test_calibrate_refuses_a_folder_or_another_tools_file_before_it_fits(tmp_path, capsys):
    from decoding.calibrate import main

    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"a label folder": "manifest"}')
    for out, words in [(tmp_path, "is a folder"), (manifest, "no `specheads calibrate` wrote it"),
                       (manifest / "calibration.json", "is a file, not a folder")]:
        with pytest.raises(SystemExit) as stop:
            main(["--labels", str(tmp_path / "no-labels"), "--out", str(out)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1
    assert manifest.read_text() == '{"a label folder": "manifest"}'


def test_train_all_refuses_a_heads_folder_that_is_a_file_or_in_use_before_it_trains(tmp_path, capsys):
    from core.folder_lock import FolderInUse, folder_lock
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
    from core.folder_lock import FolderInUse, folder_lock
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


def test_the_smoke_run_writes_only_into_its_own_folder_and_deletes_nothing(tmp_path):
    from core.runfolder import LEDGER
    from scripts.smoke import prepare

    root = tmp_path / "smoke"
    (root / "labels").mkdir(parents=True)
    (root / "notes.txt").write_text("mine")
    with pytest.raises(SettingError, match="no `specheads smoke` wrote it"):
        prepare(root)  # no smoke run's, with a file of the user's: nothing touched
    assert sorted(p.name for p in root.iterdir()) == ["labels", "notes.txt"]
    (root / "notes.txt").unlink()
    (root / "labels" / "important.arrow").write_text("mine")
    with pytest.raises(SettingError, match="no `specheads smoke` wrote it"):
        prepare(root)
    (root / "labels" / "important.arrow").unlink()
    (root / "labels").rmdir()
    prepare(root)  # empty: the smoke run's
    (root / "labels").mkdir()
    assert "smoke\t.\n" in (root / LEDGER).read_text()
    (root / "labels" / "notes.txt").write_text("mine")
    prepare(root)  # its own: its stages write again beside the user's file, which stays
    assert (root / "labels" / "notes.txt").read_text() == "mine"


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

    from evaluation.run import run_eval

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "loglik.jsonl").write_text("my own notes\n")
    (folder / "selection.json").write_text("{}")
    with pytest.raises(SettingError, match="loglik.jsonl, selection.json, which no `specheads eval` wrote"):
        run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=True, **QUICK), fake_engine(), quiet=True)
    assert (folder / "loglik.jsonl").read_text() == "my own notes\n" and (folder / "selection.json").is_file()
    assert sorted(p.name for p in folder.iterdir()) == ["loglik.jsonl", "selection.json"]


def test_labeling_overwrite_refuses_a_shard_no_run_recorded_instead_of_deleting_it(label_config, tmp_path):
    from data_gen.run import run_labels

    run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    stray = out / "train" / "someone-elses.arrow"
    stray.write_bytes(b"not ours")
    for overwrite in (False, True):
        with pytest.raises(SettingError, match="holds train/someone-elses.arrow, which no `specheads labels` wrote"):
            run_labels(label_config(seed=5 if overwrite else 0, overwrite=overwrite), quiet=True)
    assert stray.read_bytes() == b"not ours" and (out / "manifest.json").exists()
    stray.unlink()
    run_labels(label_config(seed=5, overwrite=True), quiet=True)  # its own earlier run is started over


def test_gpu_schedule_refuses_an_output_it_would_clobber_and_a_verifier_before_any_work(tmp_path):
    from evaluation.schedule import main

    head = tmp_path / "trained.safetensors"
    head.write_bytes(b"a trained head")
    labels = str(tmp_path / "never-read")
    with pytest.raises(SettingError, match="exists and no `specheads gpu-schedule` wrote it"):
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
    from evaluation.resume import check_report_folder
    from evaluation.run import run_eval
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
    ledger = RunDir(out).folder.ledger.path
    ledger.write_text(ledger.read_text().replace("eval\treport.md\n", ""))
    with pytest.raises(SettingError, match="holds report.md, which no `specheads eval` wrote"):
        check_report_folder(cfg)
    assert (bare / "report.md").read_text() == "mine" and (out / "report.md").read_text() == "mine"


def test_labeling_overwrite_refuses_a_run_record_no_labeling_run_wrote(label_config, tmp_path):
    """A ``run.json`` of someone else's: not the labeling run's to start over, with or without --overwrite."""
    from data_gen.run import run_labels

    out = tmp_path / "labels"
    out.mkdir()
    (out / "run.json").write_text('{"mine": 1}')
    for overwrite in (False, True):
        with pytest.raises(SettingError, match="(run.json, which no|no) `specheads labels` wrote"):
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


def _command(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``specheads ARGV`` in this process: its exit status and the lines it wrote to stderr."""
    from specheads.cli import main

    try:
        code = main(argv)
    except SystemExit as e:  # the commands run by ``core.interrupt.run_main`` exit with their status
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def test_gpu_schedule_refuses_a_head_or_calibration_of_another_draft(label_config, tiny_pair, tmp_path):
    """As simulate and eval do (``heads.export.check_labels``, ``CalibratedConfidence.check_draft``): its settings
    would be chosen on labels the head's estimates say nothing about."""
    from core.models import ModelSpec, load_model
    from core.shards import read_manifest
    from data_gen.run import run_labels
    from evaluation.schedule import main
    from heads.export import HeadFileError, export_head
    from heads.resnet import ResNetHead

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    other = load_model(ModelSpec(path=str(tiny_pair[1]), name="tiny-target"))[2]  # the target, as a draft
    head = export_head(ResNetHead(hidden_size=32, depth=1), tmp_path / "other.safetensors", draft=other,
                       vocab_size=int(other["vocab_size"]), label={"kind": "test"}, role="stop",
                       threshold={"name": "h", "value": 0.5, "rule": "test"}, metrics={})
    calibration = write(tmp_path / "calibration.json", {"estimate": "calibrated_confidence", "rows": 10,
                                                         "q": [0.1, 0.9], "acceptance": [0.2, 0.8],
                                                         "fitted": {"draft": other}})
    out = tmp_path / "schedule.json"
    labels = str(cfg.output_dir)
    with pytest.raises(HeadFileError, match=f"not for 'tiny-draft' .*, the draft of the labels in {labels}"):
        main(["--labels", labels, "--head", str(head), "--traces", "2", "--out", str(out)])
    with pytest.raises(UserError, match=f"fitted on rows of draft 'tiny-target', the draft of the labels in {labels}"):
        main(["--labels", labels, "--calibration", calibration, "--traces", "2", "--out", str(out)])
    assert not out.exists()
    assert read_manifest(labels)["models"]["draft"]["name"] == "tiny-draft"


@pytest.mark.parametrize("setting", ["grid: {T: [0.1, .nan]}", "grid: {T: [Infinity]}", "fixed: {T: .inf}"])
def test_a_policy_setting_that_is_not_a_finite_number_is_one_line(tmp_path, capsys, setting):
    """NaN passes every bound a policy checks (``T < 0`` is false), so it ran and was reported; YAML reads
    ``Infinity`` as text, which the policy compared with a number (a TypeError)."""
    config = tmp_path / "eval.yaml"
    config.write_text(f"output_dir: {tmp_path / 'eval'}\npolicies:\n  - {{family: fuzzy, {setting}}}\n")
    code, err = _command(["eval", "--config", str(config)], capsys)
    assert code == 2 and len(err) == 1 and "fuzzy: T must be a finite number" in err[0], err
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize("command", [["simulate"], ["gpu-schedule", "--out", "unused.json"]])
def test_a_cost_ratio_that_overflows_a_rounds_cost_is_refused_as_gpu_schedule_does(tmp_path, capsys, command):
    """``--c 1e308`` made every round's cost infinite: NaN shares and 0.000 speedups. One bound for every command
    that takes c (``decoding.replay.check_cost_ratios``), checked before the labels are read."""
    for c in ("1e308", "inf", "nan"):
        code, err = _command([*command, "--labels", str(tmp_path / "never-read"), "--c", c], capsys)
        assert code == 2 and len(err) == 1, err
        assert "--c must be a positive cost ratio t_draft / t_target" in err[0] and "0 < c < 10" in err[0], err


def test_an_eval_resumed_over_a_damaged_trace_records_it_again(tmp_path):
    """A trace cut short (a killed copy, a full disk) is missing, not a traceback: the resumed eval records it
    again, as a labeling run redoes a damaged shard."""
    import dataclasses

    import numpy as np
    from test_eval_fakes import fake_engine
    from test_eval_run import make_cfg
    from test_never_lose_data import QUICK

    from decoding.traces import Trace
    from evaluation.run import run_eval
    from evaluation.rundir import RunDir
    from evaluation.traces import read_recorded

    recorded = []

    def record(ids, tokens, generator, prompt):
        recorded.append(prompt)
        n = len(tokens)
        return Trace(prompt_id=prompt, acceptance=np.full(n, 0.5), logp_draft=np.full(n, -1.0),
                     entropy_draft=np.ones(n), hidden=torch.zeros(n, 4), hidden_prev=torch.zeros(n, 4),
                     candidate=np.zeros(n, dtype=np.int64))

    engine = dataclasses.replace(fake_engine(), record_trace=record)
    cfg = make_cfg(tmp_path, **QUICK)
    out = run_eval(cfg, engine, quiet=True)
    first = RunDir(out).recorded_traces("sample")
    assert first and sorted(recorded) == sorted(int(p.stem) for p in first)
    damaged = first[0]
    damaged.write_bytes(damaged.read_bytes()[:-10])
    recorded.clear()
    run_eval(cfg, engine, quiet=True)
    assert recorded == [int(damaged.stem)]  # that one only, again
    assert len(read_recorded(out, "sample")) == len(first)


def test_bench_train_reads_the_cache_it_wrote(tmp_path, capsys):
    """Its random shards are written as a labeling run writes them, digests listed in the manifest, so the data
    module it times reads them; a second run reuses them."""
    from pipeline.bench import main

    flags = ["--rows", "64", "--hidden_size", "8", "--batch_size", "16", "--dir", str(tmp_path)]
    main(flags)
    manifest = json.loads((tmp_path / "labels-64x8" / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == [f"{s}/target-0000.arrow" for s in ("test", "train", "val")]
    main(flags)  # the cache, read again
    assert capsys.readouterr().out.count("pipeline epoch (Trainer + shards)") == 2


@pytest.mark.parametrize("flags, words", [(["--rows", "0"], "--rows must be at least 1, got 0"),
                                          (["--hidden_size", "-4"], "--hidden_size must be at least 1, got -4"),
                                          (["--batch_size", "0"], "--batch_size must be at least 1, got 0")])
def test_bench_train_counts_below_one_are_one_line_before_any_write(tmp_path, capsys, flags, words):
    code, err = _command(["bench-train", *flags, "--dir", str(tmp_path / "bench")], capsys)
    assert code == 2 and err == [f"error: {words}"], err
    assert not (tmp_path / "bench").exists()


def test_bench_precision_counts_below_one_are_one_line_before_the_models_load(tmp_path, capsys):
    """``--repeats 0`` ended in statistics' StatisticsError once the models had loaded and been read."""
    config = tmp_path / "never-read.yaml"  # the models are named there: not read, nothing loads
    for flags, words in [(["--repeats", "0"], "--repeats must be at least 1, got 0"),
                         (["--prompts", "0"], "--prompts must be at least 1, got 0"),
                         (["--positions", "-1"], "--positions must be at least 1, got -1")]:
        code, err = _command(["bench-precision", *flags, "--config", str(config), "--out",
                              str(tmp_path / "precision.json")], capsys)
        assert code == 2 and err == [f"error: {words}"], err
    assert not (tmp_path / "precision.json").exists()


@pytest.mark.parametrize("flags, config, words", [
    (["--model.lr", "nan"], None, 'Parser key "model.lr"'),
    (["--data.batch_size", "many"], None, 'Parser key "data.batch_size"'),
    (["--data.no_such_key", "3"], None, "--data.no_such_key"),
    ([], "data:\n  batch_size: many\n", 'Parser key "data.batch_size"'),
    ([], "data:\n  no_such_key: 3\n", "data.no_such_key"),
    ([], "data:\n  lam: .nan\n", "lam must be positive, got nan"),
])
def test_a_mistyped_or_non_finite_training_setting_is_one_line_naming_it(tmp_path, capsys, flags, config, words):
    """LightningCLI printed its 98-line usage before the error (or, for a NaN λ, trained on all-zero labels); the
    labels are never read: each refusal comes first."""
    from pipeline.train_all import DEFAULT_CONFIGS

    configs = [DEFAULT_CONFIGS[0]]
    if config is not None:
        (tmp_path / "bad.yaml").write_text(config)
        configs.append(str(tmp_path / "bad.yaml"))
    args = ["lightning", "fit", *(a for c in configs for a in ("--config", c)), "--data.labels",
            str(tmp_path / "never-read"), "--trainer.default_root_dir", str(tmp_path / "runs"), *flags]
    code, err = _command(args, capsys)
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("setting, words", [
    (dict(lr=math.inf), "lr and scores_lr must be positive, got inf"),
    (dict(scores_lr=math.inf), "lr and scores_lr must be positive, got 0.001, inf"),
    (dict(w_rej=NAN), "w_acc and w_rej must be positive, got 1.0, nan")])
def test_a_non_finite_training_weight_or_rate_is_refused(setting, words):
    from heads.sprinter import SprinterHead
    from pipeline.module import HeadModule

    with pytest.raises(SettingError, match=words):
        HeadModule(SprinterHead(hidden_size=8), **setting)


def test_train_names_a_mistyped_setting_of_its_configs_in_one_line(label_config, tmp_path, capsys):
    from data_gen.run import run_labels

    labels = label_config()
    run_labels(labels, quiet=True)
    config = tmp_path / "head.yaml"
    config.write_text("model:\n  head:\n    class_path: heads.sprinter.SprinterHead\ndata:\n  batch_size: many\n")
    capsys.readouterr()  # the labeling run's own lines
    code, err = _command(["train", "--labels", str(labels.output_dir), "--configs", str(config), "--out",
                          str(tmp_path / "out"), "--heads_dir", str(tmp_path / "heads"), "--quiet"], capsys)
    assert code == 2 and len(err) == 1 and 'Parser key "data.batch_size"' in err[0], err


def test_the_train_lock_names_the_flag_that_gave_the_folder(label_config, tmp_path):
    from core.folder_lock import FolderInUse, folder_lock
    from data_gen.run import run_labels
    from pipeline.train_all import main

    labels = label_config()
    run_labels(labels, quiet=True)
    held = tmp_path / "held"
    with folder_lock(held, "a training run"):
        with pytest.raises(FolderInUse, match="choose another --heads_dir"):
            main(["--labels", str(labels.output_dir), "--heads_dir", str(held), "--out", str(tmp_path / "out")])


def test_a_ctrl_c_while_labeling_is_said_once_by_the_command_not_first_by_lightning(label_config):
    """Lightning logs "Detected KeyboardInterrupt, attempting graceful shutdown" as it catches the Ctrl-C; the
    command's own line (``LabelingInterrupted``) is the one that says it."""
    import logging

    import pytorch_lightning as pl

    from data_gen.errors import LabelingInterrupted
    from data_gen.run import run_labels

    class CtrlC(pl.Callback):
        def on_predict_batch_end(self, trainer, *args, **kwargs):
            raise KeyboardInterrupt

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    lines = Lines()
    lightning = logging.getLogger("pytorch_lightning")
    level = lightning.level
    lightning.addHandler(lines)
    lightning.setLevel(logging.INFO)
    try:
        with pytest.raises(LabelingInterrupted, match="stopped by Ctrl-C"):
            run_labels(label_config(), callbacks=[CtrlC()], quiet=True)
    finally:
        lightning.removeHandler(lines)
        lightning.setLevel(level)
    assert not [line for line in lines.lines if "KeyboardInterrupt" in line], lines.lines


def test_train_out_and_heads_dir_as_one_folder_is_one_line(tmp_path):
    from pipeline.train_all import main

    with pytest.raises(SettingError, match="--out and --heads_dir are one folder"):
        main(["--labels", str(tmp_path / "never-read"), "--out", str(tmp_path / "x"), "--heads_dir", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
