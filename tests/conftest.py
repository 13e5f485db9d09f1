"""Shared fixtures: tiny random-init Llama pairs (built from configs, nothing downloaded) and label runs."""

from __future__ import annotations

import pytest

from data_gen.labeler import Sampling
from data_gen.models import ModelSpec
from data_gen.prompts import PromptConfig
from data_gen.run import LabelConfig
from data_gen.tiny import make_pair, write_prompts


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
        kw = dict(
            draft=ModelSpec(path=str(draft), name="tiny-draft"),
            target=ModelSpec(path=str(target), name="tiny-target"),
            prompts=PromptConfig(source=str(prompt_file), response_field="answer"),
            sampling=Sampling(max_new_tokens=6),
            output_dir=str(tmp_path / "labels"),
            batch_size=3,
            accelerator="cpu",
            devices=1,
        )
        kw.update(overrides)
        return LabelConfig(**kw)

    return make
