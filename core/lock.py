"""An exclusive lock on an output folder, so that two runs never write into one folder at once.

The lock is ``LOCK_FILE`` in the folder, holding the owner's pid and host, and an ``flock`` on it that the kernel
drops when the owner dies however it dies; the owner removes the file when it is done. A lock file a killed process
left behind holds no flock: it is stale, and the next run takes it over. On a file system without ``flock`` the
pid alone decides: a file naming a process that is still running on this host locks the folder.

Only the launching process of a distributed run takes the lock: the ranks Lightning or torchrun start write into
the folder their launcher holds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Iterator

from core.errors import UserError

LOCK_FILE = ".lock"


class FolderInUse(UserError):
    """Another running process holds the output folder."""


def launching_process() -> bool:
    """Whether this process started the run (not a rank a distributed launcher started beside it)."""
    return all(int(os.environ.get(k, "0") or 0) == 0 for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user
        return True
    return True


def _owner(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str) -> Iterator[None]:
    """Hold ``folder`` (created if missing) for the duration of the block; ``FolderInUse`` when another live
    process holds it. ``what`` names the command in the message (``a labeling run``)."""
    folder = Path(folder)
    if not launching_process():
        yield
        return
    path = folder / LOCK_FILE
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"output folder {folder} is not writable: {e.strerror}") from None
        try:
            _take(fd, path, folder)
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # its holder removed the file between our open and our lock: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what}).encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # before the flock goes, so that no one locks a file on its way out
        os.close(fd)


def _take(fd: int, path: Path, folder: Path) -> None:
    """flock ``fd`` or raise ``FolderInUse`` naming the holder."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except OSError as e:
        owner = _owner(path)
        busy = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        if not busy:  # no flock on this file system: the recorded pid decides
            pid = owner.get("pid")
            busy = owner.get("host") == socket.gethostname() and pid not in (None, os.getpid()) and _alive(int(pid))
        if busy:
            raise FolderInUse(f"{folder} is in use by {owner.get('what', 'another run')} (process "
                              f"{owner.get('pid', '?')} on {owner.get('host', '?')}); wait for it to finish or "
                              "choose another output_dir") from None
