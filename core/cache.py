"""The project's cache folder, and file digests remembered in it so that large files are hashed once."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """Where assembled GGUF files and converted checkpoints live (``$SPECHEADS_CACHE``, else ~/.cache/specheads)."""
    return Path(os.environ.get("SPECHEADS_CACHE", Path.home() / ".cache" / "specheads"))


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered beside the cache keyed by (path, size, mtime) so big files hash once."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]
    memo = cache_root() / "sha256" / key
    if memo.exists():
        return memo.read_text().strip()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(16 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(digest)
    return digest
