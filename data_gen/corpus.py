"""A prompt corpus for labeling, built offline from the source of installed third-party packages.

Every documented function or method (``ast``) becomes a HumanEval-shaped row: ``prompt`` is its signature and
docstring, ``canonical_solution`` its real body (the column names HumanEval uses, so ``prompts.source: <folder>``
reads it with the default fields). Methods keep their class as context, ``class Name:`` over the method, because
their bodies read ``self``; decorators are dropped except ``staticmethod``/``classmethod``, which change what
the first argument is. Nested functions are skipped (their bodies read the enclosing scope).

Filters: a docstring whose summary is a sentence of at least three words (not a stub such as "Deprecated",
"Alias for", "See ..."), at most ``max_doc_lines``; a body of ``min_body_lines``..``max_body_lines`` code lines
that is not trivial (``pass``, ``...``, ``raise NotImplementedError``, a lone ``return``); prompt + body must parse.
Deduplication, in a fixed order (rows sorted by package, file, line): exact (the body's tokens, comments and layout
dropped), then near-duplicate (Jaccard of token 5-gram shingles >= ``near_dup_jaccard``, candidates by MinHash LSH). Rows whose
prompt or body shares token n-grams with a HumanEval prompt + canonical solution past ``humaneval_containment``
are dropped, and the overlap of the rows kept is reported.

**The Python standard library is reserved for out-of-distribution evaluation**: a source file inside it (or a
distribution that is a copy of part of it, ``STDLIB_COPIES``) is refused, not skipped.

The rows are written in an order fixed by their content (a hash), so the first ``prompts.limit`` rows are a
sample of every package. Same installed packages and settings -> same rows and the same ``digest`` in
``manifest.json`` (sha256 of the rows' canonical JSON, not of the Parquet bytes, which record the writer's
version).

    specheads corpus --out runs/corpus
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from core.arguments import parse_settings, settings_parser
from core.errors import UserError
from core.runfolder import RunFolder, write_json, write_with
from data_gen.corpus_config import CorpusConfig, CorpusError
from data_gen.corpus_dedupe import HumanEvalOverlap, dedupe
from data_gen.corpus_extract import extract
from data_gen.corpus_sources import sources, stdlib_dirs


def rows_digest(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps(r, sort_keys=True).encode() + b"\n")
    return h.hexdigest()


KIND = "corpus"
"""The manifest's ``kind``."""


def corpus_folder(out: Path) -> RunFolder:
    return RunFolder(out, "corpus", "--out", ("corpus.parquet", "manifest.json"))


def build_corpus(cfg: CorpusConfig, progress: bool = False) -> dict:
    """Extract, filter, dedupe, check against HumanEval, write ``corpus.parquet`` + ``manifest.json`` into an empty
    folder or a previous corpus folder (``corpus_folder``), holding its lock; return the manifest."""
    out = Path(cfg.out)
    corpus_folder(out).check()
    with corpus_folder(out).hold("a corpus build"):
        corpus_folder(out).check()  # another build may have written it before the lock was ours
        return _build(cfg, out, progress)


def _build(cfg: CorpusConfig, out: Path, progress: bool) -> dict:
    import datasets
    from tqdm import tqdm

    t0 = time.perf_counter()
    srcs, missing = sources(cfg)
    counts: dict[str, int] = {}
    rows = []
    files = [(s, f) for s in srcs for f in s.files]
    for s, f in tqdm(files, desc="reading sources", unit="file", disable=not progress):
        rows += extract(f, s, cfg, counts)
    counts["candidates"] = len(rows)
    rows.sort(key=lambda r: (r["package"], r["file"], r["line"]))
    rows = dedupe(rows, cfg.near_dup_jaccard, counts)
    he = HumanEvalOverlap(cfg.ngram)
    kept, shared, he_dropped = [], 0, []
    worst = 0.0
    for r in tqdm(rows, desc="HumanEval overlap", unit="row", disable=not progress):
        o = max(he.score(r["prompt"]), he.score(r["canonical_solution"]))
        if o >= cfg.humaneval_containment:
            he_dropped.append(f"{r['package']}:{r['qualname']} ({o:.2f})")
            continue
        shared += o > 0
        worst = max(worst, o)
        kept.append({**r, "humaneval_overlap": round(o, 4)})
    counts["humaneval_near_duplicates"] = len(he_dropped)
    if len(kept) < cfg.min_prompts:
        raise CorpusError(f"only {len(kept)} prompts pass the filters (min_prompts={cfg.min_prompts}); add packages "
                          "or loosen the filters")
    kept.sort(key=lambda r: hashlib.sha256(f"{r['package']}\0{r['qualname']}\0{r['prompt']}".encode()).hexdigest())
    for i, r in enumerate(kept):
        r["task_id"] = f"corpus/{i}"
    folder = corpus_folder(out)
    folder.start(["corpus.parquet", "manifest.json"])
    # the temporary has no .parquet suffix: a reader of the folder skips it
    write_with(out / "corpus.parquet", lambda tmp: datasets.Dataset.from_list(kept).to_parquet(str(tmp)))
    per_package: dict[str, int] = {}
    for r in kept:
        per_package[r["package"]] = per_package.get(r["package"], 0) + 1
    manifest = {
        "kind": KIND,
        "rows": len(kept),
        "digest": rows_digest(kept),
        "settings": asdict(cfg) | {"out": None},
        "packages": {s.package: {"version": s.version, "files": len(s.files), "rows": per_package.get(s.package, 0)}
                     for s in srcs},
        "not_installed": missing,
        "counts": counts,
        "humaneval": {"problems": len(he.sizes), "ngram": cfg.ngram, "threshold": cfg.humaneval_containment,
                      "near_duplicates_kept": 0,
                      "near_duplicates_dropped": len(he_dropped), "dropped": he_dropped,
                      "rows_sharing_any_ngram": shared, "max_overlap_kept": round(worst, 4)},
        "stdlib_excluded": [str(d) for d in stdlib_dirs()],
        "python": sys.version.split()[0],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(out / "manifest.json", manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = settings_parser(CorpusConfig, "specheads corpus",
                        "Build a HumanEval-shaped prompt corpus from installed third-party packages.")
    try:
        ns = parse_settings(p, argv)
        cfg = CorpusConfig(**{k: v for k, v in vars(ns).items() if k != "config"})
        m = build_corpus(cfg, progress=True)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c, h = m["counts"], m["humaneval"]
    print(f"corpus: {m['rows']} prompts from {len(m['packages'])} packages in {cfg.out} ({m['seconds']:.0f} s)")
    print(f"  functions seen {c.get('functions', 0)}, candidates {c['candidates']}, exact duplicates "
          f"{c.get('exact_duplicates', 0)}, near duplicates {c.get('near_duplicates', 0)}")
    print(f"  HumanEval ({h['problems']} problems, {h['ngram']}-gram overlap >= {h['threshold']}): "
          f"{h['near_duplicates_dropped']} near-duplicates dropped, {h['near_duplicates_kept']} kept; "
          f"{h['rows_sharing_any_ngram']} rows share any n-gram, max overlap kept {h['max_overlap_kept']}")
    print(f"  digest {m['digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
