"""Where a timing file (``specheads bench-timing``) was made, its device and backend, and the one-line notes a
command prints when that is not where it runs: costs timed elsewhere may not hold here."""

from __future__ import annotations

import json
from pathlib import Path

from core.identity import TRANSFORMERS
from core.device import same_device


def timing_device(path: str | Path) -> str | None:
    """The device a ``bench_timing`` file says it was timed on; None where it does not say (``read_timing`` names
    what is wrong with a file where its costs are read)."""
    return _recorded(path, "device", None)


def other_device(path: str | Path, here: str) -> str | None:
    """A one-line note when the ``bench_timing`` file at ``path`` was timed on another device than ``here``
    (``core.device.describe_device``): its costs by verification length, which a goodput stop prices rounds with,
    may not hold here. None when it was timed here."""
    recorded = timing_device(path)
    if same_device(recorded, here):
        return None
    return (f"{path} was timed on {recorded or 'an unnamed device'}, not on this {here}: the goodput stop prices "
            f"rounds with its costs; run `make bench-timing` here for this device's")


def other_backend(path: str | Path, backend: str) -> str | None:
    """A one-line note when the timing file at ``path`` timed the forwards of another backend than ``backend``
    (``core.backends``): a goodput stop would price its rounds with the costs of kernels that do not run here."""
    recorded = _recorded(path, "backend", TRANSFORMERS)
    if recorded in (None, backend):
        return None
    return (f"{path} was timed on backend {recorded}, not on this eval's {backend}: the goodput stop prices rounds "
            f"with its costs; run `specheads bench-timing --backend {backend}` for its own")


def other_decoder(path: str | Path, decoder: str) -> str | None:
    """A one-line note when the timing file at ``path`` timed another of our decoder's forwards (``eager``,
    ``static``, ``graphs``, ``compiled``: ``decoding.state.DECODERS``) than ``decoder``: their costs differ several
    times over on one device (``docs/results.md``), so a goodput stop would price rounds that do not run here."""
    recorded = _recorded(path, "decoder", "eager")
    if recorded in (None, decoder):
        return None
    return (f"{path} timed the {recorded} decoder's forwards, this eval runs the {decoder} one: the goodput stop "
            "prices rounds with its costs; time that one (`specheads bench-timing` times the eager decoder, "
            "scripts/gpu_check.sh the graphs and compiled ones)")


def _recorded(path: str | Path, key: str, default: str | None) -> str | None:
    """What a timing file records under ``key`` (``default`` where it records nothing); None where it cannot be
    read (``read_timing`` names what is wrong with it where its costs are read)."""
    try:
        return json.loads(Path(path).read_text()).get(key, default)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
