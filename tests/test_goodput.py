"""The goodput stop (``decoding.rules.GoodputStop``, ``decoding/DESIGN.md``): under a flat verification cost it is
SpecDec++'s threshold with h from the costs; a dearer long verification stops earlier; at its fixed-point rate it
beats every SpecDec++ threshold under a non-monotone table, and stays under the oracle. The three sources of
acceptance estimates (``decoding.estimates``) and their ECE."""

from __future__ import annotations

import numpy as np
import pytest

from decoding import estimates, replay, rules
from decoding.costs import CostModel

MAX_K = 12
# a verification's seconds by tokens, shaped like the 1.5B target's on 2 CPU cores: two tokens cost twice one,
# and 4 and 8 tokens are cheaper than 3 and 6
CPU_VERIFY = {1: 0.50, 2: 1.07, 3: 1.34, 4: 1.25, 5: 1.45, 6: 1.60, 7: 1.55, 8: 1.50, 9: 1.70, 10: 1.84, 11: 1.95,
              12: 2.00, 13: 2.05}
CPU = CostModel.by_length(draft=0.1, verify=CPU_VERIFY, name="cpu")
FLAT = CostModel.by_length(draft=0.1, verify=lambda m: 1.0, name="flat")


def random_traces(seed: int, noise: float, count: int = 8, length: int = 60):
    """(acceptance, log â) of ``count`` traces: acceptance drifts along a trace, some candidates match the
    target's token for sure, and the estimate is the acceptance's logit plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    acceptance, log_accepts = [], []
    for _ in range(count):
        z = 0.3 * np.cumsum(rng.normal(0, 0.6, length)) + rng.normal(1.5, 1.5, length)
        a = 1 / (1 + np.exp(-z))
        a[rng.random(length) < 0.15] = 1.0
        acceptance.append(a)
        log_accepts.append(rules.log_accept(z + rng.normal(0, noise, length)))
    return acceptance, log_accepts


def rate(counts: replay.Counts, costs: CostModel) -> float:
    return counts.n / costs.price(counts)


@pytest.mark.parametrize("reads_candidate", [False, True])
def test_a_flat_cost_is_specdecpp_with_h_from_the_costs(reads_candidate):
    """Flat T, future acceptance ā: stop iff s_k·ā^(1+e) ≤ λ·t_draft, i.e. h = 1 − λ·t_draft / ā^(1+e)."""
    future, lam = 0.8, 2.5
    h = 1 - lam * FLAT.draft / future ** (1 + reads_candidate)
    _, log_accepts = random_traces(0, 0.0)
    for log_a in log_accepts:
        got = replay.goodput_round_lengths(log_a, FLAT, lam, reads_candidate, MAX_K, future)
        assert got.tolist() == replay.head_round_lengths(log_a, h, reads_candidate, MAX_K).tolist()
    # the rule decides at every h the grid holds, not only at one
    lengths = {replay.goodput_round_lengths(log_accepts[0], FLAT, lam, reads_candidate, MAX_K, future).mean()
               for lam in (0.5, 1.5, 2.5, 4.0, 7.0)}
    assert len(lengths) == 5


def test_a_dearer_long_verification_stops_earlier():
    steep = CostModel.by_length(draft=0.1, verify=lambda m: 1.0 + 0.3 * (m - 1))
    _, log_accepts = random_traces(1, 0.5)
    for log_a in log_accepts:
        flat = replay.goodput_round_lengths(log_a, FLAT, 2.0, False, MAX_K)
        dear = replay.goodput_round_lengths(log_a, steep, 2.0, False, MAX_K)
        assert np.all(dear <= flat) and dear.mean() < flat.mean()


def test_the_round_looks_past_the_next_candidate_to_a_cheaper_longer_verification():
    """T = 1 s at every length but 3 tokens (1.2 s), λ = 3 tokens/s, a draft step 0.1 s, future candidates kept
    with probability 0.5. After one sure candidate the next adds 0.5 tokens for 0.3 s (0.9 tokens' worth), but
    the next two add 0.75 for 0.2 s (0.6): only a rule that looks past the next candidate drafts on. After a second
    candidate at â = 0.5 the next adds 0.25 tokens: worth less than its 0.1 s draft step under the flat cost (0.3),
    worth more than the −0.1 s it costs when it makes the verification the cheaper 4 tokens."""
    inverted = {**{m: 1.0 for m in range(1, MAX_K + 2)}, 3: 1.2}
    flat = rules.GoodputStop(FLAT, 3.0, MAX_K, future=0.5)
    dip = rules.GoodputStop(CostModel.by_length(0.1, inverted), 3.0, MAX_K, future=0.5)
    assert [flat(0.0), flat(np.log(0.5))] == [False, True]
    assert [dip(0.0), dip(np.log(0.5))] == [False, False]
    dip.reset()
    assert dip(np.log(0.01))  # a round the estimates doom stops whatever the table


def test_every_round_stops_at_the_cap():
    stop = rules.GoodputStop(FLAT, 1e-9, 3)
    assert [stop(0.0) for _ in range(3)] == [False, False, True]


def test_the_drafts_catch_up_can_make_drafting_not_pay():
    """One candidate at a flat verification: a kept candidate gains a token for a draft step of 0.4 target steps,
    worth it at target-only's rate; not once the draft's next forward spends 0.7 more reading it."""
    costs = CostModel.by_length(draft=0.4, verify=lambda m: 1.0)
    assert rules.GoodputStop(costs, 1.0, 1).drafting_pays
    assert not rules.GoodputStop(CostModel.by_length(draft=0.4, verify=lambda m: 1.0, catch_up=0.7), 1.0, 1).drafting_pays


@pytest.mark.parametrize("reads_candidate", [False, True])
@pytest.mark.parametrize("predictor", ["last", "mean"])
def test_at_its_fixed_point_the_rule_beats_every_threshold_and_not_the_oracle(reads_candidate, predictor):
    """Under the CPU table and estimates of moderate noise (a trained head's, not an exact one), on three sets of
    random traces. (Against the best fixed K it wins on most trace sets, not all: ``decoding/DESIGN.md``.)"""
    for seed in range(3):
        acceptance, log_accepts = random_traces(seed, 0.5)
        future = None if predictor == "last" else float(np.mean(np.concatenate(acceptance)))
        found = replay.goodput_rate(acceptance, log_accepts, CPU, reads_candidate, MAX_K, future)
        assert found["stopped"] == "fixed point" and len(found["tried"]) < 10
        assert found["achieved"][-1] == pytest.approx(found["tried"][-1], rel=1e-4)
        assert found["rate"] == max(found["achieved"])
        fixed = found["achieved"][-1]  # the rule at its fixed point, before keeping the best λ tried
        assert rate(replay.goodput_counts(acceptance, log_accepts, CPU, found["at"], reads_candidate, MAX_K, future),
                    CPU) == found["rate"]
        logits = [f - np.log1p(-np.exp(f)) for f in log_accepts]  # log â back to the head's logit
        for h in replay.STOP_H_GRID:
            assert fixed >= rate(replay.stop_head_counts(acceptance, logits, h, reads_candidate, MAX_K), CPU)
        oracle = replay.Counts()
        for a in acceptance:
            oracle += replay.oracle_counts(a, CPU, MAX_K)
        assert found["rate"] < rate(oracle, CPU)


def test_the_iteration_stops_on_a_cycle_or_its_cap_and_keeps_the_best_rate_it_saw():
    """Round lengths change in steps as λ moves, so λ ← rate(λ) can alternate between two rates (these traces do):
    the search stops there and keeps the λ whose replay did best."""
    acceptance, log_accepts = random_traces(2, 0.5, count=3)
    found = replay.goodput_rate(acceptance, log_accepts, CPU, True, MAX_K)
    assert found["stopped"] == "cycle" and found["rate"] == max(found["achieved"])
    assert found["rate"] > min(found["achieved"][1:])  # the two rates of the cycle differ
    at = replay.goodput_counts(acceptance, log_accepts, CPU, found["at"], True, MAX_K)
    assert rate(at, CPU) == found["rate"]
    capped = replay.goodput_rate(acceptance, log_accepts, CPU, True, MAX_K, max_iter=1)
    assert capped["stopped"] == "max_iter" and capped["tried"] == [1 / CPU.verify(1)]


def test_calibrated_confidence_lowers_the_ece_of_raw_confidence(tmp_path):
    """Rows whose acceptance is a known monotone function of q (q², with noise): raw q is off by q − q²; the
    isotonic map fitted on other rows is calibrated, and survives a save and load."""
    rng = np.random.default_rng(0)

    def rows(n):
        q = rng.uniform(0.05, 1.0, n)
        return np.log(q), np.clip(q ** 2 + rng.normal(0, 0.1, n), 0.0, 1.0)

    fitted = estimates.CalibratedConfidence.fit(*rows(5000))
    logq, acceptance = rows(5000)
    raw = estimates.calibration_error(np.exp(logq), acceptance)
    calibrated = estimates.calibration_error(np.exp(fitted.log_accept(logq)), acceptance)
    assert raw > 0.1 and calibrated < 0.02
    fitted.save(tmp_path / "calibration.json")
    loaded = estimates.CalibratedConfidence.load(tmp_path / "calibration.json")
    assert np.array_equal(loaded.log_accept(logq), fitted.log_accept(logq)) and loaded.rows == 5000
    (tmp_path / "other.json").write_text('{"estimate": "head"}')
    with pytest.raises(estimates.EstimateFileError):
        estimates.CalibratedConfidence.load(tmp_path / "other.json")


def test_the_ece_sees_a_miscalibration_in_one_bin_only():
    acceptance = np.full(100, 0.5)
    assert estimates.calibration_error(np.full(100, 0.5), acceptance) == 0.0
    estimate = np.where(np.arange(100) < 25, 0.9, 0.5)  # a quarter of the rows 0.4 too high
    assert estimates.calibration_error(estimate, acceptance) == pytest.approx(0.1)
    # gaps of opposite sign in different bins do not cancel
    assert estimates.calibration_error(np.where(np.arange(100) < 50, 0.9, 0.1), acceptance) == pytest.approx(0.4)


def test_a_calibrated_confidence_feeds_the_goodput_stop_one_candidate_at_a_time():
    logq = np.log([0.2, 0.5, 0.9])
    fitted = estimates.CalibratedConfidence(q=np.array([0.0, 1.0]), acceptance=np.array([0.0, 1.0]))
    log_a = fitted.log_accept(logq)
    assert log_a.shape == (3,) and np.all(log_a <= 0)
    assert np.allclose(np.exp(log_a), [0.2, 0.5, 0.9])
    stop = rules.GoodputStop(FLAT, 1.0, MAX_K)  # one candidate at a time, as a decoder feeds it
    assert isinstance(stop(float(fitted.log_accept(logq[2]))), bool)


def test_make_calibrate_fits_a_label_folder_and_reports_its_ece(label_config, tmp_path, capsys):
    """``python -m decoding.calibrate`` fits on the traces' rows of the train split, writes a file that loads to the
    same map, and prints the ECE of the raw and the calibrated q on the rows it fitted and on held-out rows; a
    missing label folder is one line, and nothing is written."""
    import subprocess
    import sys

    from data_gen.run import run_labels
    from decoding import calibrate
    from decoding.traces import trace_rows

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    out = tmp_path / "calibrations" / "draft.json"
    fitted = calibrate.main(["--labels", str(cfg.output_dir), "--out", str(out), "--heldout", str(cfg.output_dir)])
    loaded = estimates.CalibratedConfidence.load(out)
    train = trace_rows(cfg.output_dir, ("train",), calibrate.COLUMNS)
    assert loaded.rows == len(train["acceptance"]) > 0
    assert np.array_equal(loaded.log_accept(train["logp_draft"]), fitted.log_accept(train["logp_draft"]))
    text = capsys.readouterr().out
    for name, splits in (("fitted on", ("train",)), ("held out", ("val", "test"))):
        rows = trace_rows(cfg.output_dir, splits, calibrate.COLUMNS)
        ece = calibrate.errors(fitted, rows)
        assert (f"{name} ({cfg.output_dir}: {', '.join(splits)}, {len(rows['acceptance'])} rows): "
                f"q(Y_i) {ece['q(Y_i)']:.4f}, isotonic q(Y_i) {ece['isotonic q(Y_i)']:.4f}") in text
    assert calibrate.errors(fitted, train)["isotonic q(Y_i)"] <= calibrate.errors(fitted, train)["q(Y_i)"]
    missing = subprocess.run([sys.executable, "-m", "decoding.calibrate", "--labels", str(tmp_path / "nowhere"),
                              "--out", str(tmp_path / "never.json")], capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.startswith("error: ") and missing.stderr.count("\n") == 1
    assert "manifest.json not found" in missing.stderr and not (tmp_path / "never.json").exists()
    # the rows fitted on are not held out ones
    with pytest.raises(SystemExit):
        calibrate.main(["--labels", str(cfg.output_dir), "--splits", "val", "--out", str(tmp_path / "v.json"),
                        "--heldout", str(cfg.output_dir)])
    assert "share val" in capsys.readouterr().err and not (tmp_path / "v.json").exists()
    # what the rows came from, for the decoder to check
    assert loaded.fitted["draft"]["name"] == "tiny-draft"
    assert loaded.fitted["sampling"]["temperature"] == cfg.sampling.temperature
    check_calibration_is_refused_elsewhere(loaded, cfg)


def check_calibration_is_refused_elsewhere(calibration, cfg):
    """The goodput policy on a calibration refuses, in one line, a decoding at another sampling (greedy: acceptance
    is an argmax match there) and a draft other than the one its rows came from."""
    import torch

    from core.identity import IdentityError
    from core.models import load_model
    from core.sampling import Sampling
    from decoding.estimates import EstimateFileError
    from decoding.policies import build_policy
    from decoding.state import ModelPair

    draft, _, _ = load_model(cfg.draft, "float32")
    target, _, _ = load_model(cfg.target, "float32")
    policy = build_policy("goodput", calibration=calibration, costs=CPU, max_k=MAX_K)
    same = ModelPair(draft, target, eos_token_ids=[], sampling=Sampling(temperature=1.0, max_new_tokens=4))
    policy.generate(same, [1, 10], torch.Generator().manual_seed(0))
    greedy = ModelPair(draft, target, eos_token_ids=[], sampling=Sampling(temperature=0.0, max_new_tokens=4))
    with pytest.raises(EstimateFileError, match="fitted on rows labeled at"):
        policy.generate(greedy, [1, 10], torch.Generator().manual_seed(0))
    other = ModelPair(target, target, eos_token_ids=[], sampling=Sampling(temperature=1.0, max_new_tokens=4))
    with pytest.raises(IdentityError, match="the calibration was fitted on rows of draft 'tiny-draft'"):
        policy.generate(other, [1, 10], torch.Generator().manual_seed(0))


# llama.cpp's costs on a 2-core CPU (runs/bench/timing-llama_cpp-2t.json): a draft step 0.70 of a target step, and a
# verification that costs about its length
LLAMA_CPU = CostModel.by_length(draft=0.70, verify=lambda m: 1.0 if m == 1 else 0.5 + 0.75 * m, name="llama.cpp")


def test_where_no_round_can_pay_the_policy_drafts_nothing(tiny_pair):
    """At costs where even a round whose every candidate is kept is slower than target-only, the goodput policy
    runs target-only rounds (no draft forward) and the replay agrees; at the CPU costs above drafting pays."""
    import torch
    from transformers import AutoModelForCausalLM

    from core.sampling import Sampling
    from decoding.policies import build_policy
    from decoding.state import ModelPair
    from decoding.traces import Trace

    assert not rules.GoodputStop(LLAMA_CPU, LLAMA_CPU.target_only_rate(), MAX_K).drafting_pays
    assert rules.GoodputStop(CPU, CPU.target_only_rate(), MAX_K).drafting_pays
    calibration = estimates.CalibratedConfidence(q=np.array([0.0, 1.0]), acceptance=np.array([0.2, 0.95]))
    models = [AutoModelForCausalLM.from_pretrained(d).eval() for d in tiny_pair]
    pair = ModelPair(*models, eos_token_ids=[], sampling=Sampling(temperature=1.0, max_new_tokens=12))
    for costs, drafts in ((LLAMA_CPU, False), (CPU, True)):
        policy = build_policy("goodput", calibration=calibration, costs=costs, max_k=MAX_K)
        result = policy.generate(pair, [1, 10, 11], torch.Generator().manual_seed(0))
        target_only = build_policy("target_only").generate(pair, [1, 10, 11], torch.Generator().manual_seed(0))
        assert (result.stats.draft_calls > 0) == drafts
        if not drafts:
            assert result.tokens == target_only.tokens and result.stats.target_calls == 12
        trace = Trace(prompt_id=0, acceptance=np.full(30, 0.9), logp_draft=np.full(30, -0.1),
                      entropy_draft=np.zeros(30), hidden=torch.zeros(30, 4), hidden_prev=torch.zeros(30, 4))
        lengths = type(policy).replay_lengths(trace, MAX_K, calibration=calibration, costs=costs)
        assert (lengths.sum() > 0) == drafts
    # a calibration fitted at temperature 1 is not read where no round can pay, so greedy decoding takes it there
    from core.identity import model_identity
    from decoding.estimates import EstimateFileError

    calibration.fitted = {"draft": model_identity(models[0]), "sampling": {"temperature": 1.0, "top_k": 0,
                                                                           "top_p": 1.0}}
    greedy = ModelPair(*models, eos_token_ids=[], sampling=Sampling(temperature=0.0, max_new_tokens=12))
    result = build_policy("goodput", calibration=calibration, costs=LLAMA_CPU, max_k=MAX_K).generate(
        greedy, [1, 10, 11], torch.Generator().manual_seed(0))
    assert result.tokens == build_policy("target_only").generate(greedy, [1, 10, 11],
                                                                 torch.Generator().manual_seed(0)).tokens
    with pytest.raises(EstimateFileError, match="fitted on rows labeled at"):
        build_policy("goodput", calibration=calibration, costs=CPU, max_k=MAX_K).generate(
            greedy, [1, 10, 11], torch.Generator().manual_seed(0))
    # a calibration of another draft is refused even where it would not be read
    from core.identity import IdentityError

    other = ModelPair(models[1], models[1], eos_token_ids=[], sampling=Sampling(temperature=0.0, max_new_tokens=12))
    with pytest.raises(IdentityError, match="the calibration was fitted on rows of draft"):
        build_policy("goodput", calibration=calibration, costs=LLAMA_CPU, max_k=MAX_K).generate(
            other, [1, 10, 11], torch.Generator().manual_seed(0))
