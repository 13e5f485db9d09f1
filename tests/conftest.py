"""Shared fixtures: tiny random-init Llama pairs (built from configs, nothing downloaded) and label runs."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from data_gen.config import LabelConfig
from testing import tiny
from testing.tiny import make_pair, write_prompts

# Tiny models run fastest on one thread, and one thread per test process keeps the suite's time steady when
# something else (a labeling run) holds the cores. Subprocesses started by tests inherit the setting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
# Digests of the files tests write are remembered in a cache of the tests' own, not in the user's.
os.environ.setdefault("SPECHEADS_CACHE", tempfile.mkdtemp(prefix="specheads-tests-"))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(draft_dir, target_dir) of a 2-layer Llama pair; the draft is a perturbed copy of the target."""
    return make_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def prompt_file(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", n=16)


@pytest.fixture
def label_config(tiny_pair, prompt_file, tmp_path):
    """A LabelConfig for the tiny pair; call it with overrides."""

    def make(**overrides) -> LabelConfig:
        draft, target = tiny_pair
        kw = {"output_dir": tmp_path / "labels", "max_new_tokens": 6, "batch_size": 3, **overrides}
        return tiny.label_config(draft, target, prompt_file, **kw)

    return make
