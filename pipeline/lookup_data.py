"""Prompt lookup's stop rows as a head reads them (``LabelDataModule(label="lookup")``).

A row is one candidate of a prompt-lookup proposal along a target response (``decoding.lookup_stop.lookup_rows``,
llama.cpp's ``ngram-simple`` rule at the data module's n and m): its label is whether the response repeats it (the
target keeps it, greedy), and a stop rule deciding on it holds, for free, the target's state that produced the token
the round starts after and that state's top-1 probability (stored by a labeling run of ``target_states: true``,
``data_gen/SCHEMA.md``), the candidate's match length and its index in the round. So the head's hidden input is the
target's state (the round's candidates share it; a round at the response's first token holds none: zeros, as the
decoder gives), and its scores read ``log_match_length``, ``round_index`` (the index from 1; 0 where no state is
held) and ``target_top1``.

The training-free baselines the metrics rank beside the head (``pipeline.metrics.BASELINES``, named for a draft's
rows) both hold the match length here: the one feature the calibrated stop reads (an isotonic map of it ranks as
it does, up to ties).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import SettingError
from core.shards import load_sequences, read_manifest
from decoding.costs import CostModel
from decoding.lookup_stop import LookupHead, LookupRows, lookup_rows
from decoding.replay import lookup_goodput_rate
from decoding.rules import MATCH_CAP
from decoding.traces import round_states


def state_width(manifest: dict, folder) -> int:
    """The width of the target states a label folder stores, or one ``SettingError`` saying how to store them."""
    width = manifest.get("feature", {}).get("target_states")
    if not width:
        raise SettingError(f"{folder}: the labels store no target states, which prompt lookup's stop rows read; label "
                           "with `target_states: true` in the labeling config")
    return int(width)


class LookupStopRows(Dataset):
    """The stop rows of one split's target responses; ``rows[idx_array]`` returns a batch as ``LabelRows`` does."""

    def __init__(self, folder, split: str, *, n: int, m: int, prompt_ids: np.ndarray | None = None):
        manifest = read_manifest(folder)
        width = state_width(manifest, folder)
        if manifest["response_source"] != "target":
            raise SettingError(f"{folder}: its responses are dataset answers, teacher-forced; prompt lookup's stop rows "
                               "read the target's own (label with `response_source: target`)")
        seqs = load_sequences(folder, split)
        if seqs is None or "target_hidden" not in seqs.column_names:
            raise SettingError(f"{folder}: the {split} split stores no target states; label with `target_states: "
                               "true`")
        states, top1, parts, of = [], [], [], []
        self.folder, self.split = folder, split
        self.responses: list[tuple[int, list[int], list[int]]] = []
        """Each response read: its prompt id, its prompt and the response."""
        start = 0
        for row in seqs.with_format("numpy"):
            response = row["response_ids"].tolist()
            if not len(row["target_top1"]) or (prompt_ids is not None and row["prompt_id"] not in prompt_ids):
                continue
            rows = lookup_rows(row["prompt_ids"].tolist(), response, n, m)
            parts.append(rows._replace(start=rows.start + start))  # a row's start, as a row of the stacked states
            of.append(np.full(len(rows.kept), row["prompt_id"]))
            states.append(row["target_hidden"].reshape(len(response), width))
            top1.append(row["target_top1"])
            self.responses.append((int(row["prompt_id"]), row["prompt_ids"].tolist(), response))
            start += len(response)
        rows = LookupRows.join(parts)
        if not len(rows.kept) or rows.kept.all() or not rows.kept.any():
            raise SettingError(f"{folder}: the {split} split gives {len(rows.kept)} prompt-lookup rows at n {n}, m "
                               f"{m}, kept and rejected both needed; label more edit requests (`specheads "
                               "edit-prompts`)")
        # the state a round starting at response index s holds is the one that produced token s − 1; none at s = 0
        first = np.cumsum([0] + [len(t) for t in top1])[:-1]
        held = ~np.isin(rows.start, first)
        self.state_of = torch.from_numpy(np.where(held, rows.start - 1, 0))
        self.held = torch.from_numpy(held)
        self.states = torch.from_numpy(np.concatenate(states))
        self.top1 = np.concatenate(top1)
        self.hidden_size = width
        kept = torch.from_numpy(rows.kept).float()
        self.columns = {"match_length": torch.from_numpy(rows.length).float(),
                        "round_index": torch.from_numpy(np.where(held, rows.place + 1, 0)).float(),
                        "target_top1": torch.from_numpy(self.top1[self.state_of.numpy()]).float() * self.held}
        self.target = self.binary = kept
        self.ratio = torch.where(kept > 0, 1.0, torch.inf)  # q/p of a copied token: 1 / p, p ∈ {0, 1} greedy
        self.baseline = self.columns["match_length"] / MATCH_CAP
        self.prompt_id = torch.from_numpy(np.concatenate(of))
        self.prompt_ids = np.unique(self.prompt_id.numpy())

    def __len__(self) -> int:
        return len(self.target)

    def __getitem__(self, pos: np.ndarray) -> dict[str, torch.Tensor]:
        pos = torch.from_numpy(np.sort(np.asarray(pos)))
        hidden = self.states[self.state_of[pos]].float() * self.held[pos].unsqueeze(-1)
        return {**{c: v[pos] for c, v in self.columns.items()}, "prompt_id": self.prompt_id[pos], "hidden": hidden,
                "target": self.target[pos], "weight": torch.ones(len(pos)), "binary": self.binary[pos],
                "ratio": self.ratio[pos], "p_draft": self.baseline[pos], "conf_entropy": self.baseline[pos]}


LOOKUP_HIDDEN = ("the target's last hidden state (after the final norm) that produced the token a prompt-lookup round "
                 "starts after; zeros before the target's first call")
"""What a prompt-lookup stop head's hidden input is, as its exported file says."""

LOOKUP_RULE = ("submit the L of a proposal's candidates that maximises E(L) − λ·verify(L + 1), the keep chances the "
               "head's (decoding.lookup_stop)")


def lookup_threshold(head: torch.nn.Module, rows: LookupStopRows, n: int, m: int, max_new_tokens: int,
                     costs: CostModel | None, timing_source: str | None) -> dict:
    """A prompt-lookup stop head's exported λ: the rate at which its goodput stop, replayed along the validation
    responses (``rows``) at the device costs of a timing file, decodes fastest
    (``decoding.replay.lookup_goodput_rate``); none without a timing file (the decoder then runs at target-only's
    rate unless given one)."""
    if costs is None:
        return {"name": "lam", "value": None, "rule": LOOKUP_RULE,
                "chosen_by": {"method": "none: no timing file (train with --timing)"}}
    states = round_states(rows.folder, (rows.split,))
    found = lookup_goodput_rate([(p, r) for _, p, r in rows.responses], n, m, max_new_tokens,
                                LookupHead(head, rows.hidden_size, n, m), costs,
                                [states[i] for i, _, _ in rows.responses])
    return {"name": "lam", "value": found["at"], "rule": LOOKUP_RULE,
            "chosen_by": {"method": "trace replay", "splits": ["val"], "responses": len(rows.responses),
                          "timing": timing_source, "speedup": found["rate"] / costs.target_only_rate()}}
