"""A labeling run's finished batches as a dataset of their own (``data_gen.snapshot``), and the order a run labels
its batches in, which makes those batches a sample of the whole run."""

import pytest

from core import shards
from data_gen import snapshot as snap_module
from data_gen.batches import labeling_order
from data_gen.errors import LabelingInterrupted
from data_gen.record import PAIR_FILE
from data_gen.run import run_labels
from data_gen.snapshot import main as snapshot_main

# what a snapshot's manifest may hold that the finished run's does not
OWN_KEYS = {"created", "seconds", "splits", "shards", "snapshot", "prompts"}


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


def _interrupt_after(n: int):
    import pytorch_lightning as pl

    class CtrlC(pl.Callback):
        def on_predict_batch_end(self, trainer, *args, **kwargs):
            if trainer.predict_loop.batch_progress.current.completed >= n:
                raise KeyboardInterrupt

    return CtrlC()


@pytest.fixture
def unfinished(label_config, tmp_path):
    """(config, folder) of a run of the tiny pair stopped after 6 of its batches."""
    cfg = label_config(categories=["target"], batch_size=2)
    with pytest.raises(LabelingInterrupted):
        run_labels(cfg, callbacks=[_interrupt_after(6)], quiet=True)
    return cfg, tmp_path / "labels"


def test_snapshot_of_an_unfinished_run_is_the_dataset_the_run_writes_for_those_batches(unfinished, tmp_path, capsys):
    cfg, run = unfinished
    snap = tmp_path / "snap"
    # a batch still being written (its shard's record missing) is not finished: left out, and left alone
    in_flight = sorted(run.glob("train/*.arrow"))[-1]
    record = in_flight.with_name(in_flight.name + ".json")
    record.rename(record.with_name("held"))
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert snapshot_main([str(run), str(snap)]) == 0
    assert "snapshot of" in capsys.readouterr().out
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # the run's folder is only read
    manifest = shards.read_manifest(snap)
    done = len(list(run.glob("*/*.arrow"))) - 1
    assert manifest["snapshot"]["batches"][0] == done and not (snap / in_flight.relative_to(run)).exists()
    assert manifest["snapshot"]["first_of_order"] is False  # one of the first batches is missing
    assert all(n > 0 for n, _ in manifest["snapshot"]["splits"].values())  # spread over the splits
    record.with_name("held").rename(record)
    in_flight.unlink()  # redone by the resume
    full = run_labels(cfg, quiet=True)
    assert set(manifest["shards"]) < set(full["shards"])
    for key, rec in manifest["shards"].items():
        assert full["shards"][key]["sha256"] == rec["sha256"]
    assert {k: v for k, v in manifest.items() if k not in OWN_KEYS} == {k: v for k, v in full.items()
                                                                         if k not in OWN_KEYS}
    assert manifest["prompts"]["count"] == manifest["snapshot"]["prompts"][0] < full["prompts"]["count"]
    assert {**manifest["prompts"], "count": None} == {**full["prompts"], "count": None}


def test_snapshot_reads_the_pair_the_run_loaded_and_refuses_a_run_without_that_record(
        unfinished, tmp_path, monkeypatch):
    import data_gen.run

    _, run = unfinished

    def no_loading(cfg):
        raise AssertionError("the snapshot loaded the models")

    monkeypatch.setattr(data_gen.run, "load_pair", no_loading)
    snap_module.snapshot(run, tmp_path / "a", quiet=True)
    # a run whose pair.json is another run's, or that has none: refused in one line
    pair = run / PAIR_FILE
    pair.write_text(pair.read_text().replace('"run": {', '"run": {"other": 1, ', 1))
    with pytest.raises(snap_module.SnapshotError, match="holds no pair.json of its run"):
        snap_module.snapshot(run, tmp_path / "b", quiet=True)
    pair.unlink()
    with pytest.raises(snap_module.SnapshotError, match="label it again"):
        snap_module.snapshot(run, tmp_path / "c", quiet=True)


def test_snapshot_interrupted_leaves_nothing_and_runs_again(unfinished, tmp_path, monkeypatch, capsys):
    _, run = unfinished
    snap = tmp_path / "snap"
    link = snap_module._link_or_copy
    calls = []

    def stop_after_five(src, dst):
        calls.append(dst)
        if len(calls) > 5:
            raise KeyboardInterrupt
        link(src, dst)

    monkeypatch.setattr(snap_module, "_link_or_copy", stop_after_five)
    assert snapshot_main([str(run), str(snap)]) == 130
    assert _one_line(capsys).startswith("interrupted: stopped by Ctrl-C")
    assert not snap.exists()
    monkeypatch.setattr(snap_module, "_link_or_copy", link)
    assert snapshot_main([str(run), str(snap)]) == 0
    shards.read_manifest(snap)
    # a Ctrl-C once the snapshot is written (while its summary prints) keeps it, and says so
    import data_gen.run

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(data_gen.run, "print_summary", interrupt)
    assert snapshot_main([str(run), str(tmp_path / "snap2")]) == 130
    assert _one_line(capsys).endswith("holds the whole snapshot")
    shards.read_manifest(tmp_path / "snap2")


def _one_line(capsys) -> str:
    """The message a command ended with, after the models' loading bars (if it got that far), and no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_snapshot_refuses_in_one_line(label_config, tmp_path, capsys):
    run, snap = tmp_path / "labels", tmp_path / "snap"
    assert snapshot_main([str(tmp_path / "nothing"), str(snap)]) == 2
    assert "holds no labeling run" in _one_line(capsys)
    with pytest.raises(LabelingInterrupted):  # the first batches of the order are all train: no val yet
        run_labels(label_config(categories=["target"], batch_size=2), callbacks=[_interrupt_after(1)], quiet=True)
    assert snapshot_main([str(run), str(snap)]) == 2
    assert "no finished batch of test, val yet" in _one_line(capsys)
    (snap / "notes").mkdir(parents=True)
    assert snapshot_main([str(run), str(snap)]) == 2
    assert "not empty" in _one_line(capsys)
    (tmp_path / "file").write_text("")
    assert snapshot_main([str(run), str(tmp_path / "file")]) == 2
    assert "is a file" in _one_line(capsys)
    assert snapshot_main([str(run), str(run / "snap")]) == 2
    assert "inside the run's folder" in _one_line(capsys)
    run_labels(label_config(categories=["target"], batch_size=2), quiet=True)
    assert snapshot_main([str(run), str(tmp_path / "snap2")]) == 2
    assert "finished dataset" in _one_line(capsys)
    assert list(snap.iterdir()) == [snap / "notes"] and not (tmp_path / "snap2").exists()
