"""The label math on hand-made distributions, where every expected number is known."""

import math

import pytest
import torch

from core import label_math as lm


def logp(*probs):
    return torch.tensor([math.log(p) if p > 0 else -math.inf for p in probs])


def test_acceptance_and_ratio_exact_on_powers_of_two():
    q, p = logp(0.5, 0.25, 0.25), logp(0.25, 0.5, 0.25)
    tok = torch.tensor([0, 1, 2])
    s = lm.token_stats(q.expand(3, 3), p.expand(3, 3), tok)
    assert s["acceptance"].tolist() == [0.5, 1.0, 1.0]
    assert s["ratio"].tolist() == [2.0, 0.5, 1.0]
    assert s["tv"][0].item() == pytest.approx(0.25)
    assert s["entropy_draft"][0].item() == pytest.approx(1.5 * math.log(2))
    assert not s["greedy_match"][0]


def test_js_divergence_matches_its_definition():
    a, b = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.1, 0.3, 0.6])
    m = (a + b) / 2
    expected = 0.5 * (a * (a / m).log()).sum() + 0.5 * (b * (b / m).log()).sum()
    assert lm.js_divergence(a.log(), b.log()).item() == pytest.approx(expected.item(), rel=1e-6)
    assert lm.js_divergence(a.log(), a.log()).item() == pytest.approx(0.0, abs=1e-7)


def test_disjoint_supports_never_accept():
    q, p = logp(1.0, 0.0), logp(0.0, 1.0)
    s = lm.token_stats(q.unsqueeze(0), p.unsqueeze(0), torch.tensor([0]))
    assert s["acceptance"].item() == 0.0
    assert math.isinf(s["ratio"].item())
    assert s["tv"].item() == 1.0
    assert s["js"].item() == pytest.approx(math.log(2))
    assert not lm.sprinter_label(s["ratio"], 1e9).item()


@pytest.mark.parametrize("lam,expected", [(1.0, False), (1.5, False), (2.0, True), (2.5, True)])
def test_sprinter_label_at_the_boundary(lam, expected):
    ratio = lm.draft_target_ratio(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25)))
    assert ratio.item() == 2.0
    assert lm.sprinter_label(ratio, lam).item() is expected


def test_warp_top_k_top_p_and_greedy():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert torch.isinf(lm.warp_logits(logits, top_k=2)[2:]).all()
    probs = logits.softmax(-1)  # [0.644, 0.237, 0.087, 0.032]
    kept = lm.warp_logits(logits, top_p=0.7).exp()
    assert (kept > 0).tolist() == [True, True, False, False]
    assert kept.sum().item() == pytest.approx(1.0)
    assert kept[0].item() == pytest.approx((probs[0] / probs[:2].sum()).item())
    assert lm.warp_logits(logits, temperature=0).exp().tolist() == [1.0, 0.0, 0.0, 0.0]


def test_inverse_cdf_sampling_follows_the_distribution():
    lp = logp(0.25, 0.5, 0.25)
    u = torch.tensor([0.0, 0.2499, 0.2501, 0.7499, 0.7501, 0.9999])  # away from float round-off at the edges
    assert lm.sample_from_logprobs(lp.expand(6, 3), u).tolist() == [0, 0, 1, 1, 2, 2]
    # an impossible token is never drawn
    assert lm.sample_from_logprobs(logp(0.5, 0.0, 0.5).expand(3, 3), torch.tensor([0.4999, 0.5, 0.0])).tolist() == [0, 2, 0]


def test_category_shares_are_equal():
    cats = lm.assign_categories(41, lm.CATEGORIES, torch.Generator().manual_seed(0))
    counts = [cats.count(c) for c in lm.CATEGORIES]
    assert sum(counts) == 41 and max(counts) - min(counts) <= 1


def test_mixing_mask_share():
    m = lm.mixing_mask(torch.rand(20000, generator=torch.Generator().manual_seed(0)), 0.15)
    assert m.float().mean().item() == pytest.approx(0.15, abs=0.01)
