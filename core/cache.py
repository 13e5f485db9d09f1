"""The project's cache folder, and file digests remembered in it so that large files are hashed once."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """Where assembled GGUF files and converted checkpoints live (``$SPECHEADS_CACHE``, else ~/.cache/specheads)."""
    return Path(os.environ.get("SPECHEADS_CACHE", Path.home() / ".cache" / "specheads"))


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered in the cache keyed by its path, inode, size, mtime and ctime (a rewrite changes
    the ctime even when it keeps the size and restores the mtime), so that big files are hashed once."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    memo = cache_root() / "sha256" / hashlib.sha256(key.encode()).hexdigest()[:24]
    remembered = memo.read_text().strip() if memo.exists() else ""
    if len(remembered) == 64:
        return remembered
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(16 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.tmp{os.getpid()}")  # processes hashing the same file at once
    tmp.write_text(digest)
    os.replace(tmp, memo)
    return digest
