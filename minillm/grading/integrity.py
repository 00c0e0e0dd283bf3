"""Keep a submission from changing the grader for the next student.

The kernel runs as the same user as the grader, so it *can* write to the installed package.
Before the kernel starts, the grader has already imported everything it grades with (so the
current grade is computed by code in memory), and :class:`Snapshot` records every file of the
``minillm`` package and every start-up hook of the interpreter (``*.pth``, ``sitecustomize``,
``usercustomize``) with its bytes. After the kernel is dead, :meth:`Snapshot.restore` puts back
whatever the submission could have changed, deletes what it could have added (a planted ``.pyc``
or ``.pth`` included) and says what it found, so the report can flag the submission. For a
stronger boundary, run the grader in a container or as a user that cannot write the installation
(see the README).

This fallback runs only where the kernel had no read-only view, often a developer's own checkout.
Someone else's edit is told from the submission's by its ``st_ctime`` (the inode's change time,
which a process cannot set, unlike the mtime): a file last changed after the kernel was dead is
kept. An edit made while the kernel ran cannot be told apart and is undone, but never lost: the
version undone is copied to a private folder first, and every restored file is warned about
(:class:`GraderFilesRestored`) with where its copy is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import site
import sys
import tempfile
import warnings
from pathlib import Path

MAX_SNAPSHOT_BYTES = 256 * 2**20
#: file timestamps come from a coarse clock (a few ms): a change this close to the kernel's end
#: still counts as the kernel's
CTIME_SLACK_NS = 50_000_000


class GraderFilesRestored(UserWarning):
    """Files of the grader changed during a grade were put back (each named, with its copy)."""


def _package_root() -> Path:
    import minillm

    return Path(minillm.__file__).resolve().parent


def _hook_dirs() -> list[Path]:
    dirs = set()
    for d in list(site.getsitepackages()) + [site.getusersitepackages()] + [p for p in sys.path if p]:
        try:
            path = Path(d).resolve()
        except OSError:
            continue
        if path.is_dir() and ("site-packages" in path.parts or "dist-packages" in path.parts):
            dirs.add(path)
    return sorted(dirs)


def _is_hook(path: Path) -> bool:
    return path.suffix == ".pth" or path.stem in ("sitecustomize", "usercustomize")


class Snapshot:
    """Every guarded file's bytes at one moment."""

    def __init__(self) -> None:
        self.root = _package_root()
        self.hook_dirs = _hook_dirs()
        self.files: dict[Path, bytes] = {}
        self.kept: list[str] = []
        #: where restore() copies the versions it undoes (None until it undoes one)
        self.kept_copies: Path | None = None
        total = 0
        for path in self._guarded():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            total += len(data)
            if total > MAX_SNAPSHOT_BYTES:
                raise RuntimeError("the installed package is too large to guard")
            self.files[path] = data

    def _guarded(self) -> list[Path]:
        found = [p for p in self.root.rglob("*") if p.is_file() or p.is_symlink()]
        for d in self.hook_dirs:
            try:
                found += [p for p in d.iterdir() if _is_hook(p)]
            except OSError:
                continue
        return found

    def restore(self, kernel_ended_ns: int | None = None) -> list[str]:
        """Undo every change to the guarded files the submission could have made; returns what was
        changed (empty: nothing). ``kernel_ended_ns`` (``time.time_ns()`` once the kernel and every
        process it started were dead): a file whose ``st_ctime`` is later was changed by someone
        else and is kept (None: every change counts as the submission's). What is undone is first
        copied to :attr:`kept_copies` (a private folder) and warned about. Byte-code caches are put
        back too but neither reported nor copied: the interpreter rewrites them itself."""
        changes: list[str] = []
        self.kept = []  # changed by someone else after the kernel: left as they are
        present = set(self._guarded())
        for path in sorted(present - set(self.files)):
            if self._after_kernel(path, kernel_ended_ns):
                continue
            self._note(changes, path, "added")
            if path.is_dir() and not path.is_symlink():  # (a hook-named folder: reported, left)
                continue
            try:
                path.unlink()
            except OSError:
                pass
        for path, data in self.files.items():
            try:
                same = not path.is_symlink() and path.read_bytes() == data
            except OSError:
                same = False
            if same or self._after_kernel(path, kernel_ended_ns):
                continue
            self._note(changes, path, "changed")
            try:
                if path.is_symlink() or path.is_dir():
                    path.unlink()
                tmp = path.with_name(f".{path.name}.restore-{os.getpid()}")
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError as exc:
                changes.append(f"could not restore {path}: {exc}")
        return changes

    def _after_kernel(self, path: Path, kernel_ended_ns: int | None) -> bool:
        """Whether ``path`` was last changed after the kernel had ended (then it is kept)."""
        if kernel_ended_ns is None:
            return False
        try:
            changed = path.lstat().st_ctime_ns
        except OSError:  # gone: removed while the kernel ran or after; put back
            return False
        if changed <= kernel_ended_ns + CTIME_SLACK_NS:
            return False
        self.kept.append(str(path))
        warnings.warn(f"minillm grade: {path} was changed after the submission's code had stopped: kept as it is",
                      GraderFilesRestored, stacklevel=3)
        return True

    def _note(self, changes: list[str], path: Path, how: str) -> None:
        """Report ``path`` (``how``: "added" or "changed") and copy what is there now aside."""
        if "__pycache__" in path.parts:
            return
        copy = self._copy_aside(path)
        changes.append(f"{how} {path}")
        undone = "removed" if how == "added" else "put back as it was before the grade"
        warnings.warn(f"minillm grade: {path} was {how} while a submission's code ran; it is {undone}"
                      + (f" (the {how} version is kept at {copy})" if copy else ""), GraderFilesRestored, stacklevel=3)

    def _copy_aside(self, path: Path) -> Path | None:
        """A copy of ``path`` as it is now in a private folder (made 0700 on first use), or None."""
        if path.is_symlink() or not path.is_file():
            return None
        try:
            if self.kept_copies is None:
                self.kept_copies = Path(tempfile.mkdtemp(prefix="minillm-grade-undone-"))
            try:
                rel = path.relative_to(self.root)
            except ValueError:
                rel = Path("site-hooks") / path.name
            dest = self.kept_copies / rel
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            shutil.copyfile(path, dest, follow_symlinks=False)
            return dest
        except OSError:
            return None

    def digest(self) -> str:
        """A short hash of the grader's own sources (``minillm/grading/*.py``): its version."""
        h = hashlib.sha256()
        for path in sorted(p for p in self.files if p.parent.name == "grading" and p.suffix == ".py"):
            h.update(str(path).encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        return h.hexdigest()[:16]
