"""Every decoding policy, one small class each; importing this package registers them all."""

from evaluation.policies import baselines, fuzzy, specdecpp, speculative, sprinter, training_free  # noqa: F401
