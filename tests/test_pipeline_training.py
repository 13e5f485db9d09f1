"""Data module over shards written by the labeling stage, every config through the real CLI, a fast_dev_run fit,
and the ``make train`` driver end to end on tiny labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
import torch
from torch import nn

from core import label_math as lm
from core.cache import file_sha256
from core.errors import SettingError
from core.shards import load_split, read_manifest
from pipeline.cli import HeadCLI
from pipeline.data import BlockSampler, LabelDataModule
from pipeline.loss import weighted_bce
from pipeline.module import HeadModule

CONFIGS = sorted(c for c in Path(__file__).resolve().parents[1].glob("configs/train/*.yaml")
                 if c.stem != "base" and not c.stem.startswith("lookup"))
"""The draft's heads' configs (prompt lookup's stop head reads labels of target states: tests/test_lookup_head.py)."""


@pytest.fixture(scope="module")
def tiny_labels(tmp_path_factory):
    """A complete labeled dataset written by the labeling stage (d = 32), with rows in train, val and test."""
    from core.models import ModelSpec
    from core.prompts import PromptConfig
    from core.sampling import Sampling
    from data_gen.config import LabelConfig
    from data_gen.run import run_labels
    from testing.tiny import make_pair, write_prompts

    root = tmp_path_factory.mktemp("pipeline_labels")
    draft, target = make_pair(root / "models")
    cfg = LabelConfig(
        draft=ModelSpec(path=str(draft), name="tiny-draft"),
        target=ModelSpec(path=str(target), name="tiny-target"),
        prompts=PromptConfig(source=str(write_prompts(root / "prompts.jsonl", n=16)), response_field="answer"),
        sampling=Sampling(max_new_tokens=8),
        output_dir=str(root / "labels"),
        split_fractions=(0.5, 0.25, 0.25),
        batch_size=8,
        dtype="float32",
    )
    run_labels(cfg, quiet=True)
    return root / "labels"


def test_data_module_reads_loss_rows_and_labels(tiny_labels):
    dm = LabelDataModule(str(tiny_labels), label="sprinter", lam=1.2, batch_size=16)
    assert dm.hidden_size == read_manifest(tiny_labels)["feature"]["hidden_size"] == 32
    ds = load_split(tiny_labels, "train").with_format("numpy")[:]
    keep = ds["loss_mask"].astype(bool) & np.isin(ds["category"].astype(str), lm.CATEGORIES)  # SPRINTER's rows
    assert keep.sum() < ds["loss_mask"].sum()  # the token-mixed rows are the stop head's
    batches = list(dm.train_dataloader())
    assert sum(len(b["target"]) for b in batches) == keep.sum()
    assert max(len(b["target"]) for b in batches) == 16
    # a row-for-row check: sort everything the loader yields back into file order
    rows = dm.rows("train")
    b = rows[np.arange(len(rows))]
    np.testing.assert_array_equal(b["hidden"].numpy(), ds["hidden"][keep].astype(np.float32))
    expected = lm.sprinter_label(torch.from_numpy(ds["ratio"][keep]), 1.2).float()
    torch.testing.assert_close(b["target"], expected)
    torch.testing.assert_close(b["p_draft"], torch.from_numpy(np.exp(ds["read_logp_draft"][keep])))


@pytest.mark.parametrize("label, position", [("soft", "own"), ("sprinter", "prev")])
def test_each_head_reads_its_rows_and_feature(tiny_labels, label, position):
    """The stop head trains on rows labeled on the clean prefix, the verifier on the four §3.2 categories; the
    feature is the column of the chosen position."""
    dm = LabelDataModule(str(tiny_labels), label=label, feature_position=position)
    ds = load_split(tiny_labels, "val").with_format("numpy")[:]
    keep = ds["loss_mask"].astype(bool) & np.isin(ds["category"].astype(str), lm.ROWS_FOR_LABEL[label])
    rows = dm.rows("val")
    b = rows[np.arange(len(rows))]
    column = {"own": "hidden", "prev": "hidden_prev"}[position]
    np.testing.assert_array_equal(b["hidden"].numpy(), ds[column][keep].astype(np.float32))
    np.testing.assert_array_equal(b["ratio"].numpy(), ds["ratio"][keep])


def test_soft_label_and_category_filter(tiny_labels):
    dm = LabelDataModule(str(tiny_labels), label="soft", categories=["target", "draft"])
    ds = load_split(tiny_labels, "val").with_format("numpy")[:]
    keep = ds["loss_mask"].astype(bool) & np.isin(ds["category"].astype(str), ["target", "draft"])
    rows = dm.rows("val")
    b = rows[np.arange(len(rows))]
    np.testing.assert_allclose(b["target"].numpy(), ds["acceptance"][keep])
    np.testing.assert_array_equal(b["binary"].numpy(), (ds["acceptance"][keep] > 0.5).astype(np.float32))


class FixedLogits(nn.Module):
    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits


def test_categories_can_have_equal_shares_of_the_loss(tiny_labels):
    """SPRINTER §3.2: equal shares of prefixes. Row counts differ by category (prompts come in equal shares), so each
    row is weighted n / (C·n_c): every category's weights sum to n / C, and the loss is the mean of the categories'
    losses. Shown on the stop head's rows, whose counts differ here (token-mixed rows count the draft's tokens only);
    the verifier's rows are balanced by default, the stop head's only when asked."""
    dm = LabelDataModule(str(tiny_labels), label="soft", balance_categories=True)
    rows = dm.rows("train")
    b = rows[np.arange(len(rows))]
    cats = load_split(tiny_labels, "train").with_format("numpy")[:]["category"].astype(str)[rows.index]
    masks = [torch.from_numpy(cats == c) for c in dm.categories]
    assert len({int(m.sum()) for m in masks}) == len(masks)  # unequal row counts: the weights matter
    for m in masks:
        assert b["weight"][m].sum().item() == pytest.approx(len(rows) / len(masks))
    logits = torch.randn(len(rows), generator=torch.Generator().manual_seed(0))
    module = HeadModule(FixedLogits(logits))
    module.log = lambda *args, **kwargs: None  # outside a trainer
    per_category = torch.stack([weighted_bce(logits[m], b["target"][m]) for m in masks])
    assert module._step(b, "train").item() == pytest.approx(per_category.mean().item(), rel=1e-5)
    assert LabelDataModule(str(tiny_labels), label="sprinter").balance_categories
    assert LabelDataModule(str(tiny_labels), label="soft").rows("train").weight.eq(1).all()


def test_bad_settings_are_refused(tiny_labels):
    with pytest.raises(ValueError, match="known: original, draft, target, interleaved, token_mixed"):
        LabelDataModule(str(tiny_labels), categories=["prompt"])
    with pytest.raises(ValueError, match="feature_position must be one of own, prev"):
        LabelDataModule(str(tiny_labels), feature_position="next")
    with pytest.raises(ValueError, match="label must be"):
        LabelDataModule(str(tiny_labels), label="hard")


def test_a_manifest_whose_hidden_size_disagrees_with_the_shards_is_refused(tiny_labels, tmp_path):
    import json
    import shutil

    copy = tmp_path / "labels"
    shutil.copytree(tiny_labels, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["feature"]["hidden_size"] = 896
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="manifest gives hidden size 896, the train shards hold features of size 32"):
        LabelDataModule(str(copy)).rows("train")


@pytest.mark.parametrize("extra,message", [
    (["--data.lam", "0"], "lam must be positive, got 0.0"),
    (["--model.w_rej", "-1"], "w_acc and w_rej must be positive, got 1.0, -1.0"),
    (["--model.head.init_args.depth", "-1"], "depth must be in 0..4, got -1"),
    (["--data.labels", "ORIGINAL_ONLY"], "split has no draft-token rows of the categories ['target', 'token_mixed']"),
    (["--data.labels", "nowhere"], "nowhere/manifest.json not found: run `make labels`"),
    (["--data.batch_size", "-5"], "batch_size, eval_batch_size and block_size must be 1 or more"),
    (["--data.num_workers", "-1"], "num_workers 0 or more; got {'num_workers': -1}"),
    (["--model.lr", "-0.1"], "lr and scores_lr must be positive, got -0.1, None"),
    (["--model.weight_decay", "-1"], "weight_decay must be 0 or more"),
    (["--model.threshold", "1.5"], "0 <= threshold <= 1, got 1.5"),
    (["--trainer.max_epochs", "-5"], "`max_epochs` must be a non-negative integer or -1"),
])
def test_the_training_cli_names_a_bad_setting_in_one_line(tiny_labels, tmp_path, capsys, extra, message):
    from data_gen.run import run_labels
    from pipeline.cli import main
    from testing import tiny

    if "ORIGINAL_ONLY" in extra:  # labels of `original` prompts only: no rows for the SpecDec++ head
        draft, target = tiny.make_pair(tmp_path / "models")
        prompts = tiny.write_prompts(tmp_path / "prompts.jsonl", n=8)
        extra = ["--data.labels", str(tmp_path / "labels")]
        run_labels(tiny.label_config(draft, target, prompts, tmp_path / "labels", max_new_tokens=4,
                                     categories=["original"]), quiet=True)
    config = CONFIGS[0].parent / "specdecpp_d3_w6.yaml"
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(config), "--data.labels", str(tiny_labels), "--trainer.max_epochs", "1",
              "--trainer.default_root_dir", str(tmp_path), "--checkpoint.dirpath", str(tmp_path / "ckpt"),
              "--trainer.enable_progress_bar", "false", *extra])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and err[-1].startswith("error: ") and message in err[-1]
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("flags,message", [
    (["--configs", "missing.yaml"], "config missing.yaml: no such file"),
    ([], "manifest.json not found"),
    (["--max_epochs", "-5"], "--max_epochs must be 1 or more (or -1: until early stopping), got -5"),
    (["--devices", "-1"], "--devices must be auto, a number of devices (1 or more) or a list of device indices"),
    (["--devices", "0"], "got '0'"),
    (["--num_nodes", "0"], "--num_nodes must be 1 or more, got 0"),
])
def test_train_all_names_a_bad_flag_in_one_line(flags, message, tmp_path):
    """Refused before any labels are read: one ``error:`` line, status 2."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pipeline.train_all", "--labels", str(tmp_path / "none"), *flags],
                          capture_output=True, text=True, cwd=Path(__file__).parents[1])
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), done.stderr[-2000:]
    assert message in err[0]


@pytest.mark.parametrize("block_size", [1, 4])
def test_sampler_covers_every_row_once_per_epoch(block_size):
    s = BlockSampler(103, 10, shuffle=True, block_size=block_size)
    for _ in range(2):
        idx = np.concatenate(list(s))
        assert sorted(idx.tolist()) == list(range(103)) and len(list(s)) == len(s) == 11


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_every_config_parses_through_the_cli(config, tiny_labels):
    cli = HeadCLI(args=["--config", str(config), "--data.labels", str(tiny_labels)], run=False)
    assert cli.model.head.config["hidden_size"] == 32  # linked from the data, not typed in the YAML
    assert cli.datamodule.label in ("soft", "sprinter")
    # configs/train/base.yaml under the head's own keys: what every head shares is said there once
    assert cli.trainer.max_epochs == 40 and cli.datamodule.batch_size == 256 and cli.model.lr == 0.001


def test_the_base_config_is_read_under_each_heads_own_and_a_flag_overrides_both(capsys):
    """``python -m pipeline fit`` (a subcommand's parser) reads the base first too; the head's keys and then flags
    override it."""
    from pipeline.cli import main

    config = CONFIGS[0].parent / "sprinter_lam1.5.yaml"
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--trainer.max_epochs", "7", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_epochs"] == 7 and printed["trainer"]["accelerator"] == "cpu"
    assert printed["data"]["batch_size"] == 256 and printed["data"]["lam"] == 1.5 and printed["seed_everything"] == 0


def test_fast_dev_run_fit(tiny_labels, tmp_path):
    config = CONFIGS[0].parent / "specdecpp_d3_w6.yaml"
    cli = HeadCLI(args=["fit", "--config", str(config), "--data.labels", str(tiny_labels),
                        "--data.batch_size", "16", "--trainer.fast_dev_run", "true",
                        "--trainer.default_root_dir", str(tmp_path), "--checkpoint.dirpath", str(tmp_path / "ckpt"),
                        "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.state.finished
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_train_all_exports_loadable_heads(tiny_labels, tmp_path):
    from heads.export import load_head
    from pipeline import train_all

    results = train_all.main(["--labels", str(tiny_labels), "--out", str(tmp_path / "train"),
                              "--checkpoints", str(tmp_path / "ckpt"), "--heads_dir", str(tmp_path / "heads"),
                              "--max_epochs", "2", "--quiet"])
    draft = read_manifest(tiny_labels)["models"]["draft"]
    assert [r.name for r in results] == ["sprinter_lam1", "specdecpp_d3_w6"]
    for r in results:
        head, meta = load_head(r.export, draft=draft)
        assert meta["metrics"]["test/head/auroc"] == pytest.approx(r.test["head/auroc"])
        assert 0 <= meta["metrics"]["test/head/eta_fp_thm"] <= 1  # Theorem 1's η_FP, what the eval report reads
        assert 0 <= meta["threshold"]["value"] <= 1
    assert (tmp_path / "train" / "roc.png").stat().st_size > 0
    table = (tmp_path / "train" / "metrics.txt").read_text()
    assert "p_draft" in table and "η_FP*" in table
    # which file each row measured, for an eval's report to show only the heads it decoded
    metrics = json.loads((tmp_path / "train" / "metrics.json").read_text())
    assert [m["export_sha256"] for m in metrics] == [file_sha256(r.export) for r in results]


def test_feature_family_heads_train_export_and_name_what_they_read(tiny_labels, tmp_path):
    """Every feature family reaches the head (scores and vectors), the file lists them, the table gives intervals
    over prompts, and a runtime that cannot compute them refuses the file in one line."""
    from heads.export import HeadFileError, load_head
    from heads.exported import ExportedHead
    from pipeline import train_all

    configs = [str(CONFIGS[0].parent / f"{c}_all.yaml") for c in ("sprinter_lam1.5", "specdecpp_d3_w6")]
    results = train_all.main(["--labels", str(tiny_labels), "--configs", *configs, "--out", str(tmp_path / "train"),
                              "--checkpoints", str(tmp_path / "ckpt"), "--heads_dir", str(tmp_path / "heads"),
                              "--max_epochs", "1", "--quiet"])
    draft = read_manifest(tiny_labels)["models"]["draft"]
    for r in results:
        head, meta = load_head(r.export, draft=draft)
        assert list(meta["inputs"]["vectors"]) == ["layers", "stale_target"]
        assert "stale_top1_target" in meta["inputs"]["scores"]
        assert head.config["extra_size"] == 2 * 32 + 32  # two tapped draft layers, the tiny target's hidden state
        interval = r.intervals["auroc"]
        assert interval.low <= interval.value <= interval.high
        with pytest.raises(HeadFileError, match="round_index"):
            ExportedHead(r.export)
    assert "ΔAUROC 95% CI" in (tmp_path / "train" / "metrics.txt").read_text()


def test_a_head_asking_for_a_vector_the_labels_lack_is_refused(tiny_labels):
    with pytest.raises(SettingError, match="unknown vector feature"):
        LabelDataModule(labels=str(tiny_labels), vectors=["target_logits"])


def test_train_share_takes_nested_prompt_subsets(tiny_labels):
    """A share trains on whole prompts, the same ones for a seed, a smaller share's inside a larger one's; val and
    test keep every prompt."""
    shares = [LabelDataModule(str(tiny_labels), label="soft", train_share=s) for s in (0.25, 0.5, 1.0)]
    prompts = [set(dm.rows("train").prompt_ids.tolist()) for dm in shares]
    assert prompts[0] < prompts[1] < prompts[2] and len(prompts[0]) >= 1
    assert len(prompts[1]) == -(-len(prompts[2]) // 2)
    every = shares[2].rows("train")
    some = shares[0].rows("train")
    assert len(some) == np.isin(every.prompt_id.numpy(), list(prompts[0])).sum()  # all rows of the chosen prompts
    assert len(shares[0].rows("val")) == len(shares[2].rows("val"))
    again = LabelDataModule(str(tiny_labels), label="soft", train_share=0.25)
    assert set(again.rows("train").prompt_ids.tolist()) == prompts[0]
    with pytest.raises(SettingError, match="train_share must be in"):
        LabelDataModule(str(tiny_labels), train_share=0)


def test_test_labels_of_another_folder_are_the_test_set(tiny_labels, tmp_path):
    """``test_labels`` reads the test split of another folder (held-out prompts) of the same pair, and refuses one
    of another draft or target."""
    import json
    import shutil

    other = tmp_path / "heldout"
    shutil.copytree(tiny_labels, other)
    dm = LabelDataModule(str(tiny_labels), label="soft", test_labels=str(other))
    assert dm.folder("test") == str(other) and dm.folder("train") == str(tiny_labels)
    assert len(dm.rows("test")) == len(LabelDataModule(str(tiny_labels), label="soft").rows("test"))
    original = (other / "manifest.json").read_text()
    for role in ("draft", "target"):  # features of another draft, or acceptance against another target
        manifest = json.loads(original)
        manifest["models"][role]["weights"] = "0" * 64
        (other / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(SettingError, match=f"another {role} than"):
            LabelDataModule(str(tiny_labels), label="soft", test_labels=str(other))


def test_an_exported_head_records_the_prompts_it_saw(tiny_labels, tmp_path):
    """train + val prompts (by the digest of their token ids), and only the trained share of train."""
    from core.identity import prompt_digest
    from core.shards import load_sequences
    from heads.export import load_head, seen_prompts
    from pipeline import train_all

    results = train_all.main(["--labels", str(tiny_labels), "--configs", str(CONFIGS[0].parent / "specdecpp_d3_w6.yaml"),
                              "--out", str(tmp_path / "train"), "--checkpoints", str(tmp_path / "ckpt"),
                              "--heads_dir", str(tmp_path / "heads"), "--max_epochs", "1", "--quiet",
                              "--train_share", "0.5"])
    _, meta = load_head(results[0].export)
    digests = {s: {int(r["prompt_id"]): prompt_digest(r["prompt_ids"]) for r in load_sequences(tiny_labels, s)}
               for s in ("train", "val", "test")}
    seen = seen_prompts(meta)
    dm = LabelDataModule(str(tiny_labels), label="soft", train_share=0.5)
    trained = dm.rows("train").prompt_ids  # the prompts of its rows; and every val prompt (its threshold's traces)
    assert seen == {digests["train"][int(p)] for p in trained} | set(digests["val"].values())
    assert len(seen) == meta["trained_on"]["prompts"] == len(trained) + len(digests["val"])
    assert not set(digests["test"].values()) & seen


def test_a_heads_folder_of_another_draft_is_refused_before_training(tiny_labels, tmp_path):
    """Two runs into one heads folder: the second, on labels of another draft, stops in one line before it trains
    (its heads would sit beside the first's, one folder of two drafts); on labels of the same draft it runs."""
    import shutil

    from pipeline import train_all

    argv = ["--configs", str(CONFIGS[0].parent / "sprinter_lam1.yaml"), "--out", str(tmp_path / "train"),
            "--checkpoints", str(tmp_path / "ckpt"), "--heads_dir", str(tmp_path / "heads"), "--max_epochs", "1",
            "--quiet"]
    train_all.main(["--labels", str(tiny_labels), *argv])
    other = tmp_path / "other-labels"
    shutil.copytree(tiny_labels, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["models"]["draft"] = {**manifest["models"]["draft"], "name": "another-draft", "weights": "0" * 64}
    (other / "manifest.json").write_text(json.dumps(manifest))
    before = sorted(p.stat().st_mtime_ns for p in (tmp_path / "heads").iterdir())
    with pytest.raises(SettingError, match="holds heads of another draft than .*another folder"):
        train_all.main(["--labels", str(other), *argv])
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "heads").iterdir()) == before
    (tmp_path / "heads" / "notes.safetensors").write_text("mine")
    with pytest.raises(SettingError, match="notes.safetensors, which no `specheads train` wrote"):
        train_all.main(["--labels", str(tiny_labels), *argv])
    (tmp_path / "heads" / "notes.safetensors").unlink()
    assert train_all.main(["--labels", str(tiny_labels), *argv])[0].export is not None


def test_learning_curve_trains_shares_and_judges_on_held_out_prompts(tiny_labels, tmp_path):
    """Every config at every share (shares: test_train_share_takes_nested_prompt_subsets), judged on the test split (prompts no head saw); a stop head's speedups beside
    the training-free rules' at each cost; the plot is written. A head that saw a test prompt is refused."""
    from pipeline import learning_curve
    from heads.export import HeadFileError, check_unseen, read_metadata

    configs = [str(CONFIGS[0].parent / c) for c in ("specdecpp_d3_w6.yaml", "sprinter_lam1.5.yaml")]
    points = learning_curve.main(["--labels", str(tiny_labels), "--test_labels", str(tiny_labels), "--configs",
                                  *configs, "--shares", "1", "--costs", "0.1", "--out", str(tmp_path / "c"),
                                  "--max_epochs", "1", "--quiet"])
    assert [(p.share, p.run.name) for p in points] == [(1.0, "specdecpp_d3_w6"), (1.0, "sprinter_lam1.5")]
    stop = points[0].speedups["c=0.1"]
    assert set(stop) >= {"specdecpp", "confidence", "svip", "sd", "oracle_share"} and 0 < stop["oracle_share"] <= 1
    assert not points[1].speedups  # a verifier has no stop rule to simulate
    text = (tmp_path / "c" / "curve.txt").read_text()
    assert (tmp_path / "c" / "curve.png").stat().st_size > 0 and "ΔAUROC" in text and "isotonic q(Y_i)" in text
    from core.shards import prompt_digests

    seen = prompt_digests(tiny_labels, "val")
    with pytest.raises(HeadFileError, match=r"trained on \d+ of the"):
        check_unseen(read_metadata(points[0].run.export), seen, "the val split")

    # curves run apart join into one table and plot, even compared at other costs; the estimates' ECE is recomputed
    curve = json.loads((tmp_path / "c" / "curve.json").read_text())
    assert curve["inputs"]["labels"] == str(tiny_labels) and len(curve["inputs"]["labels_manifest_sha256"]) == 64
    for p in curve["points"]:
        p["share"] = 0.5
        p["speedups"] = {"c=0.2": s for s in p["speedups"].values()}
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "curve.json").write_text(json.dumps(curve))
    merge = ["--merge", str(tmp_path / "c"), str(tmp_path / "half"), "--out"]
    merged = learning_curve.main([*merge, str(tmp_path / "m")])
    assert [(p.run.name, p.share) for p in merged] == [("specdecpp_d3_w6", 0.5), ("specdecpp_d3_w6", 1.0),
                                                       ("sprinter_lam1.5", 0.5), ("sprinter_lam1.5", 1.0)]
    assert merged[1].speedups["c=0.1"] == pytest.approx(stop) and set(merged[0].speedups) == {"c=0.2"}
    joined = json.loads((tmp_path / "m" / "curve.json").read_text())
    assert joined["estimate_ece"] == pytest.approx(curve["estimate_ece"]) and len(joined["merged_from"]) == 2
    text = (tmp_path / "m" / "curve.txt").read_text()
    assert text.count("specdecpp_d3_w6") == 2 and "c=0.1" in text and "c=0.2" in text
    assert (tmp_path / "m" / "curve.png").stat().st_size > 0
    assert learning_curve.main([*merge, str(tmp_path / "m")])  # a joined curve may be written again
    for argv, message in ((["--merge", str(tmp_path / "c"), str(tmp_path / "c") + "/", "--out", str(tmp_path / "x")],
                           "given twice"),
                          ([*merge, str(tmp_path / "c")], "one of the curves being joined"),
                          (["--merge", str(tmp_path / "half"), "--out", str(tmp_path / "c")], "no join wrote"),
                          (merge[:-1], "--merge needs --out"),
                          ([*merge, str(tmp_path / "x"), "--labels", str(tiny_labels)], "drop --labels"),
                          (["--merge", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")], "no curve.json in")):
        with pytest.raises(SettingError, match=message):
            learning_curve.main(argv)
    for key, message in (("test_labels_manifest_sha256", "was judged on"), ("labels_manifest_sha256", "was trained on"),
                         ("timing_sha256", "was timed on")):
        other = json.loads(json.dumps(curve))
        other["inputs"][key] = "0" * 64
        (tmp_path / "half" / "curve.json").write_text(json.dumps(other))
        with pytest.raises(SettingError, match=message):
            learning_curve.main([*merge, str(tmp_path / "x")])
    # labels redone in place since the curves were made: their digests no longer name what the heads trained on
    import core.shards

    real = core.shards.manifest_sha256
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core.shards, "manifest_sha256", lambda folder: "f" * 64)
        with pytest.raises(SettingError, match="labeled again since"):
            learning_curve.main(["--merge", str(tmp_path / "c"), "--out", str(tmp_path / "x")])
    assert core.shards.manifest_sha256 is real
    del curve["inputs"]
    (tmp_path / "half" / "curve.json").write_text(json.dumps(curve))
    with pytest.raises(SettingError, match="does not record the labels"):
        learning_curve.main(["--merge", str(tmp_path / "half"), "--out", str(tmp_path / "x")])


def test_training_and_curve_outputs_refuse_a_folder_they_did_not_write(tiny_labels, tmp_path):
    """``--out`` holding a user's files (one under a name the command writes, or any other) is refused before
    training, in one line, and left as it was; a folder the command wrote is its own to write again."""
    from pipeline import learning_curve, train_all

    for folder, name in (("train", "metrics.txt"), ("curve", "curve.txt"), ("other", "notes.txt")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text("mine")
    argv = ["--labels", str(tiny_labels), "--configs", str(CONFIGS[0].parent / "sprinter_lam1.yaml"),
            "--checkpoints", str(tmp_path / "ckpt"), "--max_epochs", "1", "--quiet"]
    for out in ("train", "other"):
        with pytest.raises(SettingError, match="is not empty .* and no `specheads train` wrote it"):
            train_all.main([*argv, "--out", str(tmp_path / out), "--heads_dir", str(tmp_path / "heads")])
    with pytest.raises(SettingError, match="no `specheads curve` wrote it"):
        learning_curve.main(["--labels", str(tiny_labels), "--test_labels", str(tiny_labels), "--out",
                             str(tmp_path / "curve"), "--max_epochs", "1", "--quiet", "--shares", "1.0"])
    assert [(tmp_path / f / n).read_text() for f, n in (("train", "metrics.txt"), ("curve", "curve.txt"))] == \
        ["mine", "mine"]
    for _ in range(2):  # the command's own folder, written again
        train_all.main([*argv, "--out", str(tmp_path / "own"), "--heads_dir", str(tmp_path / "heads")])
    ledger = tmp_path / "own" / ".specheads-files"
    ledger.write_text(ledger.read_text().replace("train\tmetrics.txt\n", ""))  # metrics.txt: no longer the run's
    with pytest.raises(SettingError, match="holds metrics.txt, .*which no `specheads train` wrote"):
        train_all.main([*argv, "--out", str(tmp_path / "own"), "--heads_dir", str(tmp_path / "heads")])
