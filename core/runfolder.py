"""The run-folder contract, once for every command that writes: labels, corpus, snapshot, train, eval, calibrate,
export, the benches.

- **Refuse what is not ours**, in one line, before any work: a non-empty folder no run of the command wrote
  (``contents``), an output file that is not the command's (``check_output_file``).
- **Delete only our own files**: a folder's ``Ledger`` lists every file a command wrote into it, and is all that
  starting over deletes; a file under the command's names that the ledger does not list is a stray, refused.
- **Write whole or not at all**: ``write_text`` / ``write_json`` write a temporary name, then rename it over.
- **One writer at a time**: ``folder_lock``.
Resuming is each command's own (what its inputs are and when they changed); these are the pieces every one shares.

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
from collections.abc import Callable, Iterator
from pathlib import Path

from core.errors import SettingError, UserError

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
    import fcntl  # Unix only: imported here, so that the atomic writes serve where no lock is taken

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


def contents(folder: Path) -> list[str]:
    """The names in ``folder`` (none where it is missing), its lock file left out."""
    return sorted(p.name for p in folder.iterdir() if p.name != LOCK_FILE) if folder.is_dir() else []


def listing(names: list[str], at_most: int = 3) -> str:
    """``a, b, c, …``: the first names of a folder's, for a one-line message."""
    return ", ".join(names[:at_most]) + (", …" if len(names) > at_most else "")


def write_with(path: Path, write: Callable[[Path], object]) -> Path:
    """Write ``path`` whole or not at all: ``write(tmp)`` writes a temporary name beside it, which is then renamed
    over it; where writing fails (a full disk, a read-only folder) no temporary is left, and the error is one line.
    Returns ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    return write_with(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, obj) -> Path:
    return write_text(Path(path), json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: Path, fix: str):
    """A JSON file a run wrote; ``UserError`` naming it, and ``fix``, when it is not JSON (damaged or edited)."""
    try:
        return json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); {fix}") from None


class Ledger:
    """The files a command wrote into a folder, one relative name a line in the file ``name`` inside it: a file is
    claimed before it is written, so that starting over deletes it and nothing else."""

    def __init__(self, root: str | Path, name: str):
        self.root = Path(root)
        self.path = self.root / name

    def claim(self, path: Path) -> Path:
        """Record ``path``, a file of this folder, before it is written; returns it."""
        name = path.relative_to(self.root).as_posix()
        if name not in self.claimed():
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(name + "\n")
        return path

    def claimed(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.is_file() else []

    def exists(self) -> bool:
        return self.path.is_file()

    def files(self) -> list[Path]:
        """The claimed files that are there, and the ledger: all that starting over deletes."""
        return [*(p for p in (self.root / n for n in self.claimed()) if p.is_file()), self.path]

    def strays(self, named: list[Path]) -> list[Path]:
        """Of ``named`` (the files under the command's names that are there), those the ledger does not list: a
        next run would read them as its own or write over them."""
        claimed = set(self.claimed())
        return [p for p in named if p.relative_to(self.root).as_posix() not in claimed]


def earlier_outputs(folder: Path, named: tuple[str, ...], record: str, is_record: Callable[[object], bool]) -> bool:
    """Whether ``folder`` holds a command's outputs written before it kept a ledger: its JSON ``record`` (one of
    ``named``) passes ``is_record``, and the folder holds nothing else but ``named`` files and folders."""
    try:
        found = read_json(folder / record, "")
    except (OSError, UserError):
        return False
    return is_record(found) and all(p.is_dir() or p.name in named for p in folder.iterdir())


def own_folder(folder: Path, ledger_name: str, named: tuple[str, ...], what: str, flag: str,
               earlier: tuple[str, Callable[[object], bool]] | None = None) -> Ledger:
    """The ledger of ``folder``, a command's output folder, once it is known to be the command's: missing or empty,
    or holding its ledger (``ledger_name``), or holding the command's outputs from before it kept one (``earlier``:
    the JSON file of ``named`` that tells, and what its contents must pass; ``earlier_outputs``). Refused in one line naming ``flag``: any other non-empty folder, and files under ``named``
    (the names the command writes) that the ledger does not list. ``named`` is claimed at once, so that an
    interrupted run's folder is known as the command's."""
    ledger = Ledger(folder, ledger_name)
    found = contents(folder)
    if found and not ledger.exists() and not (earlier and earlier_outputs(folder, named, *earlier)):
        raise SettingError(f"{flag} {folder} is not empty ({listing(found)}) and no {what} wrote it: choose another "
                           "folder")
    if ledger.exists():
        strays = ledger.strays([folder / n for n in named if (folder / n).exists()])
        if strays:
            raise SettingError(f"{flag} {folder} holds {listing([p.name for p in strays])}, which no {what} wrote: "
                               "move them or choose another folder")
    for name in named:
        ledger.claim(folder / name)
    return ledger


def check_output_file(out: Path, flag: str, what: str, ours: Callable[[Path], object]) -> None:
    """``out`` may be a new file where a folder can hold it, or a ``what`` a command of ours wrote (``ours(out)``
    reads it without a ``UserError``), which is replaced; a folder, a path under a file and any other file (a label
    folder's manifest, a user's notes) are refused in one line naming ``flag``."""
    if out.is_dir():
        raise SettingError(f"{flag} {out} is a folder: give the {what} to write")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise SettingError(f"{flag} {out}: {parent} is a file, not a folder")
            break
    if out.exists():
        try:
            ours(out)
        except UserError:
            raise SettingError(f"{flag} {out} exists and is not a {what}: give a new path (or a {what}, which is "
                               "replaced)") from None
