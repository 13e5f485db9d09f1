"""Evaluation stage: the speculative decoder and its policies (``build_policy``), loading exported heads."""

from evaluation.decoder import DecodeResult, DecodeStats, ModelPair, Policy
from evaluation.policies import build_policy

__all__ = ["DecodeResult", "DecodeStats", "ModelPair", "Policy", "build_policy"]
