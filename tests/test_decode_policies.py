"""Every decoding policy on the tiny random-init Llama pair: real KV caches, cut back on rejection.

- greedy: every exact policy (and SPRINTER with a verifier that rejects everything, and Fuzzy SD below 1 bit)
  reproduces target-only greedy decoding token for token;
- sampling: SD through the real caches matches the target's marginal of the second token (χ²);
- the counts every report is built from (SpecDec++ §3: N_draft + N_target = N + N_discarded for every stop rule);
- the feature each head reads (its own position, or the previous one) against plain forwards;
- the registry: every name builds and runs, an unknown name lists the known ones.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import AutoModelForCausalLM

from core.errors import UserError
from core.label_math import warp_logits
from core.sampling import Sampling
from decoding.costs import CostModel
from decoding.estimates import CalibratedConfidence
from decoding.lookup_stop import LookupCalibration
from decoding.policies import POLICIES, build_policy
from decoding.state import Decoding, ModelPair
from heads.export import HeadFileError, export_head
from heads.resnet import ResNetHead
from heads.sprinter import SprinterHead

PROMPTS = [[1, 10, 11, 12], [1, 30, 5]]


@pytest.fixture(scope="module")
def models(tiny_pair):
    draft_dir, target_dir = tiny_pair
    return tuple(AutoModelForCausalLM.from_pretrained(d).eval() for d in (draft_dir, target_dir))


def pair_with(models, **sampling) -> ModelPair:
    return ModelPair(*models, eos_token_ids=[], sampling=Sampling(**sampling))


def _export(path, head, role: str, value: float, position: str = "own"):
    return str(export_head(
        head, path, draft={"name": "tiny-draft", "source": "test"}, vocab_size=57, label={"kind": "test"},
        role=role, threshold={"name": "tau" if role == "verifier" else "h", "value": value, "rule": "test"},
        metrics={}, position=position,
    ))


@pytest.fixture(scope="module")
def heads(tmp_path_factory, models):
    """A random SpecDec++ stop head and a SPRINTER verifier that always says 0.5, for the tiny draft."""
    d = tmp_path_factory.mktemp("heads")
    hidden = models[0].config.hidden_size
    torch.manual_seed(0)
    stop = ResNetHead(hidden_size=hidden, depth=2)
    with torch.no_grad():
        stop.out.weight.normal_(0, 1)
    verifier = SprinterHead(hidden_size=hidden)
    with torch.no_grad():
        verifier.linear.weight.zero_()
        verifier.linear.bias.zero_()
    return {"stop": _export(d / "stop.safetensors", stop, "stop", 0.5),
            "stop_prev": _export(d / "stop_prev.safetensors", stop, "stop", 0.5, position="prev"),
            "verifier": _export(d / "verifier.safetensors", verifier, "verifier", 0.6)}


CALIBRATED_GOODPUT = {"calibration": CalibratedConfidence(q=np.array([0.0, 1.0]), acceptance=np.array([0.2, 0.95])),
                      "costs": CostModel.by_length(draft=0.1, verify=lambda m: 0.5 + 0.1 * m), "lam": 2.0}
"""The goodput stop with no head: the draft's confidence, calibrated."""


LOOKUP_GOODPUT = {"n": 1, "m": 4, "calibration": LookupCalibration(length=[1.0, 6.0], keep=[0.2, 0.9], n=1),
                  "costs": CostModel.by_length(draft=0.1, verify=lambda m: 0.5 + 0.1 * m), "lam": 1.5}
"""Prompt lookup's goodput stop: one candidate of a short match, more of a longer one."""


def example_kwargs(heads) -> dict[str, dict]:
    return {
        "target_only": {}, "draft_only": {}, "sd": {"k": 3}, "hf_heuristic": {}, "confidence": {},
        "svip": {"h": 0.5}, "specdecpp": {"head": heads["stop"]}, "fuzzy": {"T": 0.5},
        "sprinter": {"head": heads["verifier"]},  # τ = 0.6 > 0.5: rejects every token, so exact
        "goodput": {"head": heads["stop"], "costs": CostModel.by_length(draft=0.1, verify=lambda m: 0.5 + 0.1 * m), "lam": 2.0},
        "prompt_lookup": {"n": 1, "m": 4}, "prompt_lookup_goodput": LOOKUP_GOODPUT,
        "prompt_lookup_head": {**{k: v for k, v in LOOKUP_GOODPUT.items() if k != "calibration"},
                               "head": lookup_head()},
    }


def lookup_head():
    """A random prompt-lookup stop head on the tiny target's state (d = 32)."""
    from decoding.lookup_stop import LookupHead

    torch.manual_seed(0)
    return LookupHead(ResNetHead(hidden_size=32, depth=0, scores=["log_match_length", "round_index", "target_top1"]),
                      hidden_size=32, n=1, m=4)


def generate(policy, pair, prompt, seed=0):
    return policy.generate(pair, prompt, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name, kwargs", [("sd", {"k": 1}), ("sd", {"k": 4}), ("sd", {"k": 9}), ("hf_heuristic", {}),
                                          ("confidence", {}), ("svip", {"h": 0.5}), ("specdecpp", None),
                                          ("goodput", None), ("goodput", CALIBRATED_GOODPUT), ("fuzzy", {"T": 0.5}),
                                          ("sprinter", None), ("prompt_lookup", None),
                                          ("prompt_lookup_goodput", None), ("prompt_lookup_head", None)])
def test_greedy_equals_target_greedy(models, heads, name, kwargs):
    pair = pair_with(models, temperature=0.0, max_new_tokens=16)
    kwargs = example_kwargs(heads)[name] if kwargs is None else kwargs
    for prompt in PROMPTS:
        reference = generate(build_policy("target_only"), pair, prompt).tokens
        result = generate(build_policy(name, **kwargs), pair, prompt)
        assert result.tokens == reference


def test_goodput_reads_its_costs_from_a_timing_file_and_can_follow_its_rate_online(models, heads, tmp_path):
    """λ starts at target-only's rate, 1 / T(1) of the timing file; online, after the generation it is the tokens
    made over the seconds taken."""
    import json

    from test_eval_latency import timing_file

    path = tmp_path / "timing.json"
    path.write_text(json.dumps(timing_file(t_step=0.5)))
    with pytest.raises(ValueError, match="exactly one of timing"):
        build_policy("goodput", head=heads["stop"])
    for estimates in ({}, {"head": heads["stop"], "calibration": CALIBRATED_GOODPUT["calibration"]}):
        with pytest.raises(ValueError, match="exactly one acceptance estimate: head .* or calibration"):
            build_policy("goodput", timing=path, **estimates)
    with pytest.raises(UserError, match="no such file"):
        build_policy("goodput", calibration=tmp_path / "missing.json", timing=path)
    policy = build_policy("goodput", head=heads["stop"], timing=path, online=True)
    assert policy.lam == pytest.approx(2.0)
    result = generate(policy, pair_with(models, max_new_tokens=12), PROMPTS[0])
    assert policy.tokens == result.stats.new_tokens == 12
    assert policy.stop.rule.rate == pytest.approx(12 / result.stats.wall_s, rel=0.5)  # timed from its own start
    fixed = build_policy("goodput", head=heads["stop"], timing=path)
    generate(fixed, pair_with(models, max_new_tokens=12), PROMPTS[0])
    assert fixed.stop.rule.rate == 2.0


def test_fuzzy_threshold_is_in_bits():
    """p = (1, 0), q = (½, ½): JS = ½·ln(4/3) + ¼·ln(2/3) + ¼·ln 2 = 0.2158 nats = 0.3113 bits."""
    logp, logq = torch.tensor([0.0, -math.inf]), torch.tensor([0.5, 0.5]).log()
    js_bits = (0.5 * math.log(4 / 3) + 0.25 * math.log(2 / 3) + 0.25 * math.log(2)) / math.log(2)
    assert js_bits == pytest.approx(0.3113, abs=1e-4)
    assert not build_policy("fuzzy", T=0.25).accept(None, logp, logq, 0)  # in nats (0.2158 < 0.25) it would keep
    assert build_policy("fuzzy", T=0.32).accept(None, logp, logq, 0)
    assert build_policy("fuzzy", T=1.0).accept(None, logq, logq, 0)


def test_sd_sampling_through_the_caches_is_exact(models):
    """The second token's marginal under SD (K = 3) equals the target's: Σ_a p(a|x) p(·|x, a)."""
    draft, target = models
    pair = pair_with(models, temperature=1.0, max_new_tokens=2)
    prompt = PROMPTS[0]
    with torch.no_grad():
        p1 = target(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
        vocab = p1.shape[0]
        batch = torch.tensor([prompt + [a] for a in range(vocab)])
        p2 = p1 @ target(batch).logits[:, -1].float().softmax(-1)
    g = torch.Generator().manual_seed(0)
    policy = build_policy("sd", k=3)
    results = [policy.generate(pair, prompt, g) for _ in range(600)]
    observed = torch.bincount(torch.tensor([r.tokens[1] for r in results]), minlength=vocab).double()
    expected = p2.double() * len(results)
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    assert stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3
    assert sum(r.stats.discarded for r in results) > 50


def test_counts(models, heads):
    pair = pair_with(models, temperature=1.0, max_new_tokens=20)
    prompt = PROMPTS[0]

    s = generate(build_policy("target_only"), pair, prompt).stats
    assert (s.new_tokens, s.target_calls, s.draft_calls, s.discarded, s.accepted_lengths) == (20, 20, 0, 0, [])
    assert s.verification_rate == 1.0 and s.wall_s > 0
    s = generate(build_policy("draft_only"), pair, prompt).stats
    assert (s.new_tokens, s.target_calls, s.draft_calls, s.discarded) == (20, 0, 20, 0)

    for k in (1, 3):
        s = generate(build_policy("sd", k=k), pair, prompt).stats
        rounds = len(s.accepted_lengths)
        assert s.new_tokens == 20 and s.target_calls == rounds
        assert sum(s.accepted_lengths) + rounds == s.new_tokens  # each round adds one target token
        assert s.draft_calls == sum(s.accepted_lengths) + s.discarded  # one draft call per candidate
        assert s.draft_calls + s.target_calls == s.new_tokens + s.discarded  # SpecDec++ §3
        assert all(0 <= n <= k for n in s.accepted_lengths)
        assert s.discard_rate == s.discarded / 20
        # every target forward but the prompt's: a verification of K + 1 tokens (fewer where the response ends)
        assert sum(s.target_reads.values()) == s.target_calls - 1 and max(s.target_reads) <= k + 1

    s = generate(build_policy("specdecpp", head=heads["stop"], h=0.6), pair, prompt).stats
    assert s.target_calls == len(s.accepted_lengths)
    assert sum(s.accepted_lengths) + len(s.accepted_lengths) == s.new_tokens
    assert s.draft_calls == sum(s.accepted_lengths) + s.discarded  # the head's forwards gave the next q


    s = generate(build_policy("sprinter", head=heads["verifier"], tau=0.4), pair, prompt).stats
    assert (s.new_tokens, s.target_calls, s.discarded) == (20, 0, 0)  # τ below 0.5: the verifier accepts all
    s = generate(build_policy("sprinter", head=heads["verifier"]), pair, prompt).stats
    assert s.target_calls == s.new_tokens == 20  # τ above 0.5: every token goes to the target
    assert sum(s.accepted_lengths) + s.discarded == s.new_tokens


STOP_RULES = [("sd", {"k": 3}), ("hf_heuristic", {}), ("confidence", {"threshold": 0.5}), ("svip", {"h": 1.0}),
              ("specdecpp", {"head": "stop", "h": 0.4}), ("specdecpp", {"head": "stop_prev", "h": 0.4}),
              ("goodput", CALIBRATED_GOODPUT)]


def unused_forwards(models, heads, name, kwargs, eos, monkeypatch=None) -> tuple[int, int]:
    """Over 8 generations: the most forwards any one left unused beyond an accepted-EOS ending (SpecDec++ Lemma
    3.1: N_draft + N_target = N + N_discarded), and how many rounds a stop rule ended before the cap."""
    kwargs = {k: heads.get(v, v) if k == "head" else v for k, v in kwargs.items()}
    pair = ModelPair(*models, eos_token_ids=eos, sampling=Sampling(temperature=1.0, max_new_tokens=24))
    stopped = []
    if monkeypatch is not None:
        draft_round = Decoding.draft_round

        def recording(dec, max_k, stop=None):
            cap = min(max_k, dec.remaining - 1)
            cands, logqs = draft_round(dec, max_k, stop)
            stopped.append(stop is not None and len(cands) < cap and cands[-1] not in dec.eos)
            return cands, logqs

        monkeypatch.setattr(Decoding, "draft_round", recording)
    worst = 0
    for seed in range(4):
        for prompt in PROMPTS:
            r = generate(build_policy(name, **kwargs), pair, prompt, seed=seed)
            s = r.stats
            unused = s.draft_calls + s.target_calls - (s.new_tokens + s.discarded)
            worst = max(worst, unused - (1 if r.tokens[-1] in eos else 0))
    return worst, sum(stopped)


@pytest.mark.parametrize("name, kwargs", STOP_RULES)
@pytest.mark.parametrize("eos", [[], [7, 20, 33]])
def test_no_draft_forward_is_wasted(models, heads, name, kwargs, eos, monkeypatch):
    """Every draft forward's q is sampled and submitted (SpecDec++ Algorithm 1 submits the candidate drawn from the
    forward its head read), for every stop rule, at EOS and at max_new_tokens; the stop rules do stop rounds."""
    worst, stopped = unused_forwards(models, heads, name, kwargs, eos, monkeypatch)
    assert worst <= 0
    if name not in ("sd", "hf_heuristic"):
        assert stopped > 0


def test_the_count_test_catches_a_stop_that_discards_the_heads_forward(models, heads, monkeypatch):
    """A SpecDec++ round that reads y_k's forward for e_k, then stops without drawing y_{k+1} from it."""
    from decoding.policies import specdecpp

    original = specdecpp.HeadStop.__call__

    def discarding(self, dec, candidates, step):
        self.reads_candidate = False  # so the round ends at y_k, while the head still reads y_k's own forward
        scores = dec.draft_confidence(step)
        return self.head.logit(dec.draft_feature(candidates), scores, candidates[-1]) < -1e9 or original(
            self, dec, candidates, step)

    monkeypatch.setattr(specdecpp.HeadStop, "__call__", discarding)
    worst, _ = unused_forwards(models, heads, "specdecpp", {"head": "stop", "h": 0.4}, [])
    assert worst > 0


@pytest.mark.parametrize("head", ["stop", "stop_prev"])
def test_specdecpp_that_never_stops_drafts_like_sd(models, heads, head):
    """At h = 1 the rule never fires: every round drafts max_k candidates, like SD at K = max_k, draw for draw."""
    pair = pair_with(models, temperature=1.0, max_new_tokens=30)
    for seed in range(3):
        ours = generate(build_policy("specdecpp", head=heads[head], h=1.0, max_k=5), pair, PROMPTS[0], seed)
        sd = generate(build_policy("sd", k=5), pair, PROMPTS[0], seed)
        assert ours.tokens == sd.tokens
        for k in ("target_calls", "draft_calls", "discarded", "accepted_lengths"):
            assert getattr(ours.stats, k) == getattr(sd.stats, k), k


def test_each_head_reads_the_hidden_state_it_was_trained_on(models, heads, monkeypatch):
    """``own``: the draft's state after reading the candidate (SpecDec++ Eq. 4.1); ``prev``: the state that
    produced q for it (SPRINTER §3.2). Checked against plain uncached forwards of the draft."""
    from decoding.policies import specdecpp, sprinter
    from heads import exported

    seen = []  # (context ending with the candidate, hidden the head got)
    context = []
    logit = exported.ExportedHead.logit
    monkeypatch.setattr(exported.ExportedHead, "logit",
                        lambda self, hidden, *a: seen.append((context[-1], self.position, hidden)) or logit(self, hidden, *a))
    stop_call, verify_call = specdecpp.HeadStop.__call__, sprinter.HeadVerifier.__call__
    monkeypatch.setattr(specdecpp.HeadStop, "__call__",
                        lambda self, dec, cands, *a: context.append(dec.seq + cands) or stop_call(self, dec, cands, *a))
    monkeypatch.setattr(sprinter.HeadVerifier, "__call__",
                        lambda self, hidden, ids, *a: context.append(list(ids)) or verify_call(self, hidden, ids, *a))
    pair = pair_with(models, temperature=1.0, max_new_tokens=12)
    prev_verifier = heads["verifier"].replace("verifier.safetensors", "verifier_prev.safetensors")
    _export(prev_verifier, exported.load_head(heads["verifier"])[0], "verifier", 0.4, position="prev")
    for head in (heads["stop"], heads["stop_prev"]):
        generate(build_policy("specdecpp", head=head, h=0.9), pair, PROMPTS[0])
    for head in (heads["verifier"], prev_verifier):
        generate(build_policy("sprinter", head=head, tau=0.4), pair, PROMPTS[1])
    assert {p for _, p, _ in seen} == {"own", "prev"} and len(seen) > 20
    draft = models[0]
    for ids, position, hidden in seen:
        read = ids if position == "own" else ids[:-1]
        with torch.no_grad():
            expected = draft.model(input_ids=torch.tensor([read])).last_hidden_state[0, -1]
        torch.testing.assert_close(hidden, expected, atol=1e-4, rtol=1e-4)


def test_reproducible(models, heads):
    pair = pair_with(models, temperature=1.0, max_new_tokens=12)
    for name, kwargs in example_kwargs(heads).items():
        a, b = (generate(build_policy(name, **kwargs), pair, PROMPTS[1], seed=3) for _ in range(2))
        assert a.tokens == b.tokens and a.stats.accepted_lengths == b.stats.accepted_lengths, name


def test_registry_builds_and_runs_every_policy(models, heads):
    kwargs = example_kwargs(heads)
    assert set(kwargs) == set(POLICIES)
    pair = pair_with(models, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=6)
    for name in POLICIES:
        policy = build_policy(name, **kwargs[name])
        assert policy.name == name
        result = generate(policy, pair, PROMPTS[0])
        assert len(result.tokens) == 6 and result.stats.new_tokens == 6
    with pytest.raises(ValueError, match="unknown policy 'nope'; known: .*sd.*sprinter"):
        build_policy("nope")


def test_head_checks(models, heads):
    with pytest.raises(HeadFileError, match="'stop' head, this policy needs a 'verifier'"):
        build_policy("sprinter", head=heads["stop"])
    with pytest.raises(HeadFileError, match="'verifier' head, this policy needs a 'stop'"):
        build_policy("specdecpp", head=heads["verifier"])
    big = ResNetHead(hidden_size=models[0].config.hidden_size + 1, depth=0)
    path = _export(heads["stop"].replace("stop.safetensors", "big.safetensors"), big, "stop", 0.5)
    with pytest.raises(HeadFileError, match="hidden size"):
        generate(build_policy("specdecpp", head=path), pair_with(models, max_new_tokens=4), PROMPTS[0])
    assert build_policy("specdecpp", head=heads["stop"]).h == 0.5  # h from the file
    with pytest.raises(UserError, match="vocabularies differ"):
        ModelPair(models[0], _resized(models[1]), eos_token_ids=[])


def _score_only_head(cls, hidden: int, cut: float, **kw):
    """A head whose logit is 1000·(q(y) − cut): sigmoid ≈ 1[q(y) > cut], the hidden state ignored."""
    head = cls(hidden_size=hidden, scores=["p_draft"], **kw)
    linear = head.linear if cls is SprinterHead else head.out
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.fill_(-1000 * cut)
        head.score_term.linear.weight.fill_(1000.0)
    return head


def test_heads_that_read_draft_scores_get_them_from_the_decoder(models, tmp_path):
    """A stop head and a verifier that only read q(y) make the same decisions as the confidence rule (the stop
    head on the previous position's state decides on the candidate from the forward it was drawn from, as the
    confidence rule does; one on its own position would submit one more candidate, SpecDec++ Algorithm 1)."""
    hidden, cut = models[0].config.hidden_size, 0.3
    stop = _export(tmp_path / "stop.safetensors", _score_only_head(ResNetHead, hidden, cut, depth=1), "stop", 0.5,
                   position="prev")
    verifier = _export(tmp_path / "ver.safetensors", _score_only_head(SprinterHead, hidden, cut), "verifier", 0.5)
    pair = pair_with(models, temperature=1.0, max_new_tokens=16)
    for prompt in PROMPTS:
        ours = generate(build_policy("specdecpp", head=stop, h=0.5), pair, prompt)
        rule = generate(build_policy("confidence", threshold=cut), pair, prompt)
        assert ours.tokens == rule.tokens and ours.stats.accepted_lengths == rule.stats.accepted_lengths

        def by_confidence(hidden, ids, generator, scores):
            return scores[ids[-1]].exp().item() >= cut

        ours = generate(build_policy("sprinter", head=verifier), pair, prompt)
        rule = generate(build_policy("sprinter", verifier=by_confidence), pair, prompt)
        assert ours.tokens == rule.tokens and ours.stats.accepted_lengths == rule.stats.accepted_lengths
        assert 0 < ours.stats.target_calls < 16  # the rule both accepts and rejects here


@pytest.mark.parametrize("sampling", [dict(temperature=0.7), dict(temperature=0.7, top_p=0.5), dict(temperature=0.0),
                                      dict(temperature=1.0, top_k=3)])
def test_draft_confidence_is_q_as_the_labels_warp_it(models, sampling):
    """``draft_confidence`` is q itself, top-k and top-p included (the labels' ``logp_draft``, so what a calibration
    and a head's draft scores are fitted on), and the raw logits' softmax under greedy decoding."""
    dec = Decoding(pair_with(models, max_new_tokens=4, **sampling), PROMPTS[0], torch.Generator().manual_seed(0))
    step = dec.draft_step()
    got = dec.draft_confidence(step)
    if sampling["temperature"] > 0:
        s = dec.pair.sampling
        assert got is step.logq
        assert torch.equal(got, warp_logits(dec.draft.last_logits, s.temperature, s.top_k, s.top_p))
    else:
        assert torch.equal(got, dec.draft.last_logits.float().log_softmax(-1))


def _resized(model):
    import copy

    other = copy.deepcopy(model)
    other.resize_token_embeddings(model.config.vocab_size + 8)
    return other


def test_the_decoders_head_features_are_the_label_columns_for_the_same_prefix(models):
    """Mid-generation, what the decoder feeds a head for each candidate of a round (``Decoding.head_context``) is
    what the labeler stores for a row at that prefix with that round index, as the audit recomputes it with plain
    forwards: the stale target state where the last call sampled, the round and response index, the tapped
    layers at the previous position and the draft's top-2 margin."""
    from core.adapter import tap_layers
    from data_gen import audit_recompute
    from heads.features import scores_from_logprobs

    pair = pair_with(models, temperature=1.0, max_new_tokens=12)
    layers = tap_layers(pair.draft.config.num_hidden_layers)
    dec = Decoding(pair, PROMPTS[0], torch.Generator().manual_seed(0), draft_layers=layers)
    dec.verify(*dec.draft_round(3))  # a first round: the target samples the round's last token
    assert dec.stale is not None and dec.stale[0] == len(dec.seq) - 1
    candidates, _ = dec.draft_round(3)
    readers = (audit_recompute.Reader(pair.draft, layers=layers), audit_recompute.Reader(pair.target))
    for j in range(1, len(candidates) + 1):
        step = dec.draft_step(candidates[: j - 1])
        context = dec.head_context(candidates[:j], step.layers)
        row = {"position": len(dec.seq) + j - 1, "category": "target", "token_id": candidates[j - 1],
               "round_index": int(context["round_index"])}
        seq = {"prompt_ids": PROMPTS[0], "response_ids": dec.seq[len(PROMPTS[0]):] + candidates[: j - 1],
               "mixed_ids": []}
        label = audit_recompute.recompute(row, seq, *readers, pair.sampling)
        assert row["round_index"] == j and int(context["response_index"]) == label["response_index"]
        for column in ("stale_entropy_target", "stale_top1_target"):
            assert context[column].item() == pytest.approx(label[column], abs=1e-4)
        assert torch.allclose(context["stale_target"], torch.from_numpy(label["stale_hidden_target"]), atol=1e-4)
        assert torch.allclose(context["layers"], torch.from_numpy(label["hidden_layers_prev"]), atol=1e-4)
        margin = scores_from_logprobs(["margin_draft"], step.logq, candidates[j - 1])
        assert margin.item() == pytest.approx(label["read_margin_draft"], abs=1e-4)


@pytest.mark.parametrize("position", ["own", "prev"])
def test_heads_reading_every_feature_family_decode_exactly(models, tmp_path, position):
    """A stop head and a verifier that read the runtime, draft and stale-target families run through the decoder
    (greedy SpecDec++ still equals target-only); the transformers runtime refuses them in one line."""
    from core.adapter import tap_layers
    from heads.exported import ExportedHead
    from heads.features import DRAFT_SCORES

    draft, target = (m.config.hidden_size for m in models)
    layers = tap_layers(models[0].config.num_hidden_layers)
    extra = len(layers) * draft + target
    torch.manual_seed(0)
    stop = ResNetHead(hidden_size=draft, depth=1, scores=list(DRAFT_SCORES), extra_size=extra, extra_rank=4)
    verifier = SprinterHead(hidden_size=draft, scores=list(DRAFT_SCORES), extra_size=extra)
    with torch.no_grad():
        for head in (stop, verifier):
            for p in head.parameters():
                p.normal_(0, 0.1)
    files = {role: str(export_head(head, tmp_path / f"{role}.safetensors", draft={"name": "tiny-draft", "source": "t"},
                                   vocab_size=57, label={"kind": "test"}, role=role,
                                   threshold={"name": "h", "value": 0.5, "rule": "test"}, metrics={},
                                   position=position, vectors=["layers", "stale_target"], tapped_layers=list(layers)))
             for role, head in (("stop", stop), ("verifier", verifier))}
    pair = pair_with(models, temperature=0.0, max_new_tokens=16)
    for prompt in PROMPTS:
        reference = generate(build_policy("target_only"), pair, prompt).tokens
        assert generate(build_policy("specdecpp", head=files["stop"]), pair, prompt).tokens == reference
        assert len(generate(build_policy("sprinter", head=files["verifier"], tau=0.5), pair, prompt).tokens) == 16
    with pytest.raises(HeadFileError, match="this runtime does not compute"):
        ExportedHead(files["stop"])
    wider = copy.deepcopy(models[1])
    wider.config.hidden_size = target + 8
    with pytest.raises(HeadFileError, match=f"target's hidden state of size {target}, the target has {target + 8}"):
        build_policy("specdecpp", head=files["stop"]).generate(
            pair_with((models[0], wider), temperature=0.0, max_new_tokens=4), PROMPTS[0], torch.Generator())


@pytest.mark.parametrize("name", ["target_only", "sd", "confidence", "specdecpp"])
def test_an_untimed_prefill_changes_no_token_and_no_count(models, heads, name):
    """Reading the prompt before the clock starts (as llama.cpp's tools time decoding) leaves the tokens and the
    counts of SpecDec++ Lemma 3.1 as they were, and takes the prompt out of the first call."""
    kwargs = example_kwargs(heads)[name]
    for untimed in (False, True):
        pair = ModelPair(*models, eos_token_ids=[], untimed_prefill=untimed,
                         sampling=Sampling(temperature=1.0, max_new_tokens=12))
        results = [generate(build_policy(name, **kwargs), pair, prompt, seed=1) for prompt in PROMPTS]
        if not untimed:
            timed = results
            continue
        for a, b in zip(timed, results):
            assert a.tokens == b.tokens
            assert (a.stats.draft_calls, a.stats.target_calls) == (b.stats.draft_calls, b.stats.target_calls)


def test_a_goodput_stop_that_cannot_pay_never_runs_the_draft(models, monkeypatch):
    """Where no round beats target-only (a draft step dearer than the target's), the goodput stop decodes as
    target-only does: the draft reads nothing, not even the prompt before the clock starts."""
    from decoding.backends import CachedLM

    read = []
    advance = CachedLM.advance
    monkeypatch.setattr(CachedLM, "advance", lambda self, seq, rows=1: read.append(self.model) or advance(self, seq, rows))
    kwargs = dict(CALIBRATED_GOODPUT, costs=CostModel.by_length(draft=2.0, verify=lambda m: 1.0), lam=None)
    policy = build_policy("goodput", **kwargs)
    assert not policy.drafts
    pair = ModelPair(*models, eos_token_ids=[], untimed_prefill=True, sampling=Sampling(max_new_tokens=8))
    result = policy.generate(pair, PROMPTS[0], torch.Generator().manual_seed(0))
    assert len(result.tokens) == 8 and result.stats.draft_calls == 0
    assert read and all(model is models[1] for model in read)


@pytest.mark.parametrize("untimed_prefill", [False, True])
def test_a_run_counts_the_drafts_catch_up_but_not_its_prompt(models, untimed_prefill):
    """Greedy SD (K = 2) with the target as its own draft keeps every candidate: 8 tokens in rounds of 3, 3 and 2,
    and each round after the first begins with the draft reading the last candidate and the bonus token, one
    token beyond one each; the prompt's read, timed or not, is no catch-up."""
    pair = ModelPair(models[1], models[1], eos_token_ids=[], untimed_prefill=untimed_prefill,
                     sampling=Sampling(temperature=0.0, max_new_tokens=8))
    result = build_policy("sd", k=2).generate(pair, PROMPTS[0], torch.Generator().manual_seed(0))
    assert result.stats.accepted_lengths == [2, 2, 1]
    assert result.stats.draft_catch_up == 2
    # the target verified 2, 2 and 1 candidates (3, 3 and 2 tokens read), the first of them with the prompt where
    # the prompt's read is timed: that forward is the run's prefill, not a read from its cache
    assert result.stats.target_reads == ({2: 1, 3: 2} if untimed_prefill else {2: 1, 3: 1})
    assert result.stats.target_calls == 3


@pytest.mark.parametrize("temperature, eos", [(0.0, []), (1.0, []), (1.0, [11])])
@pytest.mark.parametrize("stop", [False, True])
def test_prompt_lookup_replayed_along_its_own_response_gives_its_rounds(models, temperature, eos, stop):
    """A point-mass proposal is kept exactly where the response holds it, so replaying prompt lookup along the
    decoder's own output (greedy or sampled, with an end token or not, with its goodput stop or not) gives the
    decoder's counts, round for round: the simulator can price it from a trace of the target's response alone."""
    from decoding.replay import prompt_lookup_counts

    pair = ModelPair(*models, eos_token_ids=eos, sampling=Sampling(temperature=temperature, max_new_tokens=40))
    prompt = [1, 10, 11, 12, 10, 11, 12, 10, 11]  # a pattern the response may go on repeating, 11 an end token in it
    rounds, cuts = 0, set()
    for seed in range(6):
        policy = build_policy("prompt_lookup_goodput", **LOOKUP_GOODPUT) if stop \
            else build_policy("prompt_lookup", n=1, m=4)
        if stop:  # the stop cuts some proposals short and submits others whole
            rule = policy.length
            policy.length = lambda seq, source, proposal, state=None: \
                cuts.add(rule(seq, source, proposal, state) < len(proposal)) or rule(seq, source, proposal, state)
        result = generate(policy, pair, prompt, seed=seed)
        counts = prompt_lookup_counts(prompt, result.tokens, 1, 4, 40, eos, length=policy.length)
        assert (counts.target, counts.discarded, counts.draft) == (result.stats.target_calls,
                                                                  result.stats.discarded, 0.0)
        assert counts.calls[2:].sum() == len(result.stats.accepted_lengths)
        rounds += len(result.stats.accepted_lengths)
    assert rounds > 0  # proposals were made and verified
    if stop:
        assert cuts == {True, False}


def test_a_forward_that_gives_fewer_rows_than_it_reads_is_no_verification_to_price(models):
    """A forward that reads m tokens and gives one row (SPRINTER's check of its pending tokens) costs less than the
    verification of m tokens a cost by length prices: the run records no reads by length then."""
    from decoding.backends import CachedLM

    lm = CachedLM(models[1], Sampling())
    lm.advance([1, 10, 11])  # the prompt: from the start, not counted
    lm.advance([1, 10, 11, 12, 13], rows=2)  # two tokens, both rows: a verification of one candidate
    assert (lm.reads, lm.partial_reads) == ({2: 1}, 0)
    lm.advance([1, 10, 11, 12, 13, 14, 15, 16])  # three tokens, one row
    assert (lm.reads, lm.partial_reads) == ({2: 1, 3: 1}, 1)
