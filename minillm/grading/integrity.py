"""Keep a submission from changing the grader for the next student.

The kernel runs as the same user as the grader, so it *can* write to the installed package.
Before the kernel starts, the grader has already imported everything it grades with (so the
current grade is computed by code in memory), and :class:`Snapshot` records every file of the
``minillm`` package and every start-up hook of the interpreter (``*.pth``, ``sitecustomize``,
``usercustomize``) with its bytes. After the kernel is dead, :meth:`Snapshot.restore` puts back
whatever changed, deletes what was added (a planted ``.pyc`` or ``.pth`` included) and says
what it found, so the report can flag the submission. For a stronger boundary, run the grader
in a container or as a user that cannot write the installation (see the README).
"""

from __future__ import annotations

import hashlib
import os
import site
import sys
from pathlib import Path

MAX_SNAPSHOT_BYTES = 256 * 2**20


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

    def restore(self) -> list[str]:
        """Undo every change to the guarded files; returns what was changed (empty: nothing).
        Byte-code caches are put back too but not reported: the interpreter rewrites them
        itself, and a restored or removed ``.pyc`` is simply compiled again from its source."""
        changes: list[str] = []
        report = changes.append
        changes_of = lambda path, text: None if "__pycache__" in path.parts else report(text)  # noqa: E731
        present = set(self._guarded())
        for path in sorted(present - set(self.files)):
            changes_of(path, f"added {path}")
            try:
                if path.is_dir() and not path.is_symlink():
                    continue
                path.unlink()
            except OSError:
                pass
        for path, data in self.files.items():
            try:
                same = not path.is_symlink() and path.read_bytes() == data
            except OSError:
                same = False
            if not same:
                changes_of(path, f"changed {path}")
                try:
                    if path.is_symlink() or path.is_dir():
                        path.unlink()
                    tmp = path.with_name(f".{path.name}.restore-{os.getpid()}")
                    tmp.write_bytes(data)
                    os.replace(tmp, path)
                except OSError as exc:
                    changes.append(f"could not restore {path}: {exc}")
        return changes

    def digest(self) -> str:
        """A short hash of the grader's own sources (``minillm/grading/*.py``): its version."""
        h = hashlib.sha256()
        for path in sorted(p for p in self.files if p.parent.name == "grading" and p.suffix == ".py"):
            h.update(str(path).encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        return h.hexdigest()[:16]
