"""``make export-hf``: an exported head as a folder in transformers' ``custom_generate`` layout.

    OUT/
      README.md                         the usage snippet, the head's metadata and metrics
      <head>.safetensors                the head file, as ``make train`` exported it
      custom_generate/generate.py       ``decoding/runtimes/hf.py``, copied
      custom_generate/<module>.py       the project modules it (and the head's type) imports, copied with their
                                        ``decoding.``/``heads.``/``core.`` imports made relative:
                                        ``decoding/rules.py``, ``heads/exported.py``, ``heads/export.py``, the
                                        head's module, ``core/label_math.py``, …
      custom_generate/bundled_head.py   the head file's bytes (transformers copies only a folder's Python files
                                        into its module cache, and tells its ``generate`` no path)
      custom_generate/bundled_costs.py  with ``--timing FILE``, its cost model (``decoding.costs.CostModel`` as
                                        JSON), so a stop head runs the goodput stop (else None)
      custom_generate/bundled_calibration.py  with ``--calibration FILE`` (and ``--timing``), a calibrated draft
                                        confidence, whose estimates the goodput stop then reads in place of the
                                        head's (else None)
      custom_generate/requirements.txt  torch, transformers, safetensors
      .specheads-export.json            the files above: what a later export into OUT may replace

OUT must be a new or empty folder, or one this command wrote before (it has the marker file): a folder holding
anything else, a file, and the current directory are refused before anything is written, and a later export removes
only the files its marker lists. The head file is loaded and checked (digests, finite weights) first.

``target.generate(**inputs, assistant_model=draft, custom_generate=OUT, trust_remote_code=True)`` then runs the
head with nothing of this project installed. Usage: ``specheads export-hf HEAD OUT``.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import re
import sys
from pathlib import Path

import transformers

from core.arguments import CommandParser, description, path_argument, resolve_paths
from core.errors import UserError
from core.quantization import NONE, QUANTIZATIONS
from core.runfolder import RunFolder, replace_folder
from decoding.costs import read_timing
from decoding.timing_provenance import timing_device
from decoding.estimates import CalibratedConfidence
from heads.export import load_head
from heads.registry import HEADS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("decoding", "heads", "core")
"""Project packages the runtime may import from; their modules are copied into the folder."""
RUNTIME = ROOT / "decoding" / "runtimes" / "hf.py"
_IMPORT = re.compile(rf"^(\s*)from (?:{'|'.join(PACKAGES)})\.(\w+) import ", flags=re.MULTILINE)
ALGORITHMS = {
    "stop": ("SpecDec++", "drafts until the head's predicted probability that some candidate is rejected exceeds "
             "h, then verifies the round with transformers' own speculative sampling: the output is the target's "
             "distribution (greedy: the target's greedy tokens)"),
    "verifier": ("SPRINTER", "keeps each draft token the verifier accepts without the target; at the first it "
                 "rejects, the target runs once and keeps that token with probability min(1, p/q). Approximate: "
                 "the output mixes in the draft's distribution where the verifier accepts wrongly"),
}


class ExportError(UserError, ValueError):
    """The folder cannot be written there, or a module it would need cannot be copied into it."""


def _project_imports(source: str, where: str) -> list[str]:
    """The project modules (``heads.x``, ``core.x``) a module's text imports; one that cannot be made relative
    in a flat folder (``import heads``, ``from heads import x``) is an error."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top, _, rest = name.partition(".")
            if top in PACKAGES:
                if isinstance(node, ast.Import) or not rest or "." in rest:
                    raise ExportError(f"{where}: `{name}` must be imported as `from {top}.<module> import …` to be "
                                      "copied into a custom_generate folder")
                found.append(name)
    return found


def module_closure(sources: dict[str, str]) -> dict[str, Path]:
    """Every project module the given module texts ({name: text}) import, directly or not: {file name in the
    folder: source file}."""
    files: dict[str, Path] = {}
    todo = list(sources.items())
    while todo:
        where, text = todo.pop()
        for name in _project_imports(text, where):
            source = ROOT.joinpath(*name.split(".")).with_suffix(".py")
            flat = source.name
            if flat in files and files[flat] != source or flat in sources:
                raise ExportError(f"{source} and {files.get(flat, flat)} would both be custom_generate/{flat}")
            if flat not in files:
                files[flat] = source
                todo.append((str(source), source.read_text()))
    return files


def flatten(source: str) -> str:
    """A module's text with its project imports made relative (``from heads.export import`` → ``from .export``)."""
    return _IMPORT.sub(r"\1from .\2 import ", source)


def export_folder(out: Path) -> RunFolder:
    """An export's folder: every file in it is the export's, so that a new export can replace it whole."""
    return RunFolder(out, "export-hf", "--out", whole=True)


def write_folder(head: str | Path, out: str | Path, timing: str | Path | None = None,
                 calibration: str | Path | None = None, rate: float | str = "online") -> Path:
    """Write the folder for the exported head file ``head`` into ``out`` (a new or empty folder, or an earlier
    export, whose files are replaced); everything is checked before anything is written. ``timing``: a
    ``make bench-timing`` JSON whose costs the folder carries, so that a stop head runs the goodput stop;
    ``calibration``: a ``make calibrate`` file the folder carries too, whose estimates that stop then reads (the head
    still names the draft the folder is for); ``rate``: that stop's λ in tokens per second, or ``"online"`` (the
    generation's own tokens per second so far), the folder's default."""
    head, out = Path(head), Path(out)
    _, meta = load_head(head)  # the validating loader: digests and finite weights, before anything is written
    costs = None if timing is None else read_timing(timing)
    if costs is not None and meta["role"] != "stop":
        raise ExportError(f"{head}: a {meta['role']} head has no stop to price; --timing is for a stop head")
    if calibration is not None and costs is None:
        raise ExportError("--calibration gives the goodput stop its estimates, which prices rounds by --timing: "
                          "give both")
    if rate != "online" and not (isinstance(rate, (int, float)) and 0 < rate < float("inf")):
        raise ExportError(f"--rate must be a positive number of tokens per second or online, got {rate!r}")
    calibrated = None if calibration is None else CalibratedConfidence.load(calibration)
    if calibrated is not None:
        calibrated.check_draft(meta["draft"], f"the draft of head {head.name}")
    export_folder(out).check()  # a folder it may not write into is refused before anything is written
    head_class = HEADS.get_class(meta["head"]["type"])
    data = head.read_bytes()
    generated = {
        "generate.py": RUNTIME.read_text(),
        "bundled_head.py": (
            f'"""The head this folder runs: the bytes of ../{head.name} (written by decoding/runtimes/hf_export.py)."""\n\n'
            f"from {head_class.__module__} import {head_class.__name__}  # noqa: F401  (registers the head type)\n\n"
            f"FILE_NAME = {head.name!r}\nSHA256 = {hashlib.sha256(data).hexdigest()!r}\n"
            f"DATA = {base64.b64encode(data).decode()!r}\n"
        ),
    }
    # written whatever the timing: transformers copies every module generate.py imports, and refuses one missing
    generated["bundled_costs.py"] = (
        '"""The cost model (``decoding.costs.CostModel``, as JSON) the goodput stop prices rounds with, from '
        + (f"{Path(timing).name}" if costs is not None else "no timing file (None: the head's threshold runs)")
        + ' (written by decoding/runtimes/hf_export.py)."""\n\n'
        + f"SAVED = {None if costs is None else json.dumps(costs.to_dict())!r}\n"
        + f"RATE = {None if costs is None else rate if rate == 'online' else float(rate)!r}  # the stop's λ, tokens/s\n")
    generated["bundled_calibration.py"] = (
        '"""The calibrated draft confidence the goodput stop reads, from '
        + (Path(calibration).name if calibrated is not None else "no calibration file (None: the head's estimates)")
        + ' (written by decoding/runtimes/hf_export.py)."""\n\n'
        + f"SAVED = {None if calibrated is None else calibrated.to_dict()!r}\n")
    modules = module_closure(generated)
    files = {f"custom_generate/{name}": flatten(text)
             for name, text in {**{n: p.read_text() for n, p in modules.items()}, **generated}.items()}
    files["custom_generate/requirements.txt"] = f"torch\ntransformers>={transformers.__version__}\nsafetensors\n"
    # the folder as the user named it: run from where they exported, generate() finds it there
    files["README.md"] = readme(meta, head.name, str(out), None if costs is None else {
        "timing": Path(timing).name, "device": timing_device(timing) or "an unnamed device", "rate": rate,
        "calibration": None if calibration is None else Path(calibration).name})
    files = {head.name: data, **{name: text.encode() for name, text in files.items()}}

    def build(tmp: Path) -> None:
        export_folder(tmp).start(files)
        for name, content in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(content)

    with export_folder(out).hold("an export"):  # two exports into one folder: the second stops with one line
        export_folder(out).check()  # again under the lock: another export may have written since
        replace_folder(out, build)  # the earlier export stays whole until the new one is
    return out


def readme(meta: dict, file_name: str, folder: str, goodput: dict | None = None) -> str:
    """The folder's README: what it runs, the snippet, the head's metadata and metrics; ``goodput``: what the
    folder's goodput stop runs on (its timing file and device, λ, the calibration), when it carries one."""
    name, what = ALGORITHMS[meta["role"]]
    threshold = meta["threshold"]
    quantization = meta["draft"].get("quantization", NONE)
    inputs = meta.get("inputs", {})
    lines = [
        f"# {name} head for transformers' `generate()`",
        "",
        f"`{file_name}`: a {meta['head']['type']} head (role `{meta['role']}`) trained for the draft "
        f"`{meta['draft'].get('name', '?')}`. With it, `generate()` runs {name}: it {what}.",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        "tokenizer = AutoTokenizer.from_pretrained(TARGET)",
        "target = AutoModelForCausalLM.from_pretrained(TARGET)",
        "draft = AutoModelForCausalLM.from_pretrained(DRAFT)  # the draft the head was trained on",
        *([f"{QUANTIZATIONS[quantization].snippet()}  # quantized as in training ({quantization})"]
          if quantization in QUANTIZATIONS else []),
        'inputs = tokenizer("def fibonacci(n):", return_tensors="pt")',
        f'out = target.generate(**inputs, assistant_model=draft, custom_generate="{folder}", trust_remote_code=True,',
        "                      max_new_tokens=128)  # do_sample, temperature, top_k, top_p as usual",
        "print(tokenizer.decode(out[0]))",
        "```",
        "",
        f"Optional arguments: `threshold=` ({threshold['name']}, default {threshold['value']:g} chosen at export: "
        f"{threshold.get('rule', '')}), `max_k=` (most candidates per SpecDec++ round, default 20), `head=` (another "
        "head file). One sequence at a time (batch size 1), no beam search. The draft is checked against the head: "
        "hidden size, vocabulary, and the digest of the weights it holds and their quantization (the `weights` and "
        "`quantization` of the draft below): load it in float32 or bfloat16, quantized as in training.",
        "",
        "Needs torch, transformers and safetensors only (`custom_generate/requirements.txt`).",
        "",
        *([] if goodput is None else [
            "## The goodput stop",
            "",
            "This folder carries a device's costs, so by default it stops a round by the goodput stop (the project's "
            "`decoding/DESIGN.md`) instead of the threshold: a round ends when no longer round gains more expected "
            "tokens than λ × its extra seconds under the cost of a verification of each length. Its estimates: "
            + (f"the draft's confidence calibrated by `{goodput['calibration']}` (the head then only checks the draft)"
               if goodput["calibration"] else "the head's sigmoids")
            + f". The costs are `{goodput['timing']}`, timed on {goodput['device']}: on another device, time your own "
            "(the project's `make bench-timing`) and export again, or pass `threshold=` to run the head's threshold "
            "rule. λ: "
            + ("`online`, the generation's own tokens per second so far" if goodput["rate"] == "online"
               else f"{float(goodput['rate']):g} tokens/s")
            + "; `rate=` sets it (a number, or `\"online\"`).",
            "",
        ]),
        "## The head",
        "",
        "| field | value |",
        "|---|---|",
        f"| type | `{meta['head']['type']}` {meta['head'].get('init_args', {})} |",
        f"| role | `{meta['role']}` |",
        f"| threshold | {threshold['name']} = {threshold['value']:g} |",
        f"| feature | {inputs.get('hidden', 'draft hidden state')} |",
        f"| draft scores | {', '.join(inputs.get('scores', {})) or 'none'} |",
        f"| label | {meta['label']} |",
        f"| draft | {meta['draft']} |",
        f"| hidden size, vocabulary | {meta['hidden_size']}, {meta['vocab_size']} |",
        "",
        "## Metrics (held-out label rows)",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in meta["metrics"].items()]
    return "\n".join(lines) + "\n"


def _number(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ExportError(f"{flag} must be a number or online, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(description=description(__doc__), prog="specheads export-hf")
    path_argument(parser, "head", "--head", "an exported head file (checkpoints/heads/*.safetensors)")
    path_argument(parser, "out", "--out", "the folder to write")
    parser.add_argument("--timing", default=None,
                        help="a bench_timing JSON: the folder runs a stop head by the goodput stop under its costs")
    parser.add_argument("--rate", default="online",
                        help="with --timing: the goodput stop's λ in tokens per second (e.g. the simulator's), or "
                             "online (the default: the generation's own tokens per second so far)")
    parser.add_argument("--calibration", default=None,
                        help="a calibrated confidence (`make calibrate`; with --timing): the goodput stop reads it in "
                             "place of the head's estimates")
    args = parser.parse_args(argv)
    try:
        resolve_paths(args, ("head", "--head"), ("out", "--out"))
        if args.rate != "online" and args.timing is None:
            raise ExportError("--rate is the goodput stop's λ, which runs with --timing: give both")
        rate = args.rate if args.rate == "online" else _number(args.rate, "--rate")
        print(write_folder(args.head, args.out, args.timing, args.calibration, rate))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
