"""What a device is, in words: the description a timing profile is recorded with (``make bench-timing``) and
checked against where its costs are used, since per-forward costs hold only on the device that timed them."""

from __future__ import annotations

import re
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or ``cpu`` where the system does not say."""
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        found = None
    return found.group(1).strip() if found else "cpu"


def describe_device(device: torch.device | str = "cpu", threads: int | None = None) -> str:
    """``NVIDIA H100 80GB HBM3`` for a GPU; ``cpu (<model>, N threads)`` for the CPU: the thread count is part of
    it, since a CPU's costs scale with the threads the models run on (``threads``: a backend's own, such as
    llama.cpp's; None: torch's)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({cpu_model()}, {threads or torch.get_num_threads()} threads)"


def same_device(recorded: str | None, here: str) -> bool:
    """Whether a profile recorded on ``recorded`` describes ``here``; a profile written before descriptions named
    the CPU model (``cpu (cpu, …)``, ``cpu (x86_64, …)``) matches any CPU with the same thread count."""
    if recorded is None:
        return False
    old = re.fullmatch(r"cpu \((?:cpu|x86_64|aarch64|arm64|), (\d+) threads\)", recorded)
    if old is not None:
        return here.startswith("cpu (") and here.endswith(f", {old.group(1)} threads)")
    return recorded == here
