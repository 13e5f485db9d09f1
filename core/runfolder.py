"""The run-folder contract, once for every command that writes: a file or folder is a command's only when the ledger
this project keeps beside it says so.

- **The ledger** (``LEDGER``, in each folder a command writes into) lists, one ``<command>\\t<name>`` a line, every file
  a command wrote there, claimed before it is written; a line naming ``.`` says the folder is that command's output
  folder. Nothing is ever adopted from the shape or name of a file: a file the ledger does not list is the user's.
- **Refuse what is not ours**, in one line, before the first write or folder creation (``RunFolder.check``,
  ``OutputFile.check``): a non-empty folder no run of the command wrote, another command's folder, a file under the
  command's names that its ledger does not list (a stray: the run would read it as its own or write over it), an
  output file that is not the command's.
- **Delete only our own files**: ``RunFolder.clear`` deletes the files the ledger lists for the command.
- **Write whole or not at all**: ``write_with`` writes a temporary name, then renames it over; a failure (a full
  disk, a read-only folder) is one line and leaves no temporary. A replaced folder is built beside and swapped in
  once complete (``replace_folder``).
- **One writer at a time**: ``RunFolder.hold`` (``core.folder_lock``), which never touches a file it did not create.
Resuming is each command's own (what its inputs are and when they changed); these are the pieces every one shares.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from core.errors import SettingError, UserError
from core.folder_lock import LOCK_FILE, folder_lock

LEDGER = ".specheads-files"
LEDGER_HEADER = "# the files specheads commands wrote here, one `<command>\\t<file>` a line (core/runfolder.py)\n"
FOLDER = "."
"""The ledger's name for the folder itself: its line makes the folder that command's output folder."""
OURS = (LOCK_FILE, LEDGER)
OUR_NAME = re.compile(rf"\.?({'|'.join(map(re.escape, OURS))})(\.tmp\d+)*")
"""The lock, the ledger, and the temporary names they are written under (``core.folder_lock``, ``write_with``)."""


# ---------------------------------------------------------------------- whole writes
def contents(folder: Path) -> list[str]:
    """The names in ``folder`` (none where it is missing), the project's lock and ledger left out, and the
    temporaries another run writes them under for a moment (``.specheads.lock.tmp<pid>``): a run starting beside one
    that is taking the folder finds the folder in use, not holding a stranger's file."""
    return sorted(p.name for p in folder.iterdir() if not OUR_NAME.fullmatch(p.name)) if folder.is_dir() else []


def listing(names: list[str], at_most: int = 3) -> str:
    """``a, b, c, …``: the first names of a folder's, for a one-line message."""
    return ", ".join(names[:at_most]) + (", …" if len(names) > at_most else "")


def _no_temporary(tmp: Path) -> None:
    """Remove a write's temporary, if it is there and can be: a folder that became read-only keeps a temporary it
    never held, and a failed clean-up must not hide the error that called it."""
    with contextlib.suppress(OSError):
        if tmp.is_dir():
            shutil.rmtree(tmp)
        else:
            tmp.unlink(missing_ok=True)


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
        _no_temporary(tmp)
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        _no_temporary(tmp)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    return write_with(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, obj) -> Path:
    return write_text(Path(path), json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_figure(fig, path: Path) -> Path:
    """A matplotlib figure as the image file ``path`` (its format from the suffix), whole or not at all."""
    return write_with(path, lambda tmp: fig.savefig(tmp, dpi=120, format=Path(path).suffix[1:]))


def read_json(path: Path, fix: str):
    """A JSON file a run wrote; ``UserError`` naming it, and ``fix``, when it is not JSON (damaged or edited)."""
    try:
        return json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); {fix}") from None


def replace_folder(folder: Path, build: Callable[[Path], object]) -> Path:
    """Write the folder ``folder`` whole or not at all: ``build(tmp)`` fills a new folder beside it, which is swapped
    in for the old one only once complete; where building fails the old folder is left as it was, and no temporary.
    Returns ``folder``."""
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    old = folder.with_name(f".{folder.name}.old{os.getpid()}")
    try:
        _no_temporary(tmp)
        tmp.mkdir(parents=True)
        build(tmp)
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
    except OSError as e:
        _no_temporary(tmp)
        if old.exists() and not folder.exists():
            os.replace(old, folder)
        raise UserError(f"cannot write {folder}: {e.strerror or e}") from None
    except BaseException:
        _no_temporary(tmp)
        raise
    _no_temporary(old)
    return folder


# ---------------------------------------------------------------------- the ledger
class Ledger:
    """The files specheads commands wrote into one folder: ``<command>\\t<name>`` a line, in the file ``LEDGER``
    inside it (``FOLDER`` as the name: the folder is that command's output folder). A line is appended before its
    file is written, so that an interrupted run's files are known as its own."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.path = self.root / LEDGER

    def check(self) -> None:
        """Refuse a ledger that is a link (writing it would write wherever it points) or not a file."""
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise SettingError(f"{self.path} is not a ledger this project wrote (a link or a folder): move it")

    def entries(self) -> list[tuple[str, str]]:
        self.check()
        if not self.path.is_file():
            return []
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            lines = []
        if lines[:1] != [LEDGER_HEADER.strip()]:
            raise SettingError(f"{self.path} is not a ledger this project wrote: move it or choose another folder")
        entries = [tuple(line.split("\t", 1)) for line in lines if "\t" in line]
        # a name that leaves the folder is no file of it, whoever wrote the line: never read, never deleted
        return [(cmd, name) for cmd, name in entries if name == FOLDER or _inside(name)]

    def owner(self) -> str | None:
        """The command whose output folder this is, None where it is none's."""
        return next((cmd for cmd, name in self.entries() if name == FOLDER), None)

    def claimed(self, command: str) -> set[str]:
        return {name for cmd, name in self.entries() if cmd == command and name != FOLDER}

    def claim(self, command: str, names: Iterable[str]) -> None:
        """Record ``names`` (relative to the folder) as ``command``'s before they are written."""
        have = {(c, n) for c, n in self.entries()}
        new = [n for n in dict.fromkeys(names) if (command, n) not in have]
        if not new:
            return
        odd = next((n for n in new if any(ch in n for ch in "\t\n\r")), None)
        if odd is not None:
            raise SettingError(f"{self.root / odd!r}: a file name with a tab or a line break cannot be recorded; "
                               "choose another name")
        lines = "".join(f"{command}\t{n}\n" for n in new)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():  # created whole, under its own name only once written
                tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
                write_with(tmp, lambda t: t.write_text(LEDGER_HEADER + lines))
                try:
                    os.link(tmp, self.path)
                    return
                except FileExistsError:  # another run made it meanwhile: append to it
                    pass
                finally:
                    tmp.unlink(missing_ok=True)
            with open(self.path, "a") as f:  # one append a call: concurrent writers' lines do not interleave
                f.write(lines)
        except OSError as e:
            raise UserError(f"cannot write {self.path}: {e.strerror or e}") from None

    def forget(self, command: str) -> None:
        """Drop ``command``'s files from the ledger (once deleted), keeping its claim on the folder."""
        kept = [(c, n) for c, n in self.entries() if c != command or n == FOLDER]
        write_text(self.path, LEDGER_HEADER + "".join(f"{c}\t{n}\n" for c, n in kept))


def _inside(name: str) -> bool:
    path = Path(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and path.parts[:1] != (".",)


def _relative(root: Path, path: Path) -> str:
    return Path(path).relative_to(root).as_posix()


class RunFolder:
    """The output folder of one command (``command``, as ``specheads <command>`` names it), given by the option
    ``flag``. ``names``: glob patterns (relative to the folder) of every file the command writes into it; a file under
    them that the ledger does not list for the command is a stray, refused."""

    def __init__(self, root: str | Path, command: str, flag: str = "--out", names: Iterable[str] = (),
                 whole: bool = False):
        self.root = Path(root)
        self.command = command
        self.flag = flag
        self.names = tuple(names)
        self.whole = whole
        """The folder is replaced whole (``replace_folder``): anything in it that no run claimed is a stray."""
        self.ledger = Ledger(self.root)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.root)!r}, {self.command!r})"

    # -------------------------------------------------------------- checks, touching nothing
    def ours(self) -> bool:
        """Whether a run of the command wrote this folder."""
        return self.ledger.owner() == self.command

    def check(self, beside: bool | None = None, new: bool = False) -> None:
        """Refuse, in one line naming the flag, a folder the command cannot write into: the current directory (a
        project's own files); a file; another command's output folder; a non-empty folder no run of the command
        wrote (unless ``beside``: the user asked to write beside what it holds, with ``--overwrite true``; None:
        the command has no such flag); files under the command's names that no run of it wrote; with ``new`` (a
        command that deletes nothing), any non-empty folder. Touches nothing."""
        root, flag = self.root, self.flag
        if root.is_dir() and root.resolve() == Path.cwd().resolve():
            raise SettingError(f"{flag} {root} is the current directory: choose a folder of its own")
        for parent in [root, *root.parents]:
            if parent.exists():
                if not parent.is_dir():
                    raise SettingError(f"{flag} {root}: {parent} is a file, not a folder")
                break
        owner = self.ledger.owner()
        if owner is not None and owner != self.command:
            raise SettingError(f"{flag} {root} is the output folder of `specheads {owner}`, not of `specheads "
                               f"{self.command}`: choose another folder")
        found = contents(root)
        if new and found:
            raise SettingError(f"{flag} {root} is not empty: choose a new folder (`specheads {self.command}` deletes "
                               "nothing)")
        if owner is None and found and not beside:
            hint = "" if beside is None else (", or pass --overwrite true to write beside what it holds (nothing "
                                              "a run did not write is ever deleted)")
            raise SettingError(f"{flag} {root} is not empty ({listing(found)}) and no `specheads {self.command}` wrote "
                               f"it: choose another folder{hint}")
        strays = self.strays()
        if strays:
            raise SettingError(f"{flag} {root} holds {listing([_relative(root, p) for p in strays])}, which no "
                               f"`specheads {self.command}` wrote: move them or choose another folder (a run would "
                               "read them as its own or write over them)")

    def named(self) -> list[Path]:
        """The files under the command's names that are there."""
        if not self.root.is_dir():
            return []
        return sorted({p for pattern in self.names for p in self.root.glob(pattern)
                       if p.is_file() and not OUR_NAME.fullmatch(p.name)})

    def strays(self) -> list[Path]:
        claimed = self.ledger.claimed(self.command)
        if self.whole:
            return self._unclaimed(claimed)
        return [p for p in self.named() if _relative(self.root, p) not in claimed]

    def _unclaimed(self, claimed: set[str]) -> list[Path]:
        """Everything in a folder replaced whole that no run claimed: a file, a link, a folder holding no claimed
        file (the swap would delete it)."""
        holding = {parent.as_posix() for name in claimed for parent in Path(name).parents}
        found = []
        for top, dirs, files in os.walk(self.root):
            for name in [*dirs, *files]:
                path = Path(top) / name
                rel = _relative(self.root, path)
                if OUR_NAME.fullmatch(name) and Path(top) == self.root:
                    continue
                if rel in claimed or (rel in holding and path.is_dir() and not path.is_symlink()):
                    continue
                found.append(path)
        return sorted(found)

    def files(self) -> list[Path]:
        """Every file the command wrote here, under its names (all it claimed where it names none), that is there:
        what ``clear`` deletes. A folder is never deleted whole, whatever a ledger line names (a user's file may be in
        it), and a command that writes here in several roles (a training run's outputs, heads, checkpoints) clears
        only the files of the role it clears."""
        root = self.root.resolve()
        named = [n for n in self.ledger.claimed(self.command)
                 if not self.names or any(fnmatch.fnmatchcase(n, pattern) for pattern in self.names)]
        # through a folder linked from elsewhere a claimed name would reach another's files: not ours
        return sorted(p for p in (self.root / n for n in named)
                      if (p.is_file() or p.is_symlink()) and not p.is_dir()
                      and p.parent.resolve().is_relative_to(root))

    # -------------------------------------------------------------- writing
    @contextlib.contextmanager
    def hold(self, what: str) -> Iterator["RunFolder"]:
        """Lock the folder for the block (``folder_lock``); a folder the block created and left holding none of the
        command's files (a run refused or failed before its first output) is removed again."""
        created = not self.root.exists()
        try:
            with folder_lock(self.root, what, self.flag):
                try:
                    yield self
                finally:  # still held: another run's ledger cannot be here unless it is this command's own
                    if created and not contents(self.root) and not self.files() \
                            and {c for c, _ in self.ledger.entries()} <= {self.command}:
                        with contextlib.suppress(OSError):
                            self.ledger.path.unlink(missing_ok=True)
        finally:
            if created:
                with contextlib.suppress(OSError):  # only when nothing is left in it, another run's lock included
                    self.root.rmdir()

    def start(self, names: Iterable[str] = ()) -> None:
        """Make the folder the command's (its first write, once every input is checked), claiming ``names``."""
        self.ledger.claim(self.command, [FOLDER, *names])

    def claim(self, path: Path) -> Path:
        """Record ``path``, a file of this folder, as the command's before it is written; returns it."""
        self.ledger.claim(self.command, [_relative(self.root, Path(path))])
        return Path(path)

    def write_text(self, path: Path, text: str) -> Path:
        return write_text(self.claim(path), text)

    def write_json(self, path: Path, obj) -> Path:
        return write_json(self.claim(path), obj)

    def clean_temporaries(self) -> None:
        """Remove what a killed run left half-written: the temporaries ``write_with`` names after the command's own
        files (``.<name>.tmp<pid>``), nothing else."""
        for name in self.ledger.claimed(self.command):
            path = self.root / name
            prefix = f".{path.name}.tmp"
            for tmp in path.parent.glob(f"{glob.escape(prefix)}[0-9]*"):
                if tmp.name[len(prefix):].isdigit() and not tmp.is_dir():  # a pid: ``write_with``'s, nothing else
                    tmp.unlink(missing_ok=True)

    def clear(self) -> None:
        """Delete the files the command wrote here, and the folders under it that this emptied; nothing else."""
        folders = set()
        for p in self.files():
            p.unlink(missing_ok=True)
            folders.update(q for q in p.parents if self.root in q.parents)
        for d in sorted(folders, key=lambda q: len(q.parts), reverse=True):
            with contextlib.suppress(OSError):  # only when emptied: another file in it is not ours
                d.rmdir()
        self.ledger.forget(self.command)


class OutputFile:
    """One output file of a command (a calibration, a timing file, a schedule), given by ``flag``: a new path where a
    folder can hold it, or a file the ledger of its folder lists as the command's, which is replaced."""

    def __init__(self, path: str | Path, command: str, what: str, flag: str = "--out"):
        self.path = Path(path)
        self.command = command
        self.flag = flag
        self.what = what
        self.ledger = Ledger(self.path.parent)

    def check(self) -> None:
        """Refuse, in one line, a folder, a path under a file, and a file no run of the command wrote (a label
        folder's manifest, a user's notes, another command's output). Touches nothing."""
        out, flag = self.path, self.flag
        if out.is_dir():
            raise SettingError(f"{flag} {out} is a folder: give the {self.what} to write")
        for parent in out.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise SettingError(f"{flag} {out}: {parent} is a file, not a folder")
                break
        if out.name in OURS:
            raise SettingError(f"{flag} {out}: {out.name} is a name this project keeps for itself; give another")
        if out.exists() and out.name not in self.ledger.claimed(self.command):
            raise SettingError(f"{flag} {out} exists and no `specheads {self.command}` wrote it: give a new path (or "
                               f"a {self.what} that command wrote, which is replaced)")

    def claim(self) -> Path:
        """Record the file as the command's, before it is written; returns its path."""
        self.ledger.claim(self.command, [self.path.name])
        return self.path
