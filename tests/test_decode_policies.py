"""Every decoding policy on the tiny random-init Llama pair: real KV caches, cut back on rejection.

- greedy: every exact policy (and SPRINTER with a verifier that rejects everything, and Fuzzy SD below ln 2)
  reproduces target-only greedy decoding token for token;
- sampling: SD through the real caches matches the target's marginal of the second token (χ²);
- the counts every report is built from (SpecDec++ §3: N_draft + N_target = N + N_discarded for SD);
- the registry: every name builds and runs, an unknown name lists the known ones.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats
from transformers import AutoModelForCausalLM

from data_gen.labeler import Sampling
from evaluation.decoder import POLICIES, Decoding, ModelPair, build_policy
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


def _export(path, head, role: str, value: float):
    return str(export_head(
        head, path, draft={"name": "tiny-draft", "source": "test"}, vocab_size=64, label={"kind": "test"},
        role=role, threshold={"name": "tau" if role == "verifier" else "h", "value": value, "rule": "test"},
        metrics={},
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
            "verifier": _export(d / "verifier.safetensors", verifier, "verifier", 0.6)}


def example_kwargs(heads) -> dict[str, dict]:
    return {
        "target_only": {}, "draft_only": {}, "sd": {"k": 3}, "hf_heuristic": {}, "confidence": {},
        "svip": {"h": 0.5}, "specdecpp": {"head": heads["stop"]}, "fuzzy": {"T": 0.5},
        "sprinter": {"head": heads["verifier"]},  # τ = 0.6 > 0.5: rejects every token, so exact
    }


def generate(policy, pair, prompt, seed=0):
    return policy.generate(pair, prompt, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name, kwargs", [("sd", {"k": 1}), ("sd", {"k": 4}), ("sd", {"k": 9}), ("hf_heuristic", {}),
                                          ("confidence", {}), ("svip", {"h": 0.5}), ("specdecpp", None),
                                          ("fuzzy", {"T": 0.5}), ("sprinter", None)])
def test_greedy_equals_target_greedy(models, heads, name, kwargs):
    pair = pair_with(models, temperature=0.0, max_new_tokens=16)
    kwargs = example_kwargs(heads)[name] if kwargs is None else kwargs
    for prompt in PROMPTS:
        reference = generate(build_policy("target_only"), pair, prompt).tokens
        result = generate(build_policy(name, **kwargs), pair, prompt)
        assert result.tokens == reference


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

    s = generate(build_policy("specdecpp", head=heads["stop"], h=0.6), pair, prompt).stats
    assert s.target_calls == len(s.accepted_lengths)
    assert sum(s.accepted_lengths) + len(s.accepted_lengths) == s.new_tokens
    assert s.draft_calls >= sum(s.accepted_lengths) + s.discarded  # + the forwards that read a head's feature

    s = generate(build_policy("sprinter", head=heads["verifier"], tau=0.4), pair, prompt).stats
    assert (s.new_tokens, s.target_calls, s.discarded) == (20, 0, 0)  # τ below 0.5: the verifier accepts all
    s = generate(build_policy("sprinter", head=heads["verifier"]), pair, prompt).stats
    assert s.target_calls == s.new_tokens == 20  # τ above 0.5: every token goes to the target
    assert sum(s.accepted_lengths) + s.discarded == s.new_tokens


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
    with pytest.raises(ValueError):
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
    """A stop head and a verifier that only read q(y) make the same decisions as the confidence rule."""
    hidden, cut = models[0].config.hidden_size, 0.3
    stop = _export(tmp_path / "stop.safetensors", _score_only_head(ResNetHead, hidden, cut, depth=1), "stop", 0.5)
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
def test_draft_scores_are_the_confidence_distribution_however_q_is_warped(models, sampling):
    """``draft_scores`` reuses q when q is the plain tempered softmax, and equals ``scores(logits)`` always."""
    dec = Decoding(pair_with(models, max_new_tokens=4, **sampling), PROMPTS[0], torch.Generator().manual_seed(0))
    logq = dec.draft_dist()
    got = dec.draft_scores(logq)
    assert torch.equal(got, dec.scores(dec.draft.last_logits))
    assert (got is logq) == (sampling["temperature"] > 0 and len(sampling) == 1)


def _resized(model):
    import copy

    other = copy.deepcopy(model)
    other.resize_token_embeddings(model.config.vocab_size + 8)
    return other
