"""Every decoding policy, one small class each; importing this package registers them all."""

from evaluation.policies import baselines, fuzzy, specdecpp, sprinter, speculative, training_free  # noqa: F401
