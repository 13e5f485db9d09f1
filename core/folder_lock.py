"""One writer at a time in a folder: ``folder_lock``, which never touches a file it did not create.

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
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from core.errors import UserError

LOCK_FILE = ".specheads.lock"


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


def _lock_record(fd: int) -> dict | None:
    """The owner's record a lock file holds, or None when it is no lock of ours (a lock of ours is never seen empty:
    it is written whole before it takes the lock's name, ``_new_lock``)."""
    try:
        found = json.loads(os.pread(fd, 4096, 0))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and {"pid", "host", "what"} <= set(found) else None


def _new_lock(path: Path, record: bytes) -> int | None:
    """A lock file at ``path`` holding ``record``, flocked, as an open descriptor; None where a file of that name is
    there already. It is written and locked under a temporary name first, then linked to its own: no one ever sees
    a lock of ours that is empty or unlocked, so that an empty file is known as someone else's."""
    import fcntl

    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, record)
        with contextlib.suppress(OSError):  # a file system without flock: the recorded pid decides (``_take``)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            os.link(tmp, path)
        except FileExistsError:
            os.close(fd)
            return None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            os.close(fd)  # a file system without hard links: created in place, empty for a moment
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, record)
    except BaseException:
        os.close(fd)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return fd


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str, flag: str = "--out") -> Iterator[None]:
    """Hold ``folder`` (created if missing) for the duration of the block; ``FolderInUse`` when another live
    process holds it. ``what`` names the command in the message (``a labeling run``), ``flag`` the option that gave
    the folder. A file under the lock's name that no run of ours wrote (empty, a link, anything but a lock record)
    is refused, untouched."""
    folder = Path(folder)
    if not launching_process():
        yield
        return
    path = folder / LOCK_FILE
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what}).encode()
    not_ours = UserError(f"{flag} {folder} holds a file {LOCK_FILE} that no run of this project wrote: move it or "
                         "choose another folder")
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = _new_lock(path, record)
            created = fd is not None
            if not created:
                try:
                    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
                except FileNotFoundError:  # its holder removed it between our two opens
                    continue
                except OSError as e:
                    if e.errno == errno.ELOOP:  # a link: to whatever it points at, never ours to write
                        raise not_ours from None
                    raise
        except OSError as e:
            raise UserError(f"{flag} {folder} is not writable: {e.strerror}") from None
        try:
            if not created:
                _take(fd, path, folder, flag)  # a held lock is in use, whatever it reads as while its owner writes it
                if _lock_record(fd) is None:
                    raise not_ours
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # its holder removed the file between our open and our lock: lock the new one
    try:
        if not created:  # a stale lock, taken over: it names its new owner
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        yield
    finally:
        with contextlib.suppress(OSError):  # before the flock goes, so that no one locks a file on its way out;
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # not another's, where the folder was swapped for a new one
                path.unlink()
        os.close(fd)


def _take(fd: int, path: Path, folder: Path, flag: str) -> None:
    """flock ``fd`` or raise ``FolderInUse`` naming the holder."""
    import fcntl  # Unix only: imported here, so that the atomic writes serve where no lock is taken

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except OSError as e:
        owner = _lock_record(fd) or {}
        busy = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        if not busy:  # no flock on this file system: the recorded pid decides
            pid = owner.get("pid")
            busy = owner.get("host") == socket.gethostname() and pid not in (None, os.getpid()) and _alive(int(pid))
        if busy:
            raise FolderInUse(f"{folder} is in use by {owner.get('what', 'another run')} (process "
                              f"{owner.get('pid', '?')} on {owner.get('host', '?')}); wait for it to finish or "
                              f"choose another {flag}") from None
