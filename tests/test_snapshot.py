"""A labeling run's finished batches as a dataset of their own (``data_gen.snapshot``), and the order a run labels
its batches in, which makes those batches a sample of the whole run."""

import pytest

from core import shards
from data_gen.run import labeling_order, run_labels
from data_gen.snapshot import main as snapshot_main
from data_gen.snapshot import SnapshotError, snapshot


def _batches(groups: dict[str, int]) -> list[dict]:
    return [{"key": f"{g}-{i:04d}"} for g, n in groups.items() for i in range(n)]


def test_labeling_order_spreads_every_prefix_over_splits_and_lengths():
    batches = _batches({"train/target": 169, "val/target": 19})
    order = [b["key"] for b in labeling_order(batches)]
    assert sorted(order) == sorted(b["key"] for b in batches) and order == [b["key"] for b in labeling_order(batches)]
    for n in (10, 40, 94):
        prefix = order[:n]
        val = sum(k.startswith("val/") for k in prefix)
        assert abs(val - n * 19 / 188) <= 1.5, (n, val)
        # a group's batches are longest first: a prefix reaches across the whole list, not its head
        train = sorted(int(k[-4:]) for k in prefix if k.startswith("train/"))
        assert max(b - a for a, b in zip([-1, *train], [*train, 169])) <= 2.5 * 169 / len(train), (n, train)
    # the order a plain run had (a group after another, each from its longest batch) fails the same check
    plain = [b["key"] for b in batches][:40]
    assert sum(k.startswith("val/") for k in plain) == 0


def _interrupt_after(n: int):
    import pytorch_lightning as pl

    class CtrlC(pl.Callback):
        def on_predict_batch_end(self, trainer, *args, **kwargs):
            if trainer.predict_loop.batch_progress.current.completed >= n:
                raise KeyboardInterrupt

    return CtrlC()


def test_snapshot_of_an_unfinished_run_is_a_dataset_of_its_finished_batches(label_config, tmp_path, capsys):
    from data_gen.run import LabelingInterrupted

    cfg = label_config(categories=["target"], batch_size=2)
    with pytest.raises(LabelingInterrupted):
        run_labels(cfg, callbacks=[_interrupt_after(6)], quiet=True)
    run, snap = tmp_path / "labels", tmp_path / "snap"
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert snapshot_main([str(run), str(snap)]) == 0
    assert "snapshot of" in capsys.readouterr().out
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # the run's folder is only read
    manifest = shards.read_manifest(snap)
    assert manifest["snapshot"]["batches"] == len(list(run.glob("*/*.arrow"))) < manifest["snapshot"]["of_batches"]
    assert {"train", "val", "test"} <= {k.split("/")[0] for k in manifest["shards"]}  # spread over the splits
    # the finished run's rows of those batches are the snapshot's
    full = run_labels(cfg, quiet=True)
    assert set(manifest["shards"]) < set(full["shards"])
    for key, rec in manifest["shards"].items():
        assert full["shards"][key]["sha256"] == rec["sha256"]
    assert manifest["settings_sha256"] == full["settings_sha256"] and manifest["models"] == full["models"]
    assert manifest["prompts"]["count"] == manifest["snapshot"]["prompts"] < full["prompts"]["count"]


def test_snapshot_refuses_in_one_line(label_config, tmp_path, capsys):
    from data_gen.run import LabelingInterrupted

    run, snap = tmp_path / "labels", tmp_path / "snap"
    with pytest.raises(SnapshotError, match="holds no labeling run"):
        snapshot(tmp_path / "nothing", snap)
    with pytest.raises(LabelingInterrupted):
        run_labels(label_config(), callbacks=[_interrupt_after(2)], quiet=True)
    (snap / "notes").mkdir(parents=True)
    with pytest.raises(SnapshotError, match="not empty"):
        snapshot(run, snap)
    with pytest.raises(SnapshotError, match="inside the run's folder"):
        snapshot(run, run / "snap")
    run_labels(label_config(), quiet=True)
    with pytest.raises(SnapshotError, match="finished dataset"):
        snapshot(run, tmp_path / "snap2")
    assert list(snap.iterdir()) == [snap / "notes"]
