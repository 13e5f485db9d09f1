"""Labeling and evaluation never delete what they did not write, never mix two runs in one folder, and answer bad
input (and Ctrl-C) with one line: checks before the disk is touched, own files only, the folder lock, full input
identity on an eval resume, unlisted shards, and inputs that must end in one line, not a traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest
import yaml
from test_eval_fakes import fake_engine, write_prompt_file
from test_eval_run import make_cfg

from core import shards
from core.errors import UserError
from core.interrupt import CtrlCGuard
from core.folder_lock import LOCK_FILE, FolderInUse, folder_lock
from core.runfolder import LEDGER
from core.prompts import PromptConfig
from data_gen.errors import LabelingError
from data_gen.run import run_labels
from decoding.policies import build_policy
from evaluation.config import EvalError, HFPeer, Mode, Sweep
from evaluation.results import ResultStore
from evaluation.run import run_eval
from evaluation.rundir import RunDir

QUICK = dict(policies=[Sweep("target_only"), Sweep("sd", grid={"k": [2, 3]})], hf_peer=HFPeer(enabled=False),
             modes=[Mode("sample", 1.0)])


def _tree(folder) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _foreign_folder(folder):
    """A folder holding what no evaluation wrote: a label dataset's files, a note, and a nested results file."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text('{"schema_version": 4}\n')
    (folder / "train").mkdir()
    (folder / "train" / "draft-0000.arrow").write_bytes(b"rows")
    (folder / "notes.txt").write_text("mine")
    (folder / "other").mkdir()
    (folder / "other" / "results.jsonl").write_text("{}\n")
    return folder


# ------------------------------------------------------------------ eval: check first, delete only its own
@pytest.mark.parametrize("bad", ["prompts", "head", "setting"])
def test_eval_overwrite_with_a_bad_input_touches_nothing(tmp_path, bad):
    folder = _foreign_folder(tmp_path / "labels")
    before = _tree(folder)
    kw = {"prompts": PromptConfig(source=str(tmp_path / "nope.jsonl"))} if bad == "prompts" else {}
    if bad == "head":
        kw["policies"] = [Sweep("sprinter", fixed={"head": str(tmp_path / "nope.safetensors")})]
    if bad == "setting":
        kw["policies"] = [Sweep("sd", grid={"k": [2, -3]})]
    engine = fake_engine()
    engine.build_policy = build_policy  # the real policies, which refuse k = -3
    with pytest.raises(UserError):
        run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=True, **kw), engine, quiet=True)
    assert _tree(folder) == before


def test_eval_into_the_current_directory_with_a_bad_input_touches_nothing(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("the project's own")
    monkeypatch.chdir(work)
    cfg = make_cfg(tmp_path, output_dir=".", overwrite=True, prompts=PromptConfig(source="nope.jsonl"))
    with pytest.raises(UserError, match="prompt file not found"):
        run_eval(cfg, fake_engine(), quiet=True)
    assert _tree(work) == {"README.md": b"the project's own"}


def test_eval_refuses_a_folder_it_did_not_create_and_overwrites_only_its_own_files(tmp_path):
    folder = _foreign_folder(tmp_path / "shared")
    before = _tree(folder)
    with pytest.raises(UserError, match="no `specheads eval` wrote it: choose another folder, or pass --overwrite"):
        run_eval(make_cfg(tmp_path, output_dir=str(folder), **QUICK), fake_engine(), quiet=True)
    assert _tree(folder) == before
    run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=True, **QUICK), fake_engine(), quiet=True)
    after = _tree(folder)
    assert {k: after[k] for k in before} == before and "results.jsonl" in after
    (folder / "traces" / "sample").mkdir(parents=True)
    (folder / "traces" / "sample" / "00000.safetensors").write_bytes(b"a trace")
    (folder / "traces" / "notes.txt").write_text("not a trace")
    calls = []
    for overwrite in (False, True):  # under an eval's name, but no eval wrote it: refused, kept
        with pytest.raises(UserError, match="holds traces/sample/00000.safetensors, which no `specheads eval` wrote"):
            run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=overwrite, max_new_tokens=5, **QUICK),
                     fake_engine(calls), quiet=True)
    assert (folder / "traces" / "sample" / "00000.safetensors").read_bytes() == b"a trace"
    (folder / "traces" / "sample" / "00000.safetensors").unlink()
    run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=True, max_new_tokens=5, **QUICK),
             fake_engine(calls), quiet=True)
    again = _tree(folder)
    assert {k: again[k] for k in before} == before and again["traces/notes.txt"] == b"not a trace"
    fresh = run_eval(make_cfg(tmp_path, output_dir=str(tmp_path / "fresh"), max_new_tokens=5, **QUICK),
                     fake_engine(), quiet=True)
    assert len(ResultStore(folder / "results.jsonl")) == len(ResultStore(fresh / "results.jsonl")) == len(calls)
    # what overwrite deletes is every file an evaluation writes
    assert {p.relative_to(fresh).as_posix() for p in RunDir(fresh).folder.files()} == set(_tree(fresh)) - {LEDGER}
    assert set(again) - set(before) - {"traces/notes.txt"} == set(_tree(fresh))
    # files an evaluation writes, put there by someone else beside its results: refused, kept
    (folder / "loglik.jsonl").write_text("mine")
    (folder / "selection.json").write_text("mine too")
    with pytest.raises(UserError, match="loglik.jsonl, selection.json, which no `specheads eval` wrote"):
        run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=True, **QUICK), fake_engine(), quiet=True)
    assert (folder / "loglik.jsonl").read_text() == "mine" and (folder / "selection.json").read_text() == "mine too"


def test_eval_overwrite_keeps_the_previous_results_until_the_models_and_heads_pass(tmp_path, monkeypatch):
    import evaluation.engine
    import evaluation.run
    from heads.export import HeadFileError

    cfg = make_cfg(tmp_path, **QUICK)
    out = run_eval(cfg, fake_engine(), quiet=True)
    before = _tree(out)
    cfg.overwrite = True
    engine = fake_engine()

    def refuse(path):
        raise HeadFileError(f"{path}: head was trained for another draft")

    engine.check_head = refuse
    cfg.policies = [*cfg.policies, Sweep("sprinter", fixed={"head": str(tmp_path / "h.safetensors")})]
    monkeypatch.setattr(evaluation.run, "head_files", lambda cfg: [str(tmp_path / "h.safetensors")])
    with pytest.raises(HeadFileError):
        run_eval(cfg, engine, quiet=True)
    assert _tree(out) == before
    cfg.policies = QUICK["policies"]

    def labels_of_another_pair(cfg):
        raise EvalError("runs/labels was labeled with draft 'other', this run decodes 'tiny'")

    monkeypatch.setattr(evaluation.engine.Engine, "load", staticmethod(labels_of_another_pair))
    monkeypatch.setattr(evaluation.run, "input_digests", lambda *a: {})
    with pytest.raises(EvalError, match="labeled with draft"):
        run_eval(cfg, None, quiet=True)
    assert _tree(out) == before


def test_eval_results_without_settings_are_refused(tmp_path):
    cfg = make_cfg(tmp_path, **QUICK)
    out = run_eval(cfg, fake_engine(), quiet=True)
    (out / "settings.json").unlink()
    before = _tree(out)
    with pytest.raises(EvalError, match="results.jsonl has no settings.json beside it"):
        run_eval(cfg, fake_engine(), quiet=True)
    assert _tree(out) == before
    cfg.overwrite = True
    run_eval(cfg, fake_engine(), quiet=True)


# ------------------------------------------------------------------ labeling: its own shards only
def test_labeling_overwrite_keeps_a_dataset_in_a_subfolder(label_config, tmp_path):
    run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    shutil.copytree(out, tmp_path / "copy")
    shutil.copytree(tmp_path / "copy", out / "other")
    kept = _tree(out / "other")
    run_labels(label_config(seed=5, overwrite=True), quiet=True)
    assert _tree(out / "other") == kept
    shards.read_manifest(out / "other")
    shards.read_manifest(out)


def test_labeling_refuses_a_folder_it_did_not_create(label_config, tmp_path, monkeypatch):
    import data_gen.run

    out = tmp_path / "labels"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / ".notes.tmp").write_text("mine too")  # hidden, "tmp" in its name, and not a temporary of ours
    monkeypatch.setattr(data_gen.run, "load_pair", lambda cfg: pytest.fail("models loaded"))
    with pytest.raises(UserError, match="no `specheads labels` wrote it: choose another folder, or pass --overwrite"):
        run_labels(label_config(), quiet=True)
    (out / "train").mkdir()
    (out / "train" / "draft-0000.arrow").write_bytes(b"someone's rows")
    for overwrite in (False, True):  # shards no run.json claims are never deleted
        with pytest.raises(UserError, match="(not empty|holds train/draft-0000.arrow).*no `specheads labels` wrote"):
            run_labels(label_config(overwrite=overwrite), quiet=True)
    assert _tree(out) == {".notes.tmp": b"mine too", "notes.txt": b"mine", "train/draft-0000.arrow": b"someone's rows"}
    monkeypatch.undo()
    (out / "train" / "draft-0000.arrow").unlink()
    run_labels(label_config(overwrite=True), quiet=True)  # told: labeled beside the note
    assert (out / "notes.txt").read_text() == "mine" and (out / ".notes.tmp").read_text() == "mine too"
    shards.read_manifest(out)


# ------------------------------------------------------------------ the lock
HOLD = """
import sys, time
from core.folder_lock import folder_lock
with folder_lock(sys.argv[1], "a test holder"):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def held(tmp_path):
    """A folder another live process holds; yields (folder, that process)."""
    folder = tmp_path / "held"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd())
    assert proc.stdout.readline().strip() == "held"
    yield folder, proc
    proc.kill()
    proc.wait()


def test_a_second_labeling_run_or_eval_on_a_held_folder_is_one_line(held, label_config, tmp_path, monkeypatch):
    import data_gen.run

    folder, proc = held
    monkeypatch.setattr(data_gen.run, "load_pair", lambda cfg: pytest.fail("models loaded"))
    with pytest.raises(FolderInUse, match=rf"in use by a test holder \(process {proc.pid} "):
        run_labels(label_config(output_dir=str(folder)), quiet=True)
    with pytest.raises(FolderInUse, match=rf"process {proc.pid} "):
        run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=True, **QUICK), fake_engine(), quiet=True)
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]
    proc.kill()
    proc.wait()  # killed: its lock file stays, stale, and is taken over
    assert (folder / LOCK_FILE).exists()
    run_eval(make_cfg(tmp_path, output_dir=str(folder), **QUICK), fake_engine(), quiet=True)
    assert not (folder / LOCK_FILE).exists()  # released when done


def test_the_lock_is_exclusive_in_one_process_and_released_on_error(tmp_path):
    with folder_lock(tmp_path, "the first"):
        with pytest.raises(FolderInUse, match="in use by the first"):
            with folder_lock(tmp_path, "the second"):
                pass
    with pytest.raises(RuntimeError):
        with folder_lock(tmp_path, "a failing run"):
            raise RuntimeError
    with folder_lock(tmp_path, "the next"):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_two_labeling_commands_at_once_one_refused(label_config, tiny_pair, prompt_file, tmp_path):
    """Started together on one folder: one labels, the other says the folder is in use, and the dataset is the
    one process's own."""
    args = [sys.executable, "-m", "data_gen", "--draft.path", str(tiny_pair[0]), "--target.path", str(tiny_pair[1]),
            "--prompts.source", str(prompt_file), "--prompts.response_field", "answer", "--sampling.max_new_tokens",
            "6", "--batch_size", "3", "--accelerator", "cpu", "--devices", "1", "--dtype", "float32", "--output_dir",
            str(tmp_path / "two")]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([*args, "--seed", str(seed)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              text=True, env=env) for seed in (0, 1)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 2], results
    refused = next(err for rc, err in results if rc == 2)
    assert [line for line in refused.splitlines() if line.startswith("error:")] == [refused.strip().splitlines()[-1]]
    # in use while the other labels; a slow start finds it labeled with the other seed
    assert "is in use by a labeling run" in refused or "other settings" in refused, refused
    assert "Traceback" not in refused
    seed = [0, 1][[rc for rc, _ in results].index(0)]
    manifest = shards.read_manifest(tmp_path / "two")
    assert manifest["seed"] == seed
    alone = run_labels(label_config(seed=seed, output_dir=str(tmp_path / "alone")), quiet=True)
    assert manifest["splits"] == alone["splits"]


# ------------------------------------------------------------------ eval resume: the inputs' content
def test_eval_resume_refuses_edited_prompts_or_another_draft(tmp_path):
    prompts = write_prompt_file(tmp_path / "mine.jsonl", n=4)
    cfg = make_cfg(tmp_path, prompts=PromptConfig(source=str(prompts), response_field="answer"), **QUICK)
    run_eval(cfg, fake_engine(), quiet=True)
    run_eval(cfg, fake_engine(), quiet=True)  # the same inputs resume
    lines = prompts.read_text().splitlines()
    prompts.write_text("\n".join([lines[0].replace("def", "class", 1), *lines[1:]]) + "\n")
    with pytest.raises(EvalError, match=r"other settings \(inputs.prompts_sha256 \(content changed\)\)"):
        run_eval(cfg, fake_engine(), quiet=True)
    write_prompt_file(prompts, n=4)
    engine = fake_engine()
    engine.models = {**engine.models, "draft": {"fingerprint": "other weights"}}
    with pytest.raises(EvalError, match=r"other settings \(inputs.draft \(content changed\)\)"):
        run_eval(cfg, engine, quiet=True)
    run_eval(cfg, fake_engine(), quiet=True)


def _eval_config(tmp_path, draft, target, **kw) -> str:
    """A YAML config of a tiny real evaluation (two prompts, two new tokens)."""
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "draft": {"path": str(draft)}, "target": {"path": str(target)},
        "prompts": {"source": str(write_prompt_file(tmp_path / "prompts.jsonl", n=2)), "response_field": "answer"},
        "policies": [{"family": "target_only"}, {"family": "sd", "grid": {"k": [2]}}], "hf_peer": {"enabled": False},
        "max_new_tokens": 2, "train_dir": None, "labels_dir": None, "output_dir": str(tmp_path / "eval"),
        "dtype": "float32", "device": "cpu", "warmup": False, "loglik": False, **kw}))
    return str(config)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines and lines[-1].startswith(("error:", "interrupted:")), err
    assert len([line for line in lines if line.startswith(("error:", "interrupted:"))]) == 1, err
    return lines[-1]


def test_eval_resume_refuses_a_draft_swapped_at_the_same_path(tiny_pair, tmp_path, capsys):
    from evaluation.__main__ import main

    draft = tmp_path / "draft"
    shutil.copytree(tiny_pair[0], draft)
    config = _eval_config(tmp_path, draft, tiny_pair[1])
    assert main(["--config", config]) == 0
    out = tmp_path / "eval"
    written = set(_tree(out))
    assert {"forward_timing.json", "report.md"} <= written and any(f.startswith("traces/") for f in written)
    assert {p.relative_to(out).as_posix() for p in RunDir(out).folder.files()} == written - {LEDGER}  # overwrite
    # deletes all of it
    shutil.copy(tiny_pair[1] / "model.safetensors", draft / "model.safetensors")  # the target's weights
    capsys.readouterr()
    assert main(["--config", config]) == 2
    assert "other settings (inputs.draft (content changed))" in _one_line(capsys)


# ------------------------------------------------------------------ unlisted shards
def test_an_unlisted_shard_is_refused_with_the_truth(label_config, tmp_path, monkeypatch):
    import data_gen.run

    run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    first = sorted((out / "train").glob("*.arrow"))[0]
    stray = out / "train" / "zz-0000.arrow"
    shutil.copy(first, stray)
    shutil.copy(first.with_name(first.name + ".json"), stray.with_name(stray.name + ".json"))
    with pytest.raises(shards.ShardError, match="zz-0000.arrow: not listed in .*move it out of the dataset"):
        shards.read_manifest(out)
    monkeypatch.setattr(data_gen.run, "load_pair", lambda cfg: pytest.fail("models loaded"))
    with pytest.raises(UserError, match="holds train/zz-0000.arrow, .*which no `specheads labels` wrote"):
        run_labels(label_config(), quiet=True)
    assert stray.exists()  # not ours to delete
    stray.unlink()
    stray.with_name(stray.name + ".json").unlink()
    run_labels(label_config(), quiet=True)  # finished, nothing to do
    shards.read_manifest(out)


def test_a_manifest_without_a_shard_list_is_an_older_versions(label_config, tmp_path):
    run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["shards"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(shards.ShardError, match="written by an older version of data_gen"):
        shards.read_manifest(out)


def test_an_unlisted_shard_in_an_unfinished_run_is_refused(label_config, tmp_path):
    import pytorch_lightning as pl

    from data_gen.errors import LabelingInterrupted

    class CtrlC(pl.Callback):
        def on_predict_batch_end(self, trainer, *args, **kwargs):
            raise KeyboardInterrupt

    with pytest.raises(LabelingInterrupted):
        run_labels(label_config(), callbacks=[CtrlC()], quiet=True)
    out = tmp_path / "labels"
    done = sorted(out.glob("*/*.arrow"))[0]
    stray = done.with_name("zz-0000.arrow")
    shutil.copy(done, stray)
    with pytest.raises(UserError, match="zz-0000.arrow, which no `specheads labels` wrote"):
        run_labels(label_config(), quiet=True)
    stray.unlink()
    run_labels(label_config(), quiet=True)
    shards.read_manifest(out)


# ------------------------------------------------------------------ bad input: one line
def test_a_fixed_sd_k_runs_as_a_one_point_grid(tmp_path):
    assert Sweep("sd", fixed={"k": 4}).grid == {"k": [4]}
    with pytest.raises(EvalError, match="k is both fixed and swept"):
        Sweep("sd", fixed={"k": 4}, grid={"k": [2]})
    cfg = make_cfg(tmp_path, policies=[Sweep("target_only"), Sweep("sd", fixed={"k": 4})],
                   hf_peer=HFPeer(confidence_thresholds=[]))
    out = run_eval(cfg, fake_engine(), quiet=True)
    runs = {r["run"] for r in ResultStore(out / "results.jsonl").records()}
    assert {"sd[k=4]", "hf_assisted[k=4]"} <= runs


@pytest.mark.parametrize("limit", [0, -1])
def test_a_prompt_limit_below_one_is_one_line_before_anything(tmp_path, capsys, limit, tiny_pair):
    from data_gen.__main__ import main as label_main
    from evaluation.__main__ import main as eval_main

    with pytest.raises(UserError, match="prompts.limit must be a positive number"):
        PromptConfig(limit=limit)
    config = _eval_config(tmp_path, tmp_path / "no-draft", tmp_path / "no-target")
    assert eval_main(["--config", config, "--prompts.limit", str(limit)]) == 2
    assert "prompts.limit must be a positive number of prompts or null (all), got" in _one_line(capsys)
    assert label_main(["--draft.path", str(tiny_pair[0]), "--target.path", str(tiny_pair[1]), "--prompts.source",
                       str(tmp_path / "prompts.jsonl"), "--prompts.limit", str(limit), "--output_dir",
                       str(tmp_path / "labels")]) == 2
    assert "prompts.limit must be a positive number" in _one_line(capsys)
    assert not (tmp_path / "eval").exists() and not (tmp_path / "labels").exists()


def test_a_setting_a_policy_refuses_is_one_line_before_the_models_load(tmp_path, capsys):
    from evaluation.__main__ import main

    config = _eval_config(tmp_path, tmp_path / "no-draft", tmp_path / "no-target",
                          policies=[{"family": "sd", "grid": {"k": [2, -3]}}])
    assert main(["--config", config]) == 2
    assert _one_line(capsys) == "error: sd[k=-3]: k must be at least 1, got -3"
    assert not (tmp_path / "eval").exists()


def test_a_manifest_or_run_record_that_is_not_json(label_config, tmp_path):
    run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    good = shards.read_manifest(out)
    (out / "manifest.json").write_text('{"schema')
    with pytest.raises(UserError, match=r"manifest.json is not valid JSON \(.*\); run the labeling command again"):
        shards.read_manifest(out)
    assert run_labels(label_config(), quiet=True)["shards"] == good["shards"]  # written again from the shards
    (out / "run.json").write_text("nope")
    with pytest.raises(UserError, match=r"run.json is not valid JSON \(.*\); pass --overwrite true"):
        run_labels(label_config(), quiet=True)
    (out / "run.json").write_text("[1]")
    with pytest.raises(LabelingError, match="not a labeling run's record"):
        run_labels(label_config(), quiet=True)
    run_labels(label_config(overwrite=True), quiet=True)
    shards.read_manifest(out)


def test_an_eval_settings_file_that_is_not_json(tmp_path):
    cfg = make_cfg(tmp_path, **QUICK)
    out = run_eval(cfg, fake_engine(), quiet=True)
    for broken, message in (("nope", "is not valid JSON"), ("[1]", "is not an evaluation's settings")):
        (out / "settings.json").write_text(broken)
        with pytest.raises(UserError, match=f"settings.json {message}.*use another output_dir or overwrite: true"):
            run_eval(cfg, fake_engine(), quiet=True)
    cfg.overwrite = True
    run_eval(cfg, fake_engine(), quiet=True)


def test_ctrl_c_while_loading_or_scoring_is_one_line(label_config, tmp_path, capsys, monkeypatch):
    import data_gen.run
    import evaluation.engine
    from data_gen.__main__ import main as label_main
    from evaluation.__main__ import main as eval_main

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data_gen.run, "load_pair", interrupt)
    cfg = label_config()
    assert label_main(["--draft.path", cfg.draft.path, "--target.path", cfg.target.path, "--prompts.source",
                       cfg.prompts.source, "--output_dir", str(tmp_path / "labels")]) == 130
    assert _one_line(capsys).startswith("interrupted: stopped by Ctrl-C")
    monkeypatch.setattr(evaluation.engine.Engine, "load", classmethod(lambda cls, cfg: fake_engine(loglik=interrupt)))
    config = _eval_config(tmp_path, tmp_path / "draft", tmp_path / "target", loglik=True)
    (tmp_path / "draft").mkdir()
    (tmp_path / "target").mkdir()
    for d in ("draft", "target"):
        (tmp_path / d / "config.json").write_text("{}")
    assert eval_main(["--config", config]) == 130
    assert _one_line(capsys).startswith("interrupted: stopped by Ctrl-C; every finished run is kept")
    assert not (tmp_path / "eval" / LOCK_FILE).exists()


def _interrupt_inside_a_weakref_callback():
    """What an import lock's clean-up does with a Ctrl-C while torch loads: CPython prints it and carries on."""

    def callback(ref):
        raise KeyboardInterrupt

    class Collected:
        pass

    obj = Collected()
    ref = weakref.ref(obj, callback)
    del obj  # the callback runs here
    return ref


@pytest.fixture
def python_sigint():
    """SIGINT raising KeyboardInterrupt, as in a terminal, also where the tests run with it ignored (a background
    job)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_cpython_would_ignore_still_stops(monkeypatch, python_sigint):
    ignored = []  # what CPython hands sys.unraisablehook to print as "Exception ignored in …"
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: ignored.append(unraisable.exc_type))
    _interrupt_inside_a_weakref_callback()  # the broken case: without the guard the interrupt is lost
    assert ignored == [KeyboardInterrupt]
    # raised again once the callback has returned, even in a main thread that sleeps (or waits on a lock)
    started, reached = time.monotonic(), []
    with pytest.raises(KeyboardInterrupt), CtrlCGuard():
        _interrupt_inside_a_weakref_callback()
        time.sleep(5)
        reached.append(True)
    assert time.monotonic() - started < 1 and not reached and ignored == [KeyboardInterrupt]  # nothing printed


def _no_interrupt_arrives(seconds: float) -> None:
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        pytest.fail("an interrupt the guard had dropped arrived after its block")


def test_a_block_that_ends_first_drops_the_owed_interrupt(python_sigint):
    with CtrlCGuard():  # its work done before the interrupt came back: nothing to stop
        _interrupt_inside_a_weakref_callback()
    _no_interrupt_arrives(0.3)
    with pytest.raises(UserError), CtrlCGuard():
        _interrupt_inside_a_weakref_callback()
        raise UserError("bad input")  # the block's own error is what the command reports
    _no_interrupt_arrives(0.3)


def test_a_ctrl_c_while_native_libraries_load_waits_for_the_imports(python_sigint):
    """torch calls Python from C++ as it imports, where a KeyboardInterrupt aborts the process: a Ctrl-C inside
    ``deferred()`` is held until the block ends, then raised, and one outside it still stops at once."""
    reached = []
    ctrl_c = CtrlCGuard()
    with pytest.raises(KeyboardInterrupt), ctrl_c:
        with ctrl_c.deferred():
            signal.raise_signal(signal.SIGINT)
            reached.append("rest of the imports")
        reached.append("after the imports")
    assert reached == ["rest of the imports"] and ctrl_c.received
    ctrl_c = CtrlCGuard()
    with pytest.raises(KeyboardInterrupt), ctrl_c:
        with ctrl_c.deferred():
            pass
        signal.raise_signal(signal.SIGINT)  # no longer held
        reached.append("unreachable")
    assert reached == ["rest of the imports"]


@pytest.mark.parametrize("failure", [RecursionError("maximum recursion depth exceeded"),
                                     UserError("cannot read prompts from prompts.jsonl: maximum recursion depth")])
def test_a_failure_after_a_ctrl_c_a_library_caught_is_the_interrupt(failure, tiny_pair, tmp_path, monkeypatch,
                                                                      capsys, python_sigint):
    """``datasets`` imports scipy and numpy.linalg as it loads prompts: a Ctrl-C there can be caught below us and
    come back as another error (numpy's half-imported linalg recursing). The user pressed Ctrl-C: that is what the
    command reports."""
    import evaluation.run
    from evaluation.__main__ import main as eval_main

    def caught_then_failed(cfg):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        raise failure

    monkeypatch.setattr(evaluation.run, "run_eval", caught_then_failed)
    assert eval_main(["--config", _eval_config(tmp_path, *tiny_pair)]) == 130
    assert _one_line(capsys).startswith(f"interrupted: stopped by Ctrl-C (then {type(failure).__name__}: ")
    # the same failure without a Ctrl-C is what it is
    monkeypatch.setattr(evaluation.run, "run_eval", lambda cfg: (_ for _ in ()).throw(failure))
    if isinstance(failure, UserError):
        assert eval_main(["--config", _eval_config(tmp_path, *tiny_pair)]) == 2
    else:
        with pytest.raises(RecursionError):
            eval_main(["--config", _eval_config(tmp_path, *tiny_pair)])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


@pytest.mark.parametrize("command", ["data_gen", "evaluation", "specheads"])
def test_ctrl_c_while_starting_up_is_one_line(command, tiny_pair, prompt_file, tmp_path):
    if command == "specheads":  # a module that imports torch and Lightning as it loads, run by the console script
        args = ["train", "--labels", str(tmp_path / "labels"), "--out", str(tmp_path / "out")]
    elif command == "data_gen":
        args = ["--draft.path", str(tiny_pair[0]), "--target.path", str(tiny_pair[1]), "--prompts.source",
                str(prompt_file), "--output_dir", str(tmp_path / "out"), "--accelerator", "cpu", "--devices", "1"]
    else:
        args = ["--config", _eval_config(tmp_path, *tiny_pair)]
    proc = subprocess.Popen([sys.executable, "-m", command, *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    # inside the imports of torch and Lightning: on a fast machine (an H100 host's 16 cores) a tiny run is over by 1.5 s,
    # so a later interrupt lands after the command has finished
    time.sleep(0.6)
    proc.send_signal(signal.SIGINT)
    rc, err = proc.wait(timeout=120), proc.stderr.read()
    # 130, or killed by SIGINT when the interrupt lands as Python unwinds (a shell shows both as status 130)
    assert rc in (130, -signal.SIGINT) and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("interrupted:")], err


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_partial_one(tmp_path):
    """A full disk halfway through a write (``core.runfolder.write_with``, under every command's outputs): the
    file keeps its old contents, no temporary is left beside it, and the error is one line naming the file."""
    import errno

    from core.errors import UserError
    from core.runfolder import write_text, write_with

    path = write_text(tmp_path / "calibration.json", "old")

    def full_disk(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(UserError, match=f"cannot write {path}: No space left on device"):
        write_with(path, full_disk)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["calibration.json"]


# ------------------------------------------------------------------ every writing command: a user's file is never lost
TRAIN_CONFIG = "configs/train/sprinter_lam1.yaml"


def _full_disk(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")


def _tiny_head(path, threshold=0.5):
    from heads.export import export_head
    from heads.resnet import ResNetHead

    return export_head(ResNetHead(hidden_size=8, depth=1), path, draft={"name": "tiny-draft", "source": "test"},
                       vocab_size=16, label={"kind": "test"}, role="stop",
                       threshold={"name": "h", "value": threshold, "rule": "test"}, metrics={})


def test_eval_overwrite_never_replaces_a_users_results_and_report(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.jsonl").write_text('{"my": "numbers"}\n')
    (folder / "report.md").write_text("my report")
    before = _tree(folder)
    with pytest.raises(UserError, match="results.jsonl, which no `specheads eval` wrote"):
        run_eval(make_cfg(tmp_path, output_dir=str(folder), overwrite=True, **QUICK), fake_engine(), quiet=True)
    assert _tree(folder) == before


@pytest.mark.parametrize("names", [("run.json", "manifest.json"), ("pair.json",)])
def test_labels_overwrite_never_replaces_a_users_run_record_manifest_or_pair(label_config, tmp_path, names):
    out = tmp_path / "labels"
    out.mkdir()
    for name in names:
        (out / name).write_text('{"mine": true}')
    before = _tree(out)
    with pytest.raises(UserError, match="which no `specheads labels` wrote"):
        run_labels(label_config(overwrite=True), quiet=True)
    assert _tree(out) == before


def test_the_lock_never_touches_a_file_it_did_not_create(tmp_path):
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / LOCK_FILE).write_text("my notes")
    with pytest.raises(UserError, match=f"holds a file {LOCK_FILE} that no run of this project wrote"):
        with folder_lock(folder, "a test"):
            pass
    assert (folder / LOCK_FILE).read_text() == "my notes"
    other = tmp_path / "other"
    other.mkdir()
    (other / ".lock").write_text("mine")  # a user's file like any other: refused, or written beside when told
    with pytest.raises(UserError, match=r"not empty \(.lock\)"):
        run_eval(make_cfg(tmp_path, output_dir=str(other), **QUICK), fake_engine(), quiet=True)
    run_eval(make_cfg(tmp_path, output_dir=str(other), overwrite=True, **QUICK), fake_engine(), quiet=True)
    assert (other / ".lock").read_text() == "mine"


def test_bench_precision_never_writes_over_a_label_folders_record(label_config, tmp_path):
    from evaluation.bench_precision import main

    run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    before = _tree(out)
    with pytest.raises(UserError, match="no `specheads bench-precision` wrote it"):
        main(["--config", "configs/labels/humaneval.yaml", "--out", str(out / "run.json")])
    assert _tree(out) == before


def test_export_hf_on_a_full_disk_keeps_the_earlier_export_whole(tmp_path, monkeypatch):
    from pathlib import Path

    from decoding.runtimes.hf_export import write_folder

    out = write_folder(_tiny_head(tmp_path / "stop.safetensors"), tmp_path / "export")
    before = _tree(out)
    head = _tiny_head(tmp_path / "other.safetensors", threshold=0.7)
    written = Path.write_bytes

    def fills_up(path, data):  # the disk is full after the first files
        if len(list(path.parent.iterdir())) > 2:
            _full_disk()
        return written(path, data)

    monkeypatch.setattr(Path, "write_bytes", fills_up)
    with pytest.raises(UserError, match="No space left on device"):
        write_folder(head, out)
    monkeypatch.undo()
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "other.safetensors", "stop.safetensors"]


@pytest.mark.parametrize("metrics", [[{"name": "my-run", "auroc": 0.9}], []])
def test_train_never_replaces_a_users_metrics(label_config, tmp_path, metrics):
    from pipeline import train_all

    run_labels(label_config(), quiet=True)
    out = tmp_path / "train"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps(metrics))
    (out / "metrics.txt").write_text("my table")
    before = _tree(out)
    with pytest.raises(UserError, match="no `specheads train` wrote it"):
        train_all.main(["--labels", str(tmp_path / "labels"), "--configs", TRAIN_CONFIG, "--out", str(out),
                        "--heads_dir", str(tmp_path / "heads"), "--checkpoints", str(tmp_path / "ckpt"),
                        "--max_epochs", "1", "--quiet"])
    assert _tree(out) == before and not (tmp_path / "heads").exists()


def test_curve_never_replaces_a_users_curve(label_config, tmp_path):
    from pipeline import learning_curve

    run_labels(label_config(split_fractions=(0.5, 0.25, 0.25), max_new_tokens=8), quiet=True)
    out = tmp_path / "curve"
    out.mkdir()
    (out / "curve.json").write_text('{"points": []}')
    before = _tree(out)
    labels = str(tmp_path / "labels")
    with pytest.raises(UserError, match="no `specheads curve` wrote it"):
        learning_curve.main(["--labels", labels, "--test_labels", labels, "--configs", TRAIN_CONFIG, "--out",
                             str(out), "--shares", "1.0", "--max_epochs", "1", "--quiet"])
    assert _tree(out) == before


def test_two_trainings_into_one_out_with_other_heads_folders_one_refused(label_config, tmp_path):
    """The lock covers --out as well as the heads folder: the metrics are written while it is held."""
    from pipeline import train_all

    run_labels(label_config(), quiet=True)
    out = tmp_path / "train"
    with folder_lock(out, "a training run"):
        with pytest.raises(FolderInUse, match="in use by a training run"):
            train_all.main(["--labels", str(tmp_path / "labels"), "--configs", TRAIN_CONFIG, "--out", str(out),
                            "--heads_dir", str(tmp_path / "other-heads"), "--checkpoints", str(tmp_path / "ckpt"),
                            "--max_epochs", "1", "--quiet"])
    assert not (tmp_path / "other-heads").exists() and not (out / "metrics.txt").exists()


def test_labels_on_a_full_disk_is_one_line_and_leaves_no_temporary(label_config, tmp_path, monkeypatch):
    from datasets.arrow_writer import ArrowWriter

    def half_then_full(self, *args, **kwargs):
        with open(self._path, "wb") as f:  # what a full disk leaves: part of the file
            f.write(b"part of a shard")
        _full_disk()

    monkeypatch.setattr(ArrowWriter, "write_batch", half_then_full)
    with pytest.raises(UserError, match="No space left on device"):
        run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def test_calibrate_into_a_folder_that_became_read_only_is_one_line_and_keeps_the_old_file(label_config, tmp_path,
                                                                                          monkeypatch, capsys):
    import os
    from pathlib import Path

    from decoding.calibrate import main

    run_labels(label_config(), quiet=True)
    out = tmp_path / "calibration.json"
    argv = ["--labels", str(tmp_path / "labels"), "--out", str(out)]
    main(argv)
    before = out.read_bytes()
    capsys.readouterr()
    unlink = Path.unlink

    def read_only(*_, **__):
        raise PermissionError(errno.EACCES, "Permission denied")

    def no_unlink_of_temporaries(path, *args, **kwargs):
        if ".tmp" in path.name:
            read_only()
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "replace", read_only)
    monkeypatch.setattr(Path, "unlink", no_unlink_of_temporaries)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    monkeypatch.undo()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stop.value.code == 2 and len(err) == 1 and "Permission denied" in err[0], err
    assert out.read_bytes() == before


def test_eval_into_a_folder_holding_a_foreign_results_file_is_one_line(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.jsonl").write_text('{"prompt": 1, "tokens": [3, 4]}\n')
    before = _tree(folder)
    with pytest.raises(UserError, match="no `specheads eval` wrote it"):
        run_eval(make_cfg(tmp_path, output_dir=str(folder), **QUICK), fake_engine(), quiet=True)
    assert _tree(folder) == before


def test_an_eval_folder_of_an_older_layout_is_refused_not_adopted(tmp_path):
    out = run_eval(make_cfg(tmp_path, **QUICK), fake_engine(), quiet=True)
    (out / LEDGER).rename(out / ".eval-files")  # as versions before the one ledger kept it
    before = _tree(out)
    for overwrite in (False, True):
        with pytest.raises(UserError, match="no `specheads eval` wrote"):
            run_eval(make_cfg(tmp_path, overwrite=overwrite, **QUICK), fake_engine(), quiet=True)
    assert _tree(out) == before


def test_a_run_refused_after_the_lock_leaves_no_output_folder(tmp_path, monkeypatch):
    import evaluation.run
    from heads.export import HeadFileError

    def refuse(path):
        raise HeadFileError(f"{path}: head was trained for another draft")

    engine = fake_engine()
    engine.check_head = refuse
    monkeypatch.setattr(evaluation.run, "head_files", lambda cfg: [str(tmp_path / "h.safetensors")])
    with pytest.raises(HeadFileError):
        run_eval(make_cfg(tmp_path, output_dir=str(tmp_path / "new" / "eval"), **QUICK), engine, quiet=True)
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())
    assert not (tmp_path / "new" / "eval").exists()


def test_bench_train_never_writes_into_a_users_folder(tmp_path):
    from pipeline.bench import main

    folder = tmp_path / "labels-64x8"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="no `specheads bench-train` wrote it"):
        main(["--rows", "64", "--hidden_size", "8", "--batch_size", "16", "--dir", str(tmp_path)])
    assert _tree(folder) == {"notes.txt": b"mine"}


def test_a_ledger_line_naming_a_file_outside_its_folder_deletes_nothing_there(tmp_path):
    out = run_eval(make_cfg(tmp_path, **QUICK), fake_engine(), quiet=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    with open(out / LEDGER, "a") as f:
        f.write(f"eval\t../victim.txt\neval\t{victim}\n")
    run_eval(make_cfg(tmp_path, overwrite=True, **QUICK), fake_engine(), quiet=True)
    assert victim.read_text() == "mine"


def test_a_ledger_line_naming_a_folder_never_deletes_it_whole(label_config, tmp_path):
    run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    (out / "train" / "my_notes.txt").write_text("mine")
    with open(out / LEDGER, "a") as f:
        f.write("labels\ttrain\nlabels\ttrain/.\n")
    run_labels(label_config(seed=5, overwrite=True), quiet=True)
    assert (out / "train" / "my_notes.txt").read_text() == "mine"


@pytest.mark.parametrize("kind", ["link", "garbage"])
def test_a_ledger_no_run_wrote_is_refused_untouched(label_config, tmp_path, kind):
    out = tmp_path / "labels"
    out.mkdir()
    diary = tmp_path / "diary.txt"
    diary.write_text("my diary\n")
    if kind == "link":
        (out / LEDGER).symlink_to(diary)
    else:
        (out / LEDGER).write_text("my own list of files\n")
    with pytest.raises(UserError, match="not a ledger this project wrote"):
        run_labels(label_config(), quiet=True)
    assert diary.read_text() == "my diary\n"
    assert kind == "link" or (out / LEDGER).read_text() == "my own list of files\n"


@pytest.mark.parametrize("kind", ["empty", "link"])
def test_a_lock_file_no_run_wrote_is_refused_untouched_even_empty_or_a_link(tmp_path, kind):
    folder = tmp_path / "out"
    folder.mkdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("")
    if kind == "empty":
        (folder / LOCK_FILE).write_text("")
    else:
        (folder / LOCK_FILE).symlink_to(target)
    with pytest.raises(UserError, match="no run of this project wrote"):
        with folder_lock(folder, "a test"):
            pass
    assert (folder / LOCK_FILE).is_symlink() == (kind == "link") and (folder / LOCK_FILE).exists()
    assert target.read_text() == ""


def test_a_stale_lock_of_a_killed_run_is_taken_over(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_FILE).write_text(json.dumps({"pid": 2 ** 22 + 7, "host": "gone", "what": "a killed run"}))
    with folder_lock(folder, "the next run"):
        assert json.loads((folder / LOCK_FILE).read_text())["what"] == "the next run"
    assert not (folder / LOCK_FILE).exists()


def test_train_checkpoints_are_its_own_folder_started_afresh(label_config, tmp_path):
    """A user's folder under --checkpoints is refused; its own is started afresh, so best.ckpt is the run's own."""
    from pipeline import train_all

    run_labels(label_config(split_fractions=(0.5, 0.25, 0.25), max_new_tokens=8), quiet=True)
    ckpt = tmp_path / "ckpt"
    (ckpt / "sprinter_lam1").mkdir(parents=True)
    (ckpt / "sprinter_lam1" / "best.ckpt").write_text("my checkpoint")
    argv = ["--labels", str(tmp_path / "labels"), "--configs", TRAIN_CONFIG, "--out", str(tmp_path / "train"),
            "--heads_dir", str(tmp_path / "heads"), "--checkpoints", str(ckpt), "--max_epochs", "1", "--quiet"]
    with pytest.raises(UserError, match="--checkpoints .*sprinter_lam1 is not empty .* no `specheads train` wrote"):
        train_all.main(argv)
    assert (ckpt / "sprinter_lam1" / "best.ckpt").read_text() == "my checkpoint"
    (ckpt / "sprinter_lam1" / "best.ckpt").unlink()
    for _ in range(2):
        train_all.main(argv)
    assert sorted(p.name for p in (ckpt / "sprinter_lam1").glob("*.ckpt")) == ["best.ckpt"]


def test_an_eval_refuses_another_drafts_calibration_before_it_times_or_writes_anything(tiny_pair, tmp_path):
    from test_eval_latency import timing_file

    from decoding.estimates import CalibratedConfidence
    from evaluation.__main__ import main

    calibration = CalibratedConfidence(q=np.array([0.0, 1.0]), acceptance=np.array([0.0, 1.0]))
    calibration.fitted = {"draft": {"name": "another-draft", "source": "test", "weights": "0" * 64},
                          "sampling": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}}
    calibration.save(tmp_path / "calibration.json")
    (tmp_path / "timing.json").write_text(json.dumps(timing_file()))
    config = _eval_config(tmp_path, tiny_pair[0], tiny_pair[1], policies=[
        {"family": "target_only"},
        {"family": "goodput", "fixed": {"calibration": str(tmp_path / "calibration.json"),
                                        "timing": str(tmp_path / "timing.json")}}])
    assert main(["--config", config]) == 2
    assert not (tmp_path / "eval").exists()  # no settings.json, forward_timing.json or ledger left behind


def test_a_commands_folder_of_one_role_is_cleared_of_that_roles_files_only(tmp_path):
    """A training run writes heads, checkpoints and metrics; clearing its checkpoints in a folder that also holds heads
    it exported deletes the checkpoints alone."""
    from core.runfolder import RunFolder

    folder = tmp_path / "checkpoints"
    heads = RunFolder(folder, "train", "--heads_dir", ("*.safetensors",))
    heads.start(["head.safetensors"])
    (folder / "head.safetensors").write_text("an exported head")
    ckpts = RunFolder(folder, "train", "--checkpoints", ("*.ckpt",))
    ckpts.start(["best.ckpt"])
    (folder / "best.ckpt").write_text("a checkpoint")
    ckpts.clear()
    assert (folder / "head.safetensors").read_text() == "an exported head" and not (folder / "best.ckpt").exists()


def test_a_run_refused_by_another_runs_lock_leaves_its_ledger_alone(tmp_path):
    from core.runfolder import RunFolder

    folder = RunFolder(tmp_path / "new", "eval", "--output_dir")
    with folder_lock(folder.root, "the first run"):
        folder.start(["results.jsonl"])
        with pytest.raises(FolderInUse):
            with RunFolder(folder.root, "eval", "--output_dir").hold("the second run"):
                pass
        assert folder.ledger.owner() == "eval"


def test_a_ledger_refuses_a_name_that_would_write_a_line_of_its_own(tmp_path):
    from core.runfolder import OutputFile

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="tab or a line break"):
        OutputFile(tmp_path / "cal.json\neval\tnotes.txt", "calibrate", "calibration file").claim()
    assert not (tmp_path / LEDGER).exists()


def test_an_export_holding_a_users_folder_or_link_is_refused_not_swapped_away(tmp_path):
    from decoding.runtimes.hf_export import write_folder

    out = write_folder(_tiny_head(tmp_path / "stop.safetensors"), tmp_path / "export")
    (out / "my_notes").mkdir()
    with pytest.raises(UserError, match="my_notes, which no `specheads export-hf` wrote"):
        write_folder(_tiny_head(tmp_path / "other.safetensors"), out)
    assert (out / "my_notes").is_dir()


def test_a_run_starting_while_another_takes_the_folder_finds_it_in_use_not_holding_a_strangers_file(tmp_path):
    """The lock is written under a temporary name and linked: caught in between, the folder holds only that
    temporary, which is the other run's, not a user's file."""
    from core.runfolder import RunFolder

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / f"{LOCK_FILE}.tmp{os.getpid() + 1}").write_text("pid\n")
    RunFolder(folder, "labels", "--output_dir", ["*.arrow"]).check(beside=False)  # nothing of a stranger's
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty"):
        RunFolder(folder, "labels", "--output_dir", ["*.arrow"]).check(beside=False)
