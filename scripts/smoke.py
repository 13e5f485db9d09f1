"""``make smoke``: every stage the README names, on tiny random-init models, in under 2 minutes on 2 cores.

Each stage runs its command as a user would (the module's ``main`` with the flags printed before it, as
``$ specheads <command> <flags>``: a line to paste from the same folder), its output kept in ``logs/<stage>.log``.
Every stage writes into a folder of its own under ``--out`` (default ``runs/smoke/``, ignored), by that command's
rules (``core.runfolder``): the tiny models and GGUF files (``models/``), the prompts and the label and eval configs
the smoke run writes itself, then ``corpus/``, ``labels/``, ``train/`` (with ``train/heads/``, the exported heads),
``calibrate/``, ``bench-timing/``, ``eval/`` and ``export-hf/``.

    specheads smoke                      # on the CPU, into runs/smoke/ (what ``make smoke`` runs)
    specheads smoke --out "$(mktemp -d)" # into a folder of your choice (``make test``: one it removes)
    specheads smoke --device cuda        # labeling, training and decoding on the GPU, then the labels audited
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from core.arguments import CommandParser, description
from core.errors import SettingError
from core.interrupt import run_main
from core.runfolder import RunFolder, write_text
from testing.tiny import make_pair, write_prompts

ROOT = Path("runs/smoke")
PROMPTS = ("prompts.jsonl", "heldout.jsonl", "labels.yaml", "eval.yaml")
"""Files the smoke run writes under its folder itself (the prompts and the configs it hands its commands), besides
the tiny models and each stage's log; each stage's folder is its command's own (``core.runfolder``), written again
by the next run (labels and eval start over), so that nothing a user puts there is deleted."""
CHECKOUT = Path(__file__).resolve().parents[1]
CORPUS_PACKAGE = "packaging"
"""The one installed package the corpus stage reads (a dependency of pip's and of every tool here): a few seconds
of extraction, never the standard library (held out for evaluation)."""


def prepare(root: Path) -> None:
    """Refuse a folder no smoke run wrote (``RunFolder.check``), and claim the prompt files the run writes there."""
    folder = RunFolder(root, "smoke", "--out", PROMPTS)
    folder.check()
    folder.start(PROMPTS)


def own(root: Path, path: Path) -> Path:
    """Claim ``path`` (a file under ``root``) as the smoke run's in its ledger, before it is written."""
    return RunFolder(root, "smoke").claim(path)


def call(command: str, main: Callable, argv: list[str]):
    """Print the command a user would type, ``specheads <command> <flags>``, then run its module's ``main`` on
    exactly those flags; a ``main`` that answers with an exit status must answer 0."""
    show(f"$ specheads {shlex.join([command, *map(str, argv)])}")
    result = main([str(a) for a in argv])
    if isinstance(result, int) and not isinstance(result, bool) and result != 0:
        raise RuntimeError(f"specheads {command} exited with status {result}")
    return result


def here(path: Path | str) -> str:
    """``path`` as a user in the current folder would type it (relative when inside it)."""
    relative = os.path.relpath(path)
    return str(Path(path).resolve()) if Path(relative).parts[:1] == ("..",) else relative


# ---------------------------------------------------------------------- the stages
def write_models(root: Path) -> tuple[Path, Path]:
    """The tiny pair (``testing.tiny.make_pair``) under ``models/``, each file claimed before it lands there."""
    with tempfile.TemporaryDirectory(dir=root, prefix=".models.tmp") as tmp:
        make_pair(tmp)
        for path in sorted(p for p in Path(tmp).rglob("*") if p.is_file()):
            final = root / "models" / path.relative_to(tmp)
            own(root, final).parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, final)
    return root / "models" / "draft", root / "models" / "target"


def stage_corpus(root: Path, device: str) -> None:
    """HumanEval-shaped prompts from one installed package (the labels below read the tiny pair's own prompts: the
    tiny word-level vocabulary reads little of real code)."""
    from data_gen import corpus

    assert call("corpus", corpus.main, ["--out", here(root / "corpus"), "--packages", CORPUS_PACKAGE,
                                        "--min_prompts", "20"]) == 0
    manifest = json.loads((root / "corpus" / "manifest.json").read_text())
    assert manifest["rows"] >= 20 and not manifest["not_installed"], manifest["not_installed"]


def stage_labels(root: Path, device: str) -> None:
    import yaml

    from data_gen.__main__ import main

    draft, target = write_models(root)
    prompts = write_prompts(own(root, root / "prompts.jsonl"), n=24)
    settings = {  # what testing.tiny.label_config sets, as a label config a user writes
        "draft": {"path": here(draft), "name": "tiny-draft"},
        "target": {"path": here(target), "name": "tiny-target"},
        "prompts": {"source": here(prompts), "response_field": "answer"},
        "sampling": {"max_new_tokens": 12},
        # a quarter of the prompts each in val and test, so every category (and so every head's rows) is in each split
        "split_fractions": [0.5, 0.25, 0.25],
        "output_dir": here(root / "labels"), "batch_size": 4, "dtype": "float32",
        "accelerator": "gpu" if device == "cuda" else "cpu", "devices": 1, "overwrite": True,
    }
    config = write_text(own(root, root / "labels.yaml"), yaml.safe_dump(settings, sort_keys=False))
    call("labels", main, ["--config", here(config)])
    manifest = json.loads((root / "labels" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["rows"] > 0


def stage_train(root: Path, device: str) -> None:
    from heads.export import load_head
    from pipeline import train_all

    results = call("train", train_all.main, [
        "--labels", here(root / "labels"), "--out", here(root / "train"),
        "--checkpoints", here(root / "train" / "checkpoints"), "--heads_dir", here(root / "train" / "heads"),
        "--max_epochs", "3", "--quiet", "--configs", *(here(CHECKOUT / c) for c in train_all.DEFAULT_CONFIGS),
        "--accelerator", "gpu" if device == "cuda" else "cpu",
    ])
    draft = json.loads((root / "labels" / "manifest.json").read_text())["models"]["draft"]
    for r in results:
        head, meta = load_head(r.export, draft=draft)
        assert meta["head"]["init_args"]["hidden_size"] == draft["hidden_size"]
    assert (root / "train" / "roc.png").exists()


def stage_calibrate(root: Path, device: str) -> None:
    from decoding import calibrate

    out = root / "calibrate" / "calibration.json"
    call("calibrate", calibrate.main, ["--labels", here(root / "labels"), "--splits", "train", "--out", here(out),
                                       "--heldout", here(root / "labels"), "--heldout_splits", "val", "test"])
    assert json.loads(out.read_text())


def stage_bench_timing(root: Path, device: str) -> None:
    """The tiny pair's per-forward times (a few repeats of short shapes): the timing file simulate reads."""
    from evaluation import bench_timing

    out = root / "bench-timing" / "timing.json"
    call("bench-timing", bench_timing.main, [
        "--model", f"draft={here(root / 'models' / 'draft')}", "--model", f"target={here(root / 'models' / 'target')}",
        "--prefill", "16", "--cache", "32", "--verify", "4", "--verify_lengths", "2", "3", "--repeats", "3",
        "--precision", "float32", "--device", device, "--out", here(out)])
    assert {m["name"] for m in json.loads(out.read_text())["models"]} == {"draft", "target"}


def stage_simulate(root: Path, device: str) -> None:
    """Every policy replayed over the held-out traces of the smoke labels at two cost ratios and under the timing
    file, the goodput stop on the stop head and on the calibrated confidence."""
    from evaluation import simulate

    heads = sorted(here(h) for h in (root / "train" / "heads").glob("*.safetensors"))
    rows = call("simulate", simulate.main, [
        "--labels", here(root / "labels"), "--splits", "test", "--heads", *heads, "--c", "0.2", "0.5",
        "--timing", here(root / "bench-timing" / "timing.json"),
        "--calibration", here(root / "calibrate" / "calibration.json")])
    assert {"sd", "specdecpp", "sprinter", "goodput"} <= {r["policy"].split("[")[0] for r in rows}, \
        sorted({r["policy"] for r in rows})


def stage_eval(root: Path, device: str) -> None:
    """Every policy and the HF peer on the tiny pair with the smoke-trained heads; report under ``eval/``."""
    import yaml

    from evaluation.__main__ import main

    heads = root / "train" / "heads"
    models = root / "models"
    settings = {
        "draft": {"path": here(models / "draft"), "name": "tiny-draft"},
        "target": {"path": here(models / "target"), "name": "tiny-target"},
        # prompts no head trained on (the eval would leave out the ones they saw)
        "prompts": {"source": here(write_prompts(own(root, root / "heldout.jsonl"), n=3, seed=1)),
                    "response_field": "answer", "limit": None},
        "modes": [{"name": "sample", "temperature": 1.0},
                  {"name": "greedy", "temperature": 0.0, "families": ["target_only", "sd", "hf_assisted"]}],
        "policies": [
            {"family": "target_only"}, {"family": "draft_only"}, {"family": "sd", "grid": {"k": [2, 4]}},
            {"family": "specdecpp", "fixed": {"head": here(heads / "specdecpp_d3_w6.safetensors")},
             "grid": {"h": [None, 0.5]}},
            {"family": "sprinter", "fixed": {"head": here(heads / "sprinter_lam1.safetensors")},
             "grid": {"tau": [None, 0.5]}},
            {"family": "hf_heuristic"}, {"family": "confidence"}, {"family": "svip", "grid": {"h": [0.5]}},
            {"family": "fuzzy", "grid": {"T": [0.5]}},
        ],
        "max_new_tokens": 6, "sweep_prompts": 2, "hf_peer": {"confidence_thresholds": [0.6]},
        "select_by": "simulated", "train_dir": here(root / "train"), "labels_dir": here(root / "labels"),
        "output_dir": here(root / "eval"), "device": device, "overwrite": True,
    }
    config = write_text(own(root, root / "eval.yaml"), yaml.safe_dump(settings, sort_keys=False))
    call("eval", main, ["--config", here(config)])
    out = root / "eval"
    report = json.loads((out / "report.json").read_text())
    families = {row["family"] for m in report["modes"].values() for row in m["table"]}
    missing = {"target_only", "draft_only", "sd", "specdecpp", "sprinter", "hf_heuristic", "confidence", "svip",
               "fuzzy", "hf_assisted"} - families
    assert not missing, f"policies missing from the report: {missing}"
    assert report["theorem7"]["runs"], f"SPRINTER Theorem 7 not checked: {report['theorem7']['skipped']}"
    for f in ("report.md", "pareto.png", "speedup.png", "quality.png", "roc.png", "selection.json", "loglik.jsonl",
              "forward_timing.json", "traces/sample/00000.safetensors"):
        assert (out / f).exists(), f
    assert report["selection"]["sample"], "the simulator chose no setting"


def stage_compare(root: Path, device: str) -> None:
    """Two runs of the smoke eval set against each other, with their paired interval."""
    from evaluation import pairs

    (a, b, interval, n), = call("compare", pairs.main, [here(root / "eval"), "hf_heuristic/target_only",
                                                        "--mode", "sample"])
    assert n >= 2 and interval.value > 0


README_SNIPPET = re.compile(r"```python\n(.*?)```", re.S)


def stage_export_hf(root: Path, device: str) -> None:
    """The smoke-trained stop head as a ``custom_generate`` folder, then the folder's own README snippet run as its
    user runs it: in a fresh Python, ``target.generate(…, assistant_model=draft, custom_generate=<the folder as
    given>, trust_remote_code=True)``, TARGET and DRAFT the tiny pair."""
    from decoding.runtimes import hf_export

    out = here(root / "export-hf")
    call("export-hf", hf_export.main, ["--head", here(root / "train" / "heads" / "specdecpp_d3_w6.safetensors"),
                                       "--out", out])
    snippet = README_SNIPPET.search((Path(out) / "README.md").read_text())
    assert snippet and f'custom_generate="{out}"' in snippet.group(1), "the folder's README has no usage snippet"
    script = (f"TARGET, DRAFT = {here(root / 'models' / 'target')!r}, {here(root / 'models' / 'draft')!r}\n"
              + snippet.group(1)
              + 'assert out.shape[1] > inputs["input_ids"].shape[1], "generate() added no token"\n')
    show(f"$ python  # the snippet of {out}/README.md, TARGET and DRAFT the tiny pair")
    with tempfile.TemporaryDirectory() as modules:  # transformers copies the folder's code here, not into ~/.cache
        env = {**os.environ, "HF_MODULES_CACHE": modules, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    print(done.stdout, end="")
    print(done.stderr, end="", file=sys.stderr)
    assert done.returncode == 0, f"the exported folder's snippet failed: {done.stderr.strip().splitlines()[-1:]}"


def stage_generate(root: Path, device: str) -> str | None:
    """Our policy (SD, K = 2) on the tiny pair as two GGUF files in llama.cpp; the reason it was skipped, if so."""
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"{e.name} is not installed (`make install` installs it)"
    from decoding.runtimes import llama_cpp as runtime
    from testing.tiny_gguf import write_gguf

    models = root / "models"
    files = {name: write_gguf(models / name, own(root, models / f"{name}.gguf")) for name in ("draft", "target")}
    text, stats = call("generate", runtime.main, [
        "--target", here(files["target"]), "--draft", here(files["draft"]),
        # the tiny GGUF files' vocabulary is no tokenizer transformers reads: the checkpoint's
        "--tokenizer", here(models / "target"), "--policy", "sd", "--k", "2", "--prompt", "def f ( x ) :",
        "--max_new_tokens", "8", "--threads", "1"])
    assert stats.new_tokens > 0 and stats.draft_calls > 0, stats
    return None


def stage_audit(root: Path, device: str) -> None:
    """Labels written on the GPU, recomputed on the CPU with plain unbatched forwards."""
    from data_gen import audit

    assert call("audit", audit.main, [here(root / "labels"), "--rows", "8"]) == 0, \
        "the GPU's labels disagree with the CPU's"


STAGES = [("corpus", stage_corpus), ("labels", stage_labels), ("train", stage_train), ("calibrate", stage_calibrate),
          ("bench-timing", stage_bench_timing), ("simulate", stage_simulate), ("eval", stage_eval),
          ("compare", stage_compare), ("export-hf", stage_export_hf), ("generate", stage_generate)]
"""In pipeline order: each reads what the ones before it wrote."""


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog="specheads smoke", description=description(__doc__))
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where every stage runs")
    p.add_argument("--out", default=str(ROOT), help="the folder every stage writes under (default runs/smoke)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SettingError("--device cuda: no CUDA GPU that torch can use on this machine")
    root = Path(args.out)
    with RunFolder(root, "smoke").hold("a smoke run"):
        return run(root, args.device)


_terminal = None
"""Where the run's own lines go while a stage's output goes to its log (``logged``)."""


def show(line: str) -> None:
    """A line for the user (a stage's command) on the terminal, and in the stage's log."""
    print(line, flush=True)
    if _terminal is not None:
        print(line, file=_terminal, flush=True)


@contextlib.contextmanager
def logged(root: Path, name: str):
    """The stage's output (its command's and the snippet's) into ``logs/<name>.log``, its command line shown too; on
    a failure, the log's end is printed before the error."""
    global _terminal
    log = own(root, root / "logs" / f"{name}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        _terminal = sys.stdout
        try:
            with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                yield
        except BaseException:
            traceback.print_exc(file=f)
            f.flush()
            tail = log.read_text().splitlines()[-20:]
            print("\n".join([f"smoke: {name} failed; the end of {log}:", *tail]), file=sys.stderr)
            raise
        finally:
            _terminal = None


def run(root: Path, device: str) -> int:
    prepare(root)
    t0 = time.perf_counter()
    stages = list(STAGES) + ([("audit of the GPU's labels on the CPU", stage_audit)] if device == "cuda" else [])
    for name, stage in stages:
        t = time.perf_counter()
        with logged(root, name.split()[0]):
            skipped = stage(root, device)
        if skipped:
            print(f"smoke: {name} skipped: {skipped}")
        else:
            print(f"smoke: {name} ok ({time.perf_counter() - t:.1f} s)")
    print(f"smoke: all stages ok on {device} in {time.perf_counter() - t0:.1f} s; outputs under {root}/")
    return 0


if __name__ == "__main__":
    run_main(main)
