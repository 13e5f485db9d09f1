"""Duplicates among the corpus rows (exact, and near by MinHash LSH over token shingles) and their token n-gram
overlap with HumanEval."""

from __future__ import annotations

import hashlib
import json

from data_gen.corpus_extract import code_tokens, tokens


def shingles(toks: list[str], k: int) -> set[str]:
    if len(toks) < k:
        return {" ".join(toks)}
    return {" ".join(toks[i : i + k]) for i in range(len(toks) - k + 1)}


def _h64(s: str, salt: int = 0) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8, salt=salt.to_bytes(8, "little")).digest(), "little")


def minhash(sh: set[str], n_perm: int = 64) -> list[int]:
    """MinHash signature: one 64-bit hash per shingle, then ``n_perm`` universal-hash permutations of it."""
    import numpy as np

    hashes = np.fromiter((_h64(s) for s in sh), dtype=np.uint64, count=len(sh))
    rng = np.random.default_rng(0)
    a = rng.integers(1, 2**61 - 1, size=n_perm, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**61 - 1, size=n_perm, dtype=np.uint64)
    with np.errstate(over="ignore"):
        perm = hashes[None, :] * a[:, None] + b[:, None]  # mod 2**64: an odd multiplier is a bijection
    return perm.min(axis=1).tolist()


def dedupe(rows: list[dict], jaccard: float, counts: dict, bands: int = 16) -> list[dict]:
    """Keep the first of every exact (normalized body tokens) and near-duplicate (shingle Jaccard) group."""
    seen, kept, buckets, kept_sh = set(), [], {}, []
    for r in rows:
        toks = code_tokens(r["canonical_solution"])
        key = hashlib.sha256(" ".join(toks).encode()).hexdigest()
        if key in seen:
            counts["exact_duplicates"] = counts.get("exact_duplicates", 0) + 1
            continue
        seen.add(key)
        sh = shingles(toks, 5)
        sig = minhash(sh)
        per = len(sig) // bands
        band_keys = [(i, tuple(sig[i * per : (i + 1) * per])) for i in range(bands)]
        cands = {j for bk in band_keys for j in buckets.get(bk, ())}
        if any(len(sh & kept_sh[j]) / len(sh | kept_sh[j]) >= jaccard for j in sorted(cands)):
            counts["near_duplicates"] = counts.get("near_duplicates", 0) + 1
            continue
        for bk in band_keys:
            buckets.setdefault(bk, []).append(len(kept))
        kept_sh.append(sh)
        kept.append(r)
    return kept



def humaneval_problems() -> list[dict]:
    import gzip

    from core.prompts import humaneval_path

    with gzip.open(humaneval_path(), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


class HumanEvalOverlap:
    """Token n-gram overlap of a text with the 164 HumanEval problems (prompt + canonical solution)."""

    def __init__(self, n: int):
        self.n = n
        self.index: dict[str, set[int]] = {}
        self.sizes = []
        for i, p in enumerate(humaneval_problems()):
            grams = shingles(tokens(p["prompt"] + p["canonical_solution"]), n)
            self.sizes.append(len(grams))
            for g in grams:
                self.index.setdefault(g, set()).add(i)

    def score(self, text: str) -> float:
        """max(share of the text's n-grams found in HumanEval, largest share of one problem's n-grams in the text)."""
        grams = shingles(tokens(text), self.n)
        hits = [g for g in grams if g in self.index]
        if not hits:
            return 0.0
        per: dict[int, int] = {}
        for g in hits:
            for i in self.index[g]:
                per[i] = per.get(i, 0) + 1
        return max(len(hits) / len(grams), max(c / self.sizes[i] for i, c in per.items()))
