"""The labeling stage end to end on tiny random-init Llama models: invariances, resume, manifest, bad input."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from core import shards
from core.adapter import HFCausalLM
from core.sampling import Sampling
from data_gen.__main__ import main as cli_main
from data_gen.labeler import Labeler, Prompt
from data_gen.run import run_labels
from testing.tiny import make_tokenizer

CATEGORIES = ["original", "draft", "target", "interleaved"]


@pytest.fixture(scope="module")
def models(tiny_pair):
    draft, target = (AutoModelForCausalLM.from_pretrained(p).eval() for p in tiny_pair)
    return draft, target


def make_labeler(models, **kw):
    draft, target = models
    tok = make_tokenizer()
    return Labeler(HFCausalLM(draft), HFCausalLM(target), kw.pop("sampling", Sampling(max_new_tokens=7)), seed=3,
                   eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, **kw)


PROMPTS = ["def f ( x ) :", "for i in range ( n ) : print i", "x", "return a + b * c if a > b else c"]


@pytest.mark.parametrize("category", CATEGORIES)
def test_left_padding_never_changes_a_label(models, category):
    tok = make_tokenizer()
    prompts = [Prompt(i, tok(t)["input_ids"], category) for i, t in enumerate(PROMPTS)]
    lab = make_labeler(models, mixing_ratio=0.4)
    batch = lab.label(prompts, "cpu")
    for p in prompts:
        alone = lab.label([p], "cpu")
        sel = batch["prompt_id"] == p.prompt_id
        assert [c for c, m in zip(batch["category"], sel) if m] == alone["category"]
        for k in ("token_id", "position", "loss_mask", "greedy_match"):
            assert torch.equal(batch[k][sel], alone[k]), k
        for k in ("logp_draft", "logp_target", "acceptance", "entropy_draft", "tv", "js", "hidden", "hidden_prev"):
            torch.testing.assert_close(batch[k][sel].float(), alone[k].float(), atol=2e-3, rtol=1e-3)


def _prefixes(rows, prompt: list[int], response: list[int]) -> list[list[int]]:
    """The context in front of each row's token, rebuilt from the rows alone (the response is teacher-forced)."""
    cats = rows["category"]
    own = {c: [t for t, k in zip(rows["token_id"].tolist(), cats) if k == c] for c in set(cats)}
    before = {"target": response, "token_mixed": own.get("token_mixed"), "interleaved": own.get("token_mixed"),
              "draft": own.get("draft")}
    out = []
    for c, pos in zip(cats, rows["position"].tolist()):
        i = pos - len(prompt)
        out.append(prompt[:pos] if c == "original" else prompt + before[c][:i])
    return out


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_row_equals_plain_forwards_at_its_own_prefix(models, category):
    """Each row's features and both log-probs equal unbatched, uncached forwards of (prefix, token): ``hidden``
    after reading the token, ``hidden_prev`` the state that produced q. Token-mixed rows are labeled at X<i."""
    draft, target = models
    tok = make_tokenizer()
    prompt = tok("def f ( x ) :")["input_ids"]
    response = tok("return x + 1 if x", add_special_tokens=False)["input_ids"]
    rows = make_labeler(models, sampling=Sampling(max_new_tokens=len(response), temperature=1.0),
                        mixing_ratio=0.4).label([Prompt(0, prompt, category, response)], "cpu")
    prefixes = _prefixes(rows, prompt, response)
    for i, (prefix, y) in enumerate(zip(prefixes, rows["token_id"].tolist())):
        with torch.no_grad():
            h = draft.model(input_ids=torch.tensor([prefix + [y]])).last_hidden_state[0]
        torch.testing.assert_close(rows["hidden"][i].float(), h[-1].half().float(), atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(rows["hidden_prev"][i].float(), h[-2].half().float(), atol=2e-3, rtol=1e-3)
        label_prefix = prompt + response[: len(prefix) - len(prompt)] if rows["category"][i] == "token_mixed" else prefix
        with torch.no_grad():
            logq = draft(input_ids=torch.tensor([label_prefix])).logits[0, -1].log_softmax(-1)[y]
            logp = target(input_ids=torch.tensor([label_prefix])).logits[0, -1].log_softmax(-1)[y]
        assert rows["logp_draft"][i].item() == pytest.approx(logq.item(), abs=1e-4)
        assert rows["logp_target"][i].item() == pytest.approx(logp.item(), abs=1e-4)
        with torch.no_grad():  # the draft scores a head reads: q where the features read, (prefix, token)
            read = draft(input_ids=torch.tensor([prefix])).logits[0, -1].log_softmax(-1)
        assert rows["read_logp_draft"][i].item() == pytest.approx(read[y].item(), abs=1e-4)
        h_read = -(read.exp() * read).sum()
        assert rows["read_entropy_draft"][i].item() == pytest.approx(h_read.item(), abs=1e-4)


def _rows(out):
    return {s: shards.load_split(out, s).to_pandas() for s in shards.SPLITS}


def test_run_writes_manifest_and_splits_by_prompt(label_config, tmp_path):
    manifest = run_labels(label_config(), quiet=True)
    out = tmp_path / "labels"
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["schema_version"] == shards.SCHEMA_VERSION
    assert manifest["models"]["draft"]["hidden_size"] == 32
    assert manifest["models"]["draft"]["vocab_size"] == manifest["models"]["target"]["vocab_size"]
    rows = _rows(out)
    ids = [set(rows[s]["prompt_id"]) for s in shards.SPLITS]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    for s in shards.SPLITS:
        assert manifest["splits"][s]["rows"] == len(rows[s])
    train = rows["train"]
    assert set(train["category"]) == {*CATEGORIES, "token_mixed"}
    assert manifest["rows_for_label"]["soft"] == ["target", "token_mixed"]
    assert len(train["hidden"][0]) == 32
    assert np.all(train["acceptance"].between(0, 1))
    # teacher-forced labeling records itself in the manifest
    forced = run_labels(label_config(response_source="dataset", output_dir=str(tmp_path / "forced")), quiet=True)
    assert forced["response_source"] == "dataset"


def test_same_seed_same_rows_and_rerun_is_a_no_op(label_config, tmp_path):
    run_labels(label_config(), quiet=True)
    again = run_labels(label_config(output_dir=str(tmp_path / "again")), quiet=True)
    a, b = _rows(tmp_path / "labels"), _rows(tmp_path / "again")
    for s in shards.SPLITS:
        assert a[s].drop(columns="hidden").equals(b[s].drop(columns="hidden"))
    before = sorted(p.stat().st_mtime_ns for p in (tmp_path / "labels").rglob("*.arrow"))
    assert run_labels(label_config(), quiet=True)["splits"] == again["splits"]
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "labels").rglob("*.arrow")) == before


KILL_AFTER = textwrap.dedent(
    """
    import os, signal, sys
    import pytorch_lightning as pl
    from core.sampling import Sampling
    from core.models import ModelSpec
    from core.prompts import PromptConfig
    from data_gen.config import LabelConfig
    from data_gen.run import run_labels

    class Die(pl.Callback):
        def on_predict_batch_end(self, trainer, *args, **kwargs):
            if trainer.predict_loop.batch_progress.current.completed >= 2:
                open(sys.argv[4] + "/.manifest.json.tmp123", "w").write("left by a killed writer")
                open(sys.argv[4] + "/.notes.tmp", "w").write("not a temporary of ours")
                os.kill(os.getpid(), signal.SIGKILL)

    cfg = LabelConfig(draft=ModelSpec(path=sys.argv[1], name="tiny-draft"),
                      target=ModelSpec(path=sys.argv[2], name="tiny-target"),
                      prompts=PromptConfig(source=sys.argv[3], response_field="answer"),
                      sampling=Sampling(max_new_tokens=6), output_dir=sys.argv[4], batch_size=3,
                      accelerator="cpu", devices=1, dtype="float32")
    run_labels(cfg, callbacks=[Die()], quiet=True)
    """
)


def test_resume_after_kill_9_gives_the_uninterrupted_rows(label_config, tiny_pair, prompt_file, tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER, str(tiny_pair[0]), str(tiny_pair[1]), str(prompt_file),
                           str(killed)], capture_output=True, cwd=os.getcwd())
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "manifest.json").exists()
    n_done = len(list(killed.glob("*/*.arrow")))
    assert 2 <= n_done < 10
    run_labels(label_config(output_dir=str(killed)), quiet=True)
    assert [p.name for p in killed.rglob(".*.tmp*")] == [".notes.tmp"]
    run_labels(label_config(), quiet=True)
    resumed, clean = _rows(killed), _rows(tmp_path / "labels")
    for s in shards.SPLITS:
        assert len(resumed[s]) == len(clean[s])
        assert resumed[s].drop(columns="hidden").equals(clean[s].drop(columns="hidden"))


def test_ctrl_c_stops_cleanly_and_resumes(label_config, tmp_path):
    import pytorch_lightning as pl

    class CtrlC(pl.Callback):
        def on_predict_batch_end(self, trainer, *args, **kwargs):
            if trainer.predict_loop.batch_progress.current.completed >= 3:
                raise KeyboardInterrupt

    from data_gen.errors import LabelingInterrupted

    with pytest.raises(LabelingInterrupted, match="run the same command again"):
        run_labels(label_config(), callbacks=[CtrlC()], quiet=True)
    out = tmp_path / "labels"
    assert not (out / "manifest.json").exists()
    manifest = run_labels(label_config(), quiet=True)
    fresh = run_labels(label_config(output_dir=str(tmp_path / "fresh")), quiet=True)
    assert manifest["splits"] == fresh["splits"]


def test_resume_with_other_settings_is_refused(label_config):
    run_labels(label_config(), quiet=True)
    from data_gen.errors import LabelingError

    with pytest.raises(LabelingError, match="other settings.*seed"):
        run_labels(label_config(seed=5), quiet=True)
    run_labels(label_config(seed=5, overwrite=True), quiet=True)


# ------------------------------------------------------------------ bad input
def _cli(label_config, capsys, *extra, **overrides):
    cfg = label_config(**overrides)
    args = ["--draft.path", cfg.draft.path, "--target.path", cfg.target.path, "--prompts.source", cfg.prompts.source,
            "--prompts.response_field", "answer", "--output_dir", cfg.output_dir, "--sampling.max_new_tokens", "6",
            "--accelerator", "cpu", "--devices", "1", "--dtype", "float32", *extra]
    rc = cli_main(args)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == err[-1]  # one line names the problem (progress bars aside)
    return rc, errors


def test_missing_model_path(label_config, capsys, tmp_path):
    rc, err = _cli(label_config, capsys, "--draft.path", str(tmp_path / "nope"))
    assert rc == 2 and err[-1] == f"error: model path not found: {tmp_path / 'nope'}"
    assert not (tmp_path / "labels" / "manifest.json").exists()


def test_vocabulary_mismatch(label_config, capsys, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer()
    other = tmp_path / "other"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok) + 8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(other)
    tok.save_pretrained(other)
    rc, err = _cli(label_config, capsys, "--target.path", str(other))
    assert rc == 2 and "vocabularies differ" in err[-1] and len(err) == 1


def test_empty_prompt_file(label_config, capsys, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    rc, err = _cli(label_config, capsys, "--prompts.source", str(empty))
    assert rc == 2 and err == [f"error: prompt file is empty: {empty}"]


def test_missing_text_field(label_config, capsys):
    rc, err = _cli(label_config, capsys, "--prompts.text_field", "question")
    assert rc == 2 and "no field 'question'" in err[-1] and len(err) == 1


def test_prompt_longer_than_the_context_window(label_config, capsys, tmp_path):
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": " ".join(["x"] * 600), "answer": "y"}) + "\n")
    rc, err = _cli(label_config, capsys, "--prompts.source", str(long))
    assert rc == 2 and "exceeds the context window of 512 tokens" in err[-1]
    assert not (tmp_path / "labels" / "manifest.json").exists()


def test_unwritable_output_folder(label_config, capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc, err = _cli(label_config, capsys, "--output_dir", str(blocker / "labels"))
    assert rc == 2 and err[-1] == f"error: --output_dir {blocker / 'labels'}: {blocker} is a file, not a folder"


def test_categories_in_equal_shares_per_split(label_config):
    from data_gen.batches import build_records

    cfg = label_config()
    records = build_records(cfg, make_tokenizer(), context=512)
    for split in shards.SPLITS:
        cats = [r["prompt"].category for r in records if r["split"] == split]
        counts = [cats.count(c) for c in CATEGORIES]
        assert max(counts) - min(counts) <= 1, (split, counts)


def test_chat_template_wraps_the_prompt():
    from core.prompts import tokenize_prompt

    tok = make_tokenizer()
    assert tokenize_prompt(tok, "def f", chat_template=True) == tok("def f :", add_special_tokens=False)["input_ids"]
    assert tokenize_prompt(tok, "def f", chat_template=False) == tok("def f")["input_ids"]


@pytest.mark.parametrize("path", sorted(__import__("pathlib").Path("configs/labels").glob("*.yaml")), ids=str)
def test_every_label_config_parses_through_the_cli(path):
    from data_gen.__main__ import parser
    from data_gen.config import LabelConfig

    p = parser()
    ns = p.instantiate(p.parse_args(["--config", str(path)]))
    cfg = LabelConfig(**{k: v for k, v in vars(ns).items() if k != "config"})
    assert cfg.draft.display_name and cfg.target.display_name


def test_a_gguf_file_that_does_not_match_its_pin_is_refused_before_converting(tmp_path, monkeypatch):
    import hashlib

    from core import models
    from core.errors import UserError

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF not really")
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    converted = []
    monkeypatch.setattr(models, "_convert_gguf", lambda path, digest: converted.append(digest) or str(tmp_path))
    with pytest.raises(UserError, match="the config pins 00000000"):
        models.resolve(models.ModelSpec(path=str(gguf), gguf_sha256="0" * 64))
    assert converted == []
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert models.resolve(models.ModelSpec(path=str(gguf), gguf_sha256=digest.upper()))[1]["sha256"] == digest
    assert converted == [digest]
