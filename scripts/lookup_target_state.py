"""Does the target's own hidden state tell prompt lookup's goodput stop where a copy breaks? An offline measurement.

Prompt lookup's stop (``decoding.lookup_stop``) reads one feature, the match's length, mapped to a keep chance by
isotonic regression. A stop rule also holds, for free, the target's last hidden state (after the final norm) and its
top-1 probability at the round's start: the state that produced the token the last verification ended on. This
script asks whether a learned estimate that reads them does better:

1. it reads the target's state at every position of the traces' responses with llama.cpp (one batched read per
   prompt, the file as shipped);
2. it builds the stop's rows along each response (every round start after the first token with a proposal, each
   candidate up to the first the target does not keep, the proposal cut to the tokens left as the replay cuts it),
   with features: the round start's state, projected on the train rows' first ``--components`` principal
   components, its top-1 probability, the candidate's match length and its index in the round (a round at the
   response's first token holds no state of the target's: there every estimate is the calibration);
3. it fits a logistic regression per inverse regularisation strength ``C`` on the train split, and, with
   ``--head_depths``, trains the project's SpecDec++ acceptance head (``heads.resnet.ResNetHead`` of each depth given,
   through ``pipeline.module.HeadModule``: Lightning, the weighted BCE on the keep indicator, the best epoch on the
   val split's loss) on the round start's whole state and the same scalars; it prints each estimate's AUROC on the
   val split and the held-out traces beside the calibration's (match length alone);
4. it replays the goodput stop along the held-out traces with each estimate's chances instead of the calibration's,
   λ of each the best of ``decoding.replay.LOOKUP_RATE_GRID`` on the val traces (which no fit read; a head chose
   its epoch on them, so its val AUROC is not a held-out one), priced at
   ``--timing``, with bootstrap intervals over the prompts (``evaluation.simulate_lookup.priced_interval``), beside
   the fixed length and the oracle.

    python -m scripts.lookup_target_state --labels runs/labels/edits-llama --heldout runs/labels/edits-heldout-llama \\
        --calibration checkpoints/lookup-calibration.json --timing runs/bench/timing-llama_cpp-2t.json

The target is the one the labels' record names, read from its GGUF file as shipped.

Greedy traces only (the keep indicator of a sampled trace is a draw of p(y), which a fit would read as well, but
the stop's chance was calibrated on greedy ones). Results: ``docs/results.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from core.errors import UserError
from core.identity import identity_mismatch
from core.interrupt import run_main
from core.models import gguf_file, recorded_model
from core.runfolder import read_json
from core.shards import read_manifest
from decoding import rules
from decoding.costs import read_timing
from decoding.lookup_stop import LookupCalibration, best_length
from decoding.replay import (LOOKUP_RATE_GRID, Counts, LookupTrace, prompt_lookup_counts,
                             prompt_lookup_oracle_counts)
from decoding.traces import responses_by_prompt
from evaluation.simulate_lookup import priced_interval, total


class Response:
    """One trace: its prompt and response ids, the target's state (T, d) and top-1 probability (T,) that produced
    each response token, and its ``LookupTrace``."""

    def __init__(self, prompt: list[int], response: list[int], target, n: int, m: int, max_new: int):
        self.prompt, self.response = prompt, response
        target.reset()
        hidden, logits = target.read(prompt + response[:-1], rows=len(response))
        self.hidden = hidden.float().numpy()
        self.top1 = torch.softmax(logits.float(), -1).max(-1).values.numpy()
        self.top_token = logits.argmax(-1).numpy()
        """The target's top token at each response position: along a greedy trace, the response itself."""
        self.trace = LookupTrace(prompt, response, n, m, max_new)
        self.projected: np.ndarray | None = None
        """``hidden`` on the principal components, once they are fitted."""

    @staticmethod
    def start_row(s: int) -> int:
        """The row of the state a stop rule holds at round start ``s`` ≥ 1: the one that produced response token
        s − 1 (at s = 0 the target has read the prompt but produced nothing the stop sees)."""
        return s - 1

    def start_state(self, s: int) -> tuple[np.ndarray, float]:
        """The state (and its top-1 probability) a stop rule holds at round start ``s`` ≥ 1."""
        return self.hidden[self.start_row(s)], float(self.top1[self.start_row(s)])


def scalars(length: np.ndarray, index: np.ndarray, top1: float) -> np.ndarray:
    return np.stack([np.log(length), np.log1p(index), np.full(len(index), top1)], axis=1)


def rows(responses: list[Response]) -> tuple[np.ndarray, ...]:
    """The stop's rows: (where each round-start state lies in the responses' ``hidden`` stacked in order, scalars,
    match lengths, kept, the response each is of). A round's candidates share one state, which is not copied."""
    states, other, lengths, kept, of = [], [], [], [], []
    start = 0
    for i, r in enumerate(responses):
        for s in range(1, len(r.response)):
            seq, source, proposal, k = r.trace.at(s)
            if not proposal:
                continue
            j = np.arange(min(k + 1, len(proposal), len(r.response) - s))
            length = np.minimum(rules.match_length(seq, source) + j, rules.MATCH_CAP)
            states.append(np.full(len(j), start + r.start_row(s)))
            other.append(scalars(length, j, r.top1[r.start_row(s)]))
            lengths.append(length)
            kept.append(j < k)
            of.append(np.full(len(j), i))
        start += len(r.hidden)
    if not kept or len(set(np.concatenate(kept).tolist())) < 2:
        raise UserError("the traces give too few prompt-lookup rows to fit and score (every split needs candidates "
                        "kept and rejected): label more edit requests")
    return tuple(np.concatenate(c) for c in (states, other, lengths, kept, of))


class StopRows(torch.utils.data.Dataset):
    """A split's stop rows as a head reads them, a batch per list of indices: the round start's whole state with
    the row's scalars (standardized) appended, the keep indicator as its label."""

    def __init__(self, hidden: np.ndarray, state_of: np.ndarray, other: np.ndarray, kept: np.ndarray,
                 chance: np.ndarray):
        self.hidden, self.state_of = torch.from_numpy(hidden).float(), torch.from_numpy(state_of)
        self.other, self.kept = torch.from_numpy(other).float(), torch.from_numpy(kept).float()
        self.chance = torch.from_numpy(chance).float()
        self.width = self.hidden.shape[1] + self.other.shape[1]

    def __len__(self) -> int:
        return len(self.kept)

    def __getitem__(self, idx) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(idx)
        kept = self.kept[idx]
        # HeadModule's metrics also rank two training-free baselines by these names: the calibration's chance here
        return {"hidden": torch.cat([self.hidden[self.state_of[idx]], self.other[idx]], -1), "target": kept,
                "binary": kept, "ratio": torch.where(kept > 0, 1.0, torch.inf), "p_draft": self.chance[idx],
                "conf_entropy": self.chance[idx]}


def batches(rows: StopRows, shuffle: bool, size: int = 1024):
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

    order = RandomSampler(rows, generator=torch.Generator().manual_seed(0)) if shuffle else SequentialSampler(rows)
    return DataLoader(rows, batch_size=None, sampler=BatchSampler(order, size, drop_last=False))


def train_head(depth: int, train: StopRows, val: StopRows, epochs: int, w_rej: float, lr: float):
    """A SpecDec++ acceptance head of ``depth`` trained by ``HeadModule`` on ``train``, at its epoch of least val
    loss."""
    import tempfile

    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    from heads.resnet import ResNetHead
    from pipeline.module import HeadModule

    torch.manual_seed(0)
    module = HeadModule(ResNetHead(hidden_size=train.width, depth=depth), w_rej=w_rej, lr=lr)
    with tempfile.TemporaryDirectory() as kept:
        best = ModelCheckpoint(dirpath=kept, monitor="val/loss", save_weights_only=True)
        trainer = pl.Trainer(max_epochs=epochs, callbacks=[EarlyStopping("val/loss", patience=2), best],
                             logger=False, enable_model_summary=False, accelerator="cpu", default_root_dir=kept)
        trainer.fit(module, batches(train, shuffle=True), batches(val, shuffle=False))
        module.load_state_dict(torch.load(best.best_model_path, weights_only=True)["state_dict"])
    return module.head.eval()


@torch.no_grad()
def head_chances(head, rows: StopRows) -> np.ndarray:
    return np.concatenate([torch.sigmoid(head(b["hidden"])).numpy() for b in batches(rows, shuffle=False)])


def held_out_auroc(kept: np.ndarray, prompt_of: np.ndarray, score: np.ndarray,
                   against: np.ndarray | None = None) -> str:
    """The AUROC of ``score`` with a bootstrap interval over the prompts, and its difference from ``against``'s."""
    from sklearn.metrics import roc_auc_score

    from core.intervals import grouped_interval

    def auroc(of: np.ndarray, x: np.ndarray) -> float:
        return roc_auc_score(kept[of], x[of]) if kept[of].min() != kept[of].max() else float("nan")

    shown = f"{grouped_interval(prompt_of, lambda of: auroc(of, score), resamples=499)}"
    if against is not None:
        diff = grouped_interval(prompt_of, lambda of: auroc(of, score) - auroc(of, against), resamples=499)
        shown += f" ({diff.value:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}] over the calibration's)"
    return shown


def replay(responses: list[Response], chances: Callable, verify: np.ndarray, forward_rate: float, n: int, m: int,
           max_new: int) -> list[Counts]:
    out = []
    for r in responses:
        def length(seq, source, proposal, r=r):
            return best_length(chances(r, seq, source, proposal), verify, forward_rate)
        out.append(prompt_lookup_counts(r.prompt, r.response, n, m, max_new, length=length, trace=r.trace))
    return out


def main(argv: list[str] | None = None) -> None:
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    from core.llama_cpp import LlamaCppModel

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", required=True, help="label folder of greedy traces with train and val splits")
    ap.add_argument("--heldout", required=True, help="label folder of the held-out greedy traces (test split)")
    ap.add_argument("--calibration", required=True,
                    help="the stop's calibration (`specheads calibrate --prompt_lookup`)")
    ap.add_argument("--timing", required=True, help="the device's costs (`specheads bench-timing`)")
    ap.add_argument("--m", type=int, default=None,
                    help="the longest copy proposed (default: the calibration's, else 48)")
    ap.add_argument("--components", type=int, nargs="+", default=[0, 8, 64],
                    help="principal components of the state each fit reads (0: the scalars alone)")
    ap.add_argument("--C", type=float, nargs="+", default=[0.01, 1.0], help="inverse regularisation strengths")
    ap.add_argument("--head_depths", type=int, nargs="*", default=[],
                    help="depths of SpecDec++ heads to train on the whole state (none: the fits alone)")
    ap.add_argument("--epochs", type=int, default=20, help="most epochs a head trains (it stops when val loss rises)")
    ap.add_argument("--w_rej", type=float, default=1.0, help="a head's weight of the reject term")
    ap.add_argument("--lr", type=float, default=1e-3, help="a head's learning rate")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    calibration = LookupCalibration.load(args.calibration)
    n, m = calibration.n, args.m or calibration.m
    manifests = {folder: read_manifest(folder) for folder in (args.labels, args.heldout)}
    for folder, manifest in manifests.items():
        if manifest["sampling"]["temperature"] != 0:
            raise UserError(f"{folder}: sampled traces; this measurement reads greedy ones (a copy kept iff the "
                            "target's top token is the copied one)")
    differs = identity_mismatch(manifests[args.labels]["models"]["target"],
                                manifests[args.heldout]["models"]["target"])
    if differs is not None:
        raise UserError(f"--heldout {args.heldout} was labeled with another target than --labels {args.labels} "
                        f"({differs[0]})")
    path, _ = gguf_file(recorded_model(read_json(Path(args.labels) / "run.json", "label the folder again"), "target"))
    target = LlamaCppModel(path, threads=args.threads, n_ctx=4096)
    splits = {"train": (args.labels, "train"), "val": (args.labels, "val"), "test": (args.heldout, "test")}
    data: dict[str, list[Response]] = {}
    for split, (folder, name) in splits.items():
        traces = responses_by_prompt(folder, (name,))
        max_new = manifests[folder]["sampling"]["max_new_tokens"]
        data[split] = [Response(p, x, target, n, m, max_new)
                       for p, x in tqdm(traces.values(), desc=f"target states, {split}")]
    table = {split: rows(rs) for split, rs in data.items()}
    costs = read_timing(args.timing)
    verify = costs.verify_table(m + 1)

    print("rows (keep rate): " + ", ".join(f"{s} {len(t[3])} ({t[3].mean():.4f})" for s, t in table.items()))
    print("AUROC of the candidate's keep, val / held-out:")
    iso = {s: calibration.keep_chance(table[s][2]) for s in ("val", "test")}
    kept, prompt_of = table["test"][3], table["test"][4]
    print(f"  calibration (match length): {roc_auc_score(table['val'][3], iso['val']):.4f} / "
          f"{held_out_auroc(kept, prompt_of, iso['test'])}")
    # each response position's state projected once; a row reads its round start's
    hidden = {split: np.concatenate([r.hidden for r in rs]) for split, rs in data.items()}
    state_of = {split: t[0] for split, t in table.items()}  # a row's state in ``hidden``, before projection
    wide = max(args.components)  # its solver is randomized: seeded, so a rerun gives the same components
    pca = PCA(wide, random_state=0).fit(hidden["train"][table["train"][0][::5]]) if wide else None
    for split, rs in data.items():
        projected = pca.transform(hidden[split]) if pca is not None else hidden[split][:, :0]
        for r, part in zip(rs, np.split(projected, np.cumsum([len(r.hidden) for r in rs])[:-1])):
            r.projected = part
        table[split] = (projected[table[split][0]], *table[split][1:])

    def features(projected: np.ndarray, other: np.ndarray, k: int) -> np.ndarray:
        return np.hstack([projected[:, :k], other])

    fits = {}
    for k in args.components:
        train = features(table["train"][0], table["train"][1], k)
        scaler = StandardScaler().fit(train)
        for c in args.C:
            fit = LogisticRegression(C=c, max_iter=2000).fit(scaler.transform(train), table["train"][3])
            score = {s: fit.predict_proba(scaler.transform(features(table[s][0], table[s][1], k)))[:, 1]
                     for s in ("val", "test")}
            print(f"  target state on {k:>3} components, C {c:g}: {roc_auc_score(table['val'][3], score['val']):.4f}"
                  f" / {held_out_auroc(kept, prompt_of, score['test'], iso['test'])}")
            fits[f"target state, {k} components, C {c:g}"] = (k, scaler, fit)

    heads = {}
    if args.head_depths:
        scaler = StandardScaler().fit(table["train"][1])
        stop_rows = {s: StopRows(hidden[s], state_of[s], scaler.transform(table[s][1]), table[s][3],
                                 calibration.keep_chance(table[s][2])) for s in data}
        for depth in args.head_depths:
            head = train_head(depth, stop_rows["train"], stop_rows["val"], args.epochs, args.w_rej, args.lr)
            score = {s: head_chances(head, stop_rows[s]) for s in ("val", "test")}
            print(f"  SpecDec++ head, depth {depth}, whole state: {roc_auc_score(table['val'][3], score['val']):.4f}"
                  f" / {held_out_auroc(kept, prompt_of, score['test'], iso['test'])}")
            heads[f"SpecDec++ head, depth {depth}"] = (head, scaler)

    def calibrated(r, seq, source, proposal):
        return calibration.chances(rules.match_length(seq, source), len(proposal))

    def round_features(r, seq, source, proposal) -> tuple[int, np.ndarray] | None:
        """The round's state row and each candidate's scalars; None at the response's first token (no state)."""
        s = len(seq) - len(r.prompt)
        if s == 0:
            return None
        j = np.arange(len(proposal))
        row = r.start_row(s)
        return row, scalars(np.minimum(rules.match_length(seq, source) + j, rules.MATCH_CAP), j, r.top1[row])

    def learned(k, scaler, fit):
        def chances(r, seq, source, proposal):
            at = round_features(r, seq, source, proposal)
            if at is None:
                return calibrated(r, seq, source, proposal)
            row, other = at
            x = features(np.repeat(r.projected[row][None], len(other), 0), other, k)
            return fit.predict_proba(scaler.transform(x))[:, 1]
        return chances

    def by_head(head, scaler):
        @torch.no_grad()
        def chances(r, seq, source, proposal):
            at = round_features(r, seq, source, proposal)
            if at is None:
                return calibrated(r, seq, source, proposal)
            row, other = at
            state = torch.from_numpy(r.hidden[row]).float().expand(len(other), -1)
            x = torch.cat([state, torch.from_numpy(scaler.transform(other)).float()], -1)
            return torch.sigmoid(head(x)).numpy()
        return chances

    max_new = manifests[args.heldout]["sampling"]["max_new_tokens"]
    fixed = [prompt_lookup_counts(r.prompt, r.response, n, m, max_new, trace=r.trace) for r in data["test"]]
    oracle = [prompt_lookup_oracle_counts(r.prompt, r.response, n, m, max_new, costs, trace=r.trace)
              for r in data["test"]]
    print(f"goodput stop on the held-out traces (n {n}, m {m}), × target-only [95 %] under {costs.name}:")
    print(f"  fixed length {priced_interval(fixed, costs)}, oracle {priced_interval(oracle, costs)}")
    val_new = manifests[args.labels]["sampling"]["max_new_tokens"]

    def stopped_by(chances: Callable) -> tuple[float, list[Counts]]:
        """λ, the best of the grid on the val traces (no fit read them), and the stop's counts on the held-out ones
        at that λ."""
        best = None
        for multiple in LOOKUP_RATE_GRID:
            rate = multiple * costs.target_only_rate()
            c = total(replay(data["val"], chances, verify, costs.forward_rate(rate), n, m, val_new))
            if best is None or c.n / costs.price(c) > best[0]:
                best = (c.n / costs.price(c), rate)
        return best[1], replay(data["test"], chances, verify, costs.forward_rate(best[1]), n, m, max_new)

    by_calibration = None
    for name, chances in {"calibration (match length)": calibrated,  # first: the others are priced over it
                          **{name: learned(*f) for name, f in fits.items()},
                          **{name: by_head(*h) for name, h in heads.items()}}.items():
        rate, stopped = stopped_by(chances)
        by_calibration = by_calibration or stopped
        print(f"  {name}: λ {rate:.1f}: {priced_interval(stopped, costs)}x target-only, "
              f"{priced_interval(stopped, costs, over=fixed)}x the fixed length's, "
              f"{priced_interval(stopped, costs, over=by_calibration)}x the calibration's")


if __name__ == "__main__":
    run_main(main)
