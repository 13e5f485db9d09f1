"""Every stored number checked exactly on stub models with hand-written logits (see stubs.py)."""

import math

import pytest
import torch
from testing.stubs import StubLM, shift_table

from core.label_math import TOKEN_MIXED
from core.sampling import Sampling
from data_gen.labeler import Labeler, Prompt

V = 16
PAD, EOS = 0, 15  # EOS never has mass in these tables, so responses run to max_new_tokens


def labeler(q_probs, p_probs, **kw):
    kw.setdefault("sampling", Sampling(max_new_tokens=8))
    return Labeler(
        StubLM(shift_table(V, q_probs)), StubLM(shift_table(V, p_probs)),
        seed=0, eos_token_ids=[EOS], pad_token_id=PAD, **kw,
    )


def forced(category, response=(3, 4, 5, 6, 7, 8), prompt=(1, 2), pid=0):
    return Prompt(pid, list(prompt), category, list(response))


def one_hot(tokens) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.as_tensor(tokens).long(), V).float()


def check_one_hot_features(rows, prefix_last=None):
    """``hidden`` reads the row's own token; ``hidden_prev`` the last token of its prefix (when given)."""
    assert torch.equal(rows["hidden"].float(), one_hot(rows["token_id"]))
    if prefix_last is not None:
        assert torch.equal(rows["hidden_prev"].float(), one_hot(prefix_last))


def only(rows: dict, category: str) -> dict:
    keep = torch.tensor([c == category for c in rows["category"]])
    return {k: v[keep] if torch.is_tensor(v) else [c for c, m in zip(v, keep) if m] for k, v in rows.items()}


@pytest.mark.parametrize("category", ["target", "draft", "interleaved", "original"])
def test_all_accept_when_draft_equals_target(category):
    probs = {1: 0.5, 2: 0.5}
    rows = labeler(probs, probs).label([forced(category)], "cpu")
    assert rows["acceptance"].tolist() == [1.0] * len(rows["acceptance"])
    assert rows["ratio"].tolist() == [1.0] * len(rows["ratio"])
    assert rows["tv"].abs().max().item() < 1e-6
    check_one_hot_features(rows)


def test_none_accept_on_disjoint_supports():
    rows = only(labeler({1: 1.0}, {2: 1.0}).label([forced("target")], "cpu"), "target")
    assert rows["acceptance"].tolist() == [0.0] * 6
    assert all(math.isinf(r) for r in rows["ratio"].tolist())
    assert rows["tv"].tolist() == [1.0] * 6
    assert not rows["greedy_match"].any()


def test_partial_acceptance_numbers_in_the_clean_prefix():
    """q(prev+1) = q(prev+2) = 1/2, p(prev+1) = 1/4, p(prev+2) = 3/4: every number follows from the token."""
    rows = only(labeler({1: 0.5, 2: 0.5}, {1: 0.25, 2: 0.75}).label([forced("target")], "cpu"), "target")
    x = [3, 4, 5, 6, 7, 8]
    prev = [2] + x[:-1]  # the candidate at response index i reads the clean prefix X<i
    h_p = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    for i, tok in enumerate(rows["token_id"].tolist()):
        step = tok - prev[i]
        assert step in (1, 2)
        assert rows["position"][i].item() == 2 + i
        assert rows["logp_draft"][i].item() == pytest.approx(math.log(0.5), abs=1e-6)
        assert rows["logp_target"][i].item() == pytest.approx(math.log(0.25 if step == 1 else 0.75), abs=1e-6)
        assert rows["acceptance"][i].item() == pytest.approx(0.5 if step == 1 else 1.0, abs=1e-6)
        assert rows["ratio"][i].item() == pytest.approx(2.0 if step == 1 else 2 / 3, rel=1e-6)
    assert rows["entropy_draft"].tolist() == pytest.approx([math.log(2)] * 6, abs=1e-6)
    assert rows["entropy_target"].tolist() == pytest.approx([h_p] * 6, abs=1e-6)
    assert rows["tv"].tolist() == pytest.approx([0.25] * 6, abs=1e-6)
    assert rows["loss_mask"].all()
    check_one_hot_features(rows, prefix_last=prev)


def test_original_rows_sit_inside_the_prompt():
    prompt = (1, 2, 3, 4, 5)
    rows = labeler({1: 0.5, 2: 0.5}, {1: 0.25, 2: 0.75}).label([forced("original", prompt=prompt)], "cpu")
    assert rows["position"].tolist() == [1, 2, 3, 4]  # every prompt token after the first, context prompt<j
    for j, tok in zip(rows["position"].tolist(), rows["token_id"].tolist()):
        assert tok - prompt[j - 1] in (1, 2)
    assert set(rows["category"]) == {"original"}
    check_one_hot_features(rows, prefix_last=[prompt[j - 1] for j in rows["position"].tolist()])


P_STEP = {1: 0.25, 2: 0.75}


def check_label_context(rows, prefix_last):
    """Each row's target log-prob is p(step) with step = token − the last token of the prefix it was scored in."""
    for tok, prev, lp in zip(rows["token_id"].tolist(), prefix_last, rows["logp_target"].tolist()):
        assert math.exp(lp) == pytest.approx(P_STEP.get((tok - prev) % V, 0.0), abs=1e-6)


def test_token_mixed_rows_read_z_and_are_labeled_on_the_clean_prefix():
    """SpecDec++ rows: target tokens carry no loss; the feature reads Z<i and Z_i, the label the clean X<i."""
    x = list(range(3, 15))
    lab = labeler({1: 0.5, 2: 0.5}, P_STEP, sampling=Sampling(max_new_tokens=12), mixing_ratio=0.5)
    for category in ("target", "interleaved"):
        rows = only(lab.label([forced(category, response=x)], "cpu"), TOKEN_MIXED)
        z, mask = rows["token_id"].tolist(), rows["loss_mask"].tolist()
        assert 0 < sum(mask) < len(mask)
        assert all(tok == x[i] for i, (tok, m) in enumerate(zip(z, mask)) if not m)  # a target token: no loss
        check_label_context(rows, [2] + x[:-1])
        check_one_hot_features(rows, prefix_last=[2] + z[:-1])
        # the draft scores a head reads are q at Z<i (where its features read), the label's q at X<i
        q_at_z = [math.log(0.5) if (tok - prev) % V in (1, 2) else None for tok, prev in zip(z, [2] + z[:-1])]
        for got, want in zip(rows["read_logp_draft"].tolist(), q_at_z):
            assert want is None and got < -100 or got == pytest.approx(want, abs=1e-6)


def test_interleaved_candidates_are_drawn_and_labeled_at_the_mixed_prefix():
    """SPRINTER (d): at every position of Z (tokens of both models) a fresh candidate ~ q(·|Z<i), scored at Z<i."""
    x = list(range(3, 15))
    lab = labeler({1: 0.5, 2: 0.5}, P_STEP, sampling=Sampling(max_new_tokens=12), mixing_ratio=0.5)
    out = lab.label([forced("interleaved", response=x)], "cpu")
    z = only(out, TOKEN_MIXED)["token_id"].tolist()
    rows = only(out, "interleaved")
    assert set(out["category"]) == {"interleaved", TOKEN_MIXED}
    assert rows["loss_mask"].all() and rows["position"].tolist() == list(range(2, 14))
    prefix_last = [2] + z[:-1]
    assert all((c - prev) % V in (1, 2) for c, prev in zip(rows["token_id"].tolist(), prefix_last))
    assert rows["token_id"].tolist() != z  # fresh draws, not the mixed tokens themselves
    check_label_context(rows, prefix_last)
    check_one_hot_features(rows, prefix_last=prefix_last)


def test_draft_category_is_the_drafts_own_completion():
    """SPRINTER (b): the draft continues its own tokens (not the target's response), each labeled at Z<i."""
    rows = labeler({1: 0.5, 2: 0.5}, P_STEP).label([forced("draft")], "cpu")
    assert rows["loss_mask"].all() and set(rows["category"]) == {"draft"}
    z = rows["token_id"].tolist()
    prefix_last = [2] + z[:-1]
    assert all((tok - prev) % V in (1, 2) for tok, prev in zip(z, prefix_last))
    check_label_context(rows, prefix_last)
    check_one_hot_features(rows, prefix_last=prefix_last)


def test_sampled_response_stops_at_eos_and_keeps_it():
    # the target always moves to EOS from token 12: prompt ends at 10, so X = 11, 12, EOS(15)... use shift 1 then EOS
    table = shift_table(V, {1: 1.0})
    table[12] = -1e4
    table[12, EOS] = 0.0
    lab = Labeler(StubLM(table), StubLM(table), Sampling(max_new_tokens=8), seed=0, eos_token_ids=[EOS], pad_token_id=PAD)
    rows = only(lab.label([Prompt(0, [9, 10], "target")], "cpu"), "target")
    assert rows["token_id"].tolist() == [11, 12, EOS]
    assert rows["position"].tolist() == [2, 3, 4]


def test_one_category_per_batch():
    with pytest.raises(ValueError, match="one category"):
        labeler({1: 1.0}, {1: 1.0}).label([forced("target"), forced("draft", pid=1)], "cpu")


@pytest.mark.parametrize("category", ["target", "draft", "interleaved", "original"])
def test_feature_family_columns_read_what_a_decoder_holds(category):
    """The tapped layers read what ``hidden``/``hidden_prev`` read; the stale target columns are the target's state
    ``round_index`` positions back on the row's label prefix (k ≥ 1, never the row's own distribution); the margin
    is q's top-1 minus top-2 where the features read the token; the response index counts from the prompt's end."""
    prompt = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    x = [11, 12, 13, 14, 1, 2, 3, 4]
    rows = labeler({1: 0.5, 2: 0.3, 3: 0.2}, P_STEP).label([forced(category, response=x, prompt=prompt)], "cpu")
    out = only(rows, category)
    assert torch.equal(out["hidden_layers"].float(), out["hidden"].float().repeat(1, 2))
    assert torch.equal(out["hidden_layers_prev"].float(), out["hidden_prev"].float().repeat(1, 2))
    assert torch.allclose(out["read_margin_draft"], torch.full_like(out["read_margin_draft"], 0.2))
    pos, k = out["position"], out["round_index"]
    assert ((k >= 1) & (k <= 8)).all() and len(set(k.tolist())) > 1
    assert torch.equal(out["response_index"], pos - len(prompt))
    seq = list(prompt) + (x if category in ("target", "original") else [])
    if category in ("target", "original"):  # the label prefix is known here: the token read k + 1 positions back
        read = torch.tensor([seq[p - kk - 1] for p, kk in zip(pos.tolist(), k.tolist())])
        assert torch.equal(out["stale_hidden_target"].float(), one_hot(read))
    entropy_p = -sum(p * math.log(p) for p in P_STEP.values() if p > 0)
    assert torch.allclose(out["stale_entropy_target"], torch.full_like(out["stale_entropy_target"], entropy_p),
                          atol=1e-5)
    assert torch.allclose(out["stale_top1_target"], torch.full_like(out["stale_top1_target"], max(P_STEP.values())))


def test_stale_columns_of_a_batch_with_responses_of_different_lengths():
    """A shorter response pads on the right: its rows still draw k from 1..8 and read the state k positions back."""
    prompts = [forced("target", response=[11, 12, 13, 14, 1, 2, 3, 4], prompt=(1, 2, 3), pid=0),
               forced("target", response=[5, 6], prompt=(1, 2, 3, 4), pid=1)]
    rows = only(labeler({1: 0.5, 2: 0.5}, P_STEP).label(prompts, "cpu"), "target")
    for p in prompts:
        mine = rows["prompt_id"] == p.prompt_id
        seq = p.input_ids + p.response_ids
        k, pos = rows["round_index"][mine], rows["position"][mine]
        assert torch.equal(k, torch.minimum(k, pos - 1)) and (k >= 1).all()
        read = torch.tensor([seq[q - kk - 1] for q, kk in zip(pos.tolist(), k.tolist())])
        assert torch.equal(rows["stale_hidden_target"][mine].float(), one_hot(read))
