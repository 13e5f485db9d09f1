"""``scripts/lookup_target_state.py``, the offline measurement of whether the target's own state tells prompt
lookup's stop where a copy breaks: on tiny labels made in llama.cpp it reads the target's states, fits, and prints
each estimate's AUROC and replay beside the calibration's."""

from __future__ import annotations

import dataclasses
import json

import pytest


def test_the_script_prices_each_estimate_beside_the_calibration(tiny_pair, tmp_path, capsys):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make install` (make test needs it)")
    from test_eval_latency import timing_file

    from core.models import ModelSpec
    from data_gen.run import run_labels
    from decoding import calibrate
    from scripts import lookup_target_state
    from testing.tiny import label_config, write_prompts
    from testing.tiny_gguf import write_gguf

    gguf = [write_gguf(path, tmp_path / f"{path.name}.gguf") for path in tiny_pair]
    specs = {role: ModelSpec(path=str(g), tokenizer=str(t), name=f"tiny-{role}")
             for role, g, t in zip(("draft", "target"), gguf, tiny_pair)}
    base = label_config(*tiny_pair, write_prompts(tmp_path / "prompts.jsonl", n=12), tmp_path / "labels",
                        max_new_tokens=24)
    cfg = dataclasses.replace(base, backend="llama_cpp", threads=1, categories=["target"],
                              split_fractions=(0.5, 0.25, 0.25), **specs,
                              prompts=dataclasses.replace(base.prompts, response_field=None),  # its own greedy
                              sampling=dataclasses.replace(base.sampling, temperature=0.0))
    run_labels(cfg, quiet=True)
    timing, calibration = tmp_path / "timing.json", tmp_path / "lookup.json"
    timing.write_text(json.dumps(timing_file()))
    calibrate.main(["--labels", cfg.output_dir, "--splits", "train", "--prompt_lookup", "1", "4", "--out",
                    str(calibration)])
    capsys.readouterr()
    lookup_target_state.main(["--labels", cfg.output_dir, "--heldout", cfg.output_dir,
                              "--calibration", str(calibration), "--timing", str(timing), "--m", "4",
                              "--components", "0", "2", "--C", "1", "--head_depths", "1", "--epochs", "2",
                              "--threads", "1"])
    printed = capsys.readouterr().out
    assert "calibration (match length):" in printed and "target state on   2 components, C 1:" in printed
    assert "SpecDec++ head, depth 1, whole state:" in printed
    assert printed.count("over the calibration's") == 3 and printed.count("x the calibration's") == 4
    assert "oracle" in printed


def test_a_round_reads_the_state_that_produced_the_token_before_it(tiny_pair, tmp_path):
    """Row i of the states is the target's state that produced response token i: along the target's own greedy
    response its top token is the response's token, so the state a round at s reads (row s − 1) is the one the stop
    holds after the token s − 1, never one that has seen a candidate."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make install` (make test needs it)")
    import numpy as np

    from core.llama_cpp import LlamaCppModel
    from scripts.lookup_target_state import Response
    from testing.tiny_gguf import write_gguf

    target = LlamaCppModel(write_gguf(tiny_pair[1], tmp_path / "target.gguf"), threads=1, n_ctx=256)
    prompt = [5, 9, 12, 7, 5, 9]
    response = []
    for _ in range(20):  # the target's greedy response, one token at a time
        target.reset()
        response.append(int(target.read(prompt + response)[1][-1].argmax()))
    r = Response(prompt, response, target, n=1, m=4, max_new=20)
    assert np.array_equal(r.top_token, response) and r.hidden.shape[0] == len(response)
    assert np.array_equal(r.start_state(3)[0], r.hidden[2])
