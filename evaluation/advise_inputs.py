"""The inputs of ``specheads advise``, each refused in one line where it cannot serve: the label folder's traces,
the timing file (its backend, device, precisions and shapes against the labels') and our estimates (``--heads``,
``--calibration``, ``--lookup_calibration``) against the labels' models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from core.backends import backend, backend_of
from core.device import describe_device, same_device
from core.errors import SettingError
from core.runfolder import read_json
from core.shards import read_manifest
from decoding.costs import find_entry, read_timing
from evaluation.advice_rules import RUNTIME_OF_BACKEND, TRANSFORMERS, VLLM
from evaluation.bench_timing_binaries import TIMED_THROUGH_BINDING


def check_labels(labels: str) -> tuple[dict, dict]:
    """The manifest and run settings of a label folder, or one line."""
    return read_manifest(labels), read_json(Path(labels) / "run.json", "label the folder again")


def check_inputs(a) -> tuple:
    """The labels' manifest and run settings, the costs and what timed them, each refused in one line where it
    cannot serve."""
    manifest, run = check_labels(a.labels)
    made_on = backend_of(manifest["models"]["draft"]).name
    runtime = a.runtime or RUNTIME_OF_BACKEND[made_on]
    # vLLM runs the checkpoints transformers does: traces made there price it too
    priced = {RUNTIME_OF_BACKEND[made_on]} | ({VLLM} if RUNTIME_OF_BACKEND[made_on] == TRANSFORMERS else set())
    if runtime not in priced:
        raise SettingError(f"--runtime {a.runtime_flag}: the labels were made on {made_on}, whose traces price "
                           f"{' and '.join(sorted(priced))}; label with `backend: {traced_on(runtime)}` for {runtime}")
    a.runtime = runtime
    try:
        timing = json.loads(Path(a.timing).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        timing = None  # read_timing says what is wrong with it
    if isinstance(timing, dict) and timing.get("backend", "transformers") != made_on:
        raise SettingError(f"--timing {a.timing} timed backend {timing.get('backend', 'transformers')}, the labels "
                           f"were made on {made_on}: time this device with `specheads bench-timing --backend "
                           f"{made_on}`")
    temperature = manifest["sampling"]["temperature"]
    if runtime == TRANSFORMERS and temperature != 0:
        raise SettingError(f"--labels {a.labels}: sampled traces (temperature {temperature}); transformers' assisted "
                           "generation is replayed along greedy ones: label with temperature 0")
    # a transformers timing prices the precisions the traces ran at; vLLM's device times its own (a GPU's timing file
    # holds the precision it ran at), and the traces stand in for its acceptance
    roles = {} if backend(made_on).own_threads or runtime == VLLM else {
        role: f"{role}@{precision(manifest['models'][role])}" for role in ("draft", "target")}
    if runtime == VLLM and isinstance(timing, dict):
        for role in ("draft", "target"):
            held = [m.get("precision") for m in timing.get("models", []) if m.get("name") == role]
            if len(held) > 1:
                raise SettingError(f"--timing {a.timing} holds the {role} at {', '.join(map(str, held))}: vLLM's "
                                   "advice prices one precision of each; time the ones vLLM runs, alone")
    costs = read_timing(a.timing, **roles)
    here = describe_device("cpu", threads=costs.threads)
    if not same_device(costs.device, here) and not a.other_device:
        raise SettingError(f"--timing {a.timing} was timed on {costs.device or 'an unnamed device'}, not on this "
                           f"{here}: time this one, or pass --other_device for advice on that device")
    for role in ("draft", "target"):
        timed = next((m.get("shape") for m in timing["models"] if m["name"] == role), None)
        labeled = manifest["models"][role]["name"]
        if timed is not None and not same_shape(timed, manifest["models"][role]):
            raise SettingError(f"--timing {a.timing} timed {role} {timed!r}, the labels' {role} is {labeled!r}: time "
                               "this pair")
    check_estimates(a, manifest)
    if runtime == TRANSFORMERS and not all("generate_call" in find_entry(timing, roles[r]) for r in roles):
        print(f"advise: --timing {a.timing} was timed without `bench-timing --generate`: the predictions leave out "
              "what generate() adds to the bare forwards (its sampler, each assistant call's setup)",
              file=sys.stderr)
    return manifest, run, costs, timed_with(timing), timed_context(timing)


def precision(model: dict) -> str:
    """How a model of a label manifest ran, as a transformers timing file names its entries' precision."""
    return model["quantization"] if model.get("quantization", "none") != "none" else model["dtype"]


def timed_with(timing: dict) -> str:
    """What timed a timing file: llama.cpp's binaries, the decoder through the binding, or transformers' forwards."""
    default = TIMED_THROUGH_BINDING if backend_of(timing).own_threads else "bench-timing (transformers)"
    return timing.get("timed_with", default)


def timed_context(timing: dict) -> int | None:
    """The cache length a timing file's draft step was timed after (its shortest), None where it records none."""
    entry = next((m for m in timing.get("models", []) if m.get("name") == "draft"), None)
    return min(map(int, entry["decode"])) if entry and entry.get("decode") else None


def traced_on(runtime: str) -> str:
    """The backend whose traces price ``runtime`` (vLLM's: transformers', which runs the same checkpoints)."""
    return next((b for b, r in RUNTIME_OF_BACKEND.items() if r == runtime), "transformers")


def same_shape(timed: str, labeled: dict) -> bool:
    """Whether a timing file's entry (its ``shape``: llama.cpp's model name, or a transformers shape built in to
    ``bench-timing``) is of the labels' model; a shape given as a path is taken at its word."""
    from evaluation.bench_timing import BUILTIN

    if timed in BUILTIN:
        return all(BUILTIN[timed][k] == labeled.get(k, BUILTIN[timed][k]) for k in ("hidden_size", "vocab_size"))
    return timed == labeled["name"] or Path(timed).exists()


def read_estimates(a) -> None:
    """Read our estimates (``--heads``, ``--calibration``, ``--lookup_calibration``) before anything is traced or
    timed, refusing in one line a verifier head, a head reading features the traces do not hold, or a calibration
    of the other kind; ``a.lookup`` holds the loaded prompt-lookup calibration."""
    from decoding.estimates import CalibratedConfidence
    from decoding.lookup_stop import LookupCalibration
    from decoding.simulate import replayable
    from heads.export import read_metadata

    a.heads = list(dict.fromkeys(a.heads))  # a head named twice is priced once
    for head in a.heads:
        role = read_metadata(head).get("role")
        if role != "stop":
            raise SettingError(f"--heads {head}: a {role or 'roleless'} head; the advice prices exact stop rules "
                               "along the target's responses, and a verifier changes the output: judge it with "
                               "`make eval`")
        if not replayable(head):
            raise SettingError(f"--heads {head} reads features the traces do not hold")
    if a.calibration is not None:
        if LookupCalibration.holds_one(a.calibration):
            raise SettingError(f"--calibration {a.calibration} is prompt lookup's: give it as --lookup_calibration")
        CalibratedConfidence.load(a.calibration)
    a.lookup = None if a.lookup_calibration is None else LookupCalibration.load(a.lookup_calibration)


def check_estimates(a, manifest: dict) -> None:
    """Refuse, in one line, an estimate of ours made for another model than the labels': a head or calibration of
    another draft, a prompt-lookup calibration of another target."""
    from decoding.estimates import CalibratedConfidence
    from heads.export import check_labels

    for head in a.heads:
        check_labels(head, manifest, a.labels)
    if a.calibration is not None:
        CalibratedConfidence.load(a.calibration).check_draft(manifest["models"]["draft"],
                                                             f"the draft of the labels in {a.labels}")
    if a.lookup is not None:
        a.lookup.check_target(manifest["models"]["target"], f"the target of the labels in {a.labels}")
        fitted_at = (a.lookup.fitted or {}).get("sampling", {}).get("temperature")
        if fitted_at is not None and fitted_at != manifest["sampling"]["temperature"]:
            print(f"advise: --lookup_calibration {a.lookup_calibration} was fitted on responses at temperature "
                  f"{fitted_at:g}, the traces are at {manifest['sampling']['temperature']:g}: its keep chance is "
                  "another sampling's", file=sys.stderr)
