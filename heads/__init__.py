"""Heads on the draft's last hidden state: plain ``nn.Module``s, a registry, and safetensors export."""

from heads import resnet, sprinter  # noqa: F401  (registers the head types)
from heads.registry import HEADS, build_head, head_class, register

__all__ = ["HEADS", "build_head", "head_class", "register"]
