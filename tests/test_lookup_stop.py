"""Prompt lookup's goodput stop (decoding.lookup_stop): the match a proposal is copied from, the label rows along a
response, the round length the rule chooses, the oracle over proposals, the calibration file, and the commands
that fit it (`specheads calibrate --prompt_lookup`) and replay it (`specheads simulate --lookup_calibration`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from decoding import rules
from decoding.costs import CostModel
from decoding.lookup_stop import (LookupCalibration, LookupCalibrationError, LookupGoodput, best_length,
                                  lookup_rows)
from decoding.replay import prompt_lookup_counts, prompt_lookup_oracle_counts


def test_a_match_is_where_the_proposal_is_copied_from_and_how_far_back_the_text_repeats_it():
    seq = [7, 1, 2, 3, 4, 8, 1, 2]  # the last 2-gram [1, 2] first appears at 1, followed by [3, 4]
    assert rules.ngram_simple_match(seq, 2, 2) == (3, [3, 4])
    assert rules.match_length(seq, 3) == 2  # 7 before the source, 8 before the end
    assert rules.match_length([8, *seq[1:]], 3) == 3  # back to the start of the text
    assert rules.ngram_simple_match(seq[:5], 2, 2) == (-1, [])  # too short to look up


def test_label_rows_follow_each_proposal_to_its_first_rejection():
    """At each position with a proposal: its candidates up to the first the response does not repeat, each with its
    match length (the round's, plus the kept candidates before it)."""
    prompt = [5, 1, 2, 3, 6, 1]
    # position 0: [1] looked up at 1, proposal [2, 3], match 1: 2 kept, 3 not (4 follows)
    # position 1: [2] looked up at 2, proposal [3, 6], match 2: rejected at once
    rows = lookup_rows(prompt, [2, 4], 1, 2)
    assert rows.length.tolist() == [1, 2, 2] and rows.kept.tolist() == [True, False, False]
    assert rows.start.tolist() == [0, 0, 1] and rows.place.tolist() == [0, 1, 0]


def test_the_rule_submits_the_candidates_worth_their_verification():
    verify = np.array([0.0, 1.0, 1.2, 1.5])
    # E(L) − λ·verify(L + 1) at λ = 1: 0, 0.7, 0.85; at λ = 2: −1, −0.5, −0.65
    assert best_length(np.array([0.9, 0.5]), verify, 1.0) == 2
    assert best_length(np.array([0.9, 0.5]), verify, 2.0) == 1
    assert best_length(np.array([0.05, 0.5]), verify, 1.0) == 0  # a step alone beats a likely rejection
    calibration = LookupCalibration(length=[1.0, 4.0], keep=[0.1, 0.9], n=1)
    assert calibration.chances(1, 3).tolist() == pytest.approx([0.1, 0.1 + 0.8 / 3, 0.1 + 1.6 / 3])
    rule = LookupGoodput(calibration, CostModel.by_length(0.0, verify=lambda m: 1.0 + 0.1 * (m - 1)), 1.0, 3)
    seq = [7, 1, 2, 3, 4, 8, 1, 2]
    assert rule(seq, 3, [3, 4]) == 2  # a match of 2: chances 0.37, 0.63, each worth its 0.1


def random_response(rng, length: int) -> tuple[list[int], list[int]]:
    """A prompt and a response over few tokens, repeating themselves: proposals kept and rejected."""
    prompt = list(rng.integers(0, 4, size=12))
    response = [int(t) for t in rng.integers(0, 4, size=length)]
    for i in range(0, length - 4, 5):  # copies of the prompt's stretches
        start = int(rng.integers(0, 8))
        response[i:i + 4] = prompt[start:start + 4]
    return prompt, response


def brute_force_cost(prompt, response, n, m, costs) -> float:
    """The least cost to the end over every sequence of round lengths, by recursion from the start."""
    from functools import cache

    @cache
    def cost(s):
        if s >= len(response):
            return 0.0
        _, proposal = rules.prompt_lookup_proposal(prompt + response[:s], n, m, len(response) - s - 1, ())
        kept = 0
        while kept < len(proposal) and response[s + kept] == proposal[kept]:
            kept += 1
        return min(costs.verify(L + 1) + cost(s + min(L, kept) + 1) for L in range(len(proposal) + 1))
    return cost(0)


def test_the_oracle_is_the_least_cost_of_any_rule_and_no_rule_beats_it():
    """The oracle's counts cost what a search over every round length finds, and no rule costs less: the fixed
    length, the goodput stop at several rates, random cuts. An oracle that always submits the whole proposal (the
    fixed rule) is told apart: it costs more than the search on these responses."""
    rng = np.random.default_rng(0)
    costs = CostModel.by_length(0.0, verify=[0.0, 1.0, 1.4, 1.6, 2.5, 2.6])  # a jump, as a CPU's blocking
    calibration = LookupCalibration(length=[1.0, 6.0], keep=[0.3, 0.95], n=1)
    worse = 0
    for _ in range(12):
        prompt, response = random_response(rng, 16)
        oracle = prompt_lookup_oracle_counts(prompt, response, 1, 4, len(response), costs)
        assert costs.price(oracle) == pytest.approx(brute_force_cost(prompt, response, 1, 4, costs))
        assert oracle.n == len(response)
        fixed = prompt_lookup_counts(prompt, response, 1, 4, len(response))
        worse += costs.price(fixed) > costs.price(oracle) + 1e-9
        rules_ = [None, *(LookupGoodput(calibration, costs, rate, 4) for rate in (0.5, 1.0, 2.0)),
                  lambda seq, source, proposal: int(rng.integers(0, len(proposal) + 1))]
        for rule in rules_:
            counts = prompt_lookup_counts(prompt, response, 1, 4, len(response), length=rule)
            assert costs.price(counts) >= costs.price(oracle) - 1e-9
    assert worse >= 6
    from evaluation.simulate_lookup import priced_interval

    one = priced_interval([oracle], costs)  # one prompt: its ratio, nothing to resample
    assert one.low == one.value == one.high == pytest.approx(costs.speedup(oracle))


def test_a_calibration_is_fitted_saved_and_refused_where_it_does_not_apply(tmp_path):
    calibration = LookupCalibration.fit(np.array([2, 2, 3, 5, 8, 8]), np.array([0, 1, 0, 1, 1, 1]), n=2)
    assert np.all(np.diff(calibration.keep) >= 0) and calibration.rows == 6
    calibration.rate = 3.5
    calibration.save(tmp_path / "lookup.json")
    loaded = LookupCalibration.load(tmp_path / "lookup.json")
    assert loaded.rate == 3.5 and loaded.n == 2 and loaded.keep.tolist() == calibration.keep.tolist()
    with pytest.raises(LookupCalibrationError, match="fitted on proposals of 2-grams, .* looks up 3-grams"):
        loaded.check_n(3)
    (tmp_path / "other.json").write_text(json.dumps({"estimate": "calibrated_confidence", "q": [0.5]}))
    with pytest.raises(LookupCalibrationError, match="other.json: not a prompt-lookup calibration"):
        LookupCalibration.load(tmp_path / "other.json")
    with pytest.raises(LookupCalibrationError, match="no prompt-lookup rows"):
        LookupCalibration.fit(np.array([]), np.array([]), n=2)
    from decoding.policies import build_policy

    costs = CostModel.by_length(0.0, verify=lambda m: 1.0)
    stop = build_policy("prompt_lookup_goodput", n=2, calibration=tmp_path / "lookup.json", costs=costs)
    assert stop.length.rate == 3.5  # the calibration's own λ
    assert build_policy("prompt_lookup_goodput", n=2, calibration=loaded, costs=costs, lam=1.0).length.rate == 1.0
    with pytest.raises(LookupCalibrationError, match="3-grams"):
        build_policy("prompt_lookup_goodput", n=3, calibration=tmp_path / "lookup.json", costs=costs)
    with pytest.raises(ValueError, match="exactly one of timing"):
        build_policy("prompt_lookup_goodput", n=2, calibration=tmp_path / "lookup.json")
    with pytest.raises(ValueError, match="reads one estimate: a calibration"):
        build_policy("prompt_lookup_goodput", costs=costs)


def test_the_commands_fit_and_replay_it_on_tiny_labels(label_config, tmp_path, capsys):
    """`specheads calibrate --prompt_lookup` fits on the stored responses and finds λ at a timing file's costs;
    `specheads simulate --lookup_calibration` replays the stop beside the fixed length and the oracle."""
    from test_eval_latency import timing_file

    from data_gen.run import run_labels
    from decoding import calibrate
    from evaluation import simulate as sim

    cfg = label_config(max_new_tokens=24, split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps(timing_file()))
    out = tmp_path / "lookup.json"
    fitted = calibrate.main(["--labels", str(cfg.output_dir), "--splits", "train", "--prompt_lookup", "1", "4",
                             "--timing", str(timing), "--out", str(out), "--heldout", str(cfg.output_dir)])
    printed = capsys.readouterr().out
    assert fitted.rows > 0 and fitted.rate > 0 and LookupCalibration.load(out).rate == fitted.rate
    assert "held out (" in printed and "AUROC" in printed and "λ " in printed
    from core.identity import IdentityError
    from core.shards import read_manifest

    models = read_manifest(cfg.output_dir)["models"]
    assert LookupCalibration.holds_one(out)
    fitted.check_target(models["target"], "this target")
    with pytest.raises(IdentityError, match="fitted on responses of target .*, this eval's target is another"):
        fitted.check_target(models["draft"], "this eval's target")
    sim.main(["--labels", str(cfg.output_dir), "--splits", "val", "test", "--heads", "--c", "0.1",
              "--timing", str(timing), "--lookup_calibration", str(out)])
    printed = capsys.readouterr().out
    assert "oracle" in printed and f"goodput stop, calibration (λ {fitted.rate:.3f}, the calibration's)" in printed
    with pytest.raises(SystemExit):
        calibrate.main(["--labels", str(cfg.output_dir), "--timing", str(timing), "--out", str(tmp_path / "x.json")])
    assert "give --prompt_lookup" in capsys.readouterr().err
