"""Where compiled kernel libraries are kept, and the checks made before one is loaded.

Loading a shared library runs its code, so a library another user could have written is as
dangerous as running their program. The cache therefore trusts only what it can check:

* the folder is the user's own (``~/.cache/minillm/kernels``, ``MINILLM_KERNEL_CACHE`` overrides;
  ``$TMPDIR/minillm-kernels-<uid>`` when that cannot be made; a fresh folder for this process
  alone when neither is safe), created 0700, and refused when it is a symlink, belongs to
  someone else, or can be written by the group or others;
* each library is recorded when it is built: a small manifest ``<name>-<key>.sha256`` (``key``
  hashes the source, compiler, flags and CPU) holds the SHA-256 of the library's bytes, and the
  library itself is ``<name>-<key>-<sha[:16]>.so``, so two concurrent builds never mix a
  manifest with the other's library;
* before loading, the library is opened once (no symlink followed, relative to the folder's own
  descriptor), its owner and mode are checked on that descriptor and its bytes hashed from it,
  and the dynamic loader is handed the same open file (``/proc/self/fd/N``): what was checked
  is what is loaded, whatever happens to the name in between.

A library that fails a check is refused with a :class:`UntrustedLibrary` warning naming the
reason, removed when it is ours, and rebuilt.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

SHA_HEX = 64
#: Open descriptors of loaded libraries: kept for the process's life so that a
#: ``/proc/self/fd/N`` name is never reused for a different library (the dynamic loader
#: would take the name for one it already has).
_held_fds: list[int] = []


class UntrustedLibrary(UserWarning):
    """A cached library (or its folder) failed an owner, mode or hash check and was not loaded."""


class UnsafeCacheDir(OSError):
    """A cache folder another user could write into (or that is not a plain folder)."""


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else -1


def default_dirs() -> list[tuple[Path, bool]]:
    """The folders tried in turn, each with whether it is minillm's own by name (and so may be
    tightened to 0700, see ``open_private_dir``): the configured or per-user cache, then a
    per-user temporary one."""
    root = os.environ.get("MINILLM_KERNEL_CACHE")
    if root:
        first = (Path(root), False)  # the user's choice: used as it is or refused, never changed
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        first = (Path(base) / "minillm" / "kernels", True)
    return [first, (Path(tempfile.gettempdir()) / f"minillm-kernels-{_uid()}", True)]


def check_owned(st: os.stat_result, what: str, kind: Callable[[int], bool]) -> None:
    """Refuse anything not of ``kind``, not owned by this user, or writable by group or others."""
    if not kind(st.st_mode):
        raise UnsafeCacheDir(f"{what} is not a plain {'folder' if kind is stat.S_ISDIR else 'file'}")
    if hasattr(os, "geteuid") and st.st_uid != _uid():
        raise UnsafeCacheDir(f"{what} belongs to user id {st.st_uid}, not to this user ({_uid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDir(f"{what} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})")


def open_private_dir(path: Path, tighten: bool = False) -> int:
    """A descriptor of ``path``, made 0700 if missing; ``UnsafeCacheDir`` if not this user's alone.

    ``tighten``: a folder of minillm's own name that this user owns but the group or others may
    write (made by an older minillm under a umask of 002) is set to 0700 instead of refused. That
    is safe because every file in it is checked on its own (owner, mode, hash): anything someone
    else put there while it was open is theirs, and refused."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if os.path.islink(path):
            raise UnsafeCacheDir(f"folder {path} is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if tighten and stat.S_ISDIR(st.st_mode) and st.st_uid == _uid() and st.st_mode & 0o022:
            os.fchmod(fd, 0o700)
            st = os.fstat(fd)
        check_owned(st, f"folder {path}", stat.S_ISDIR)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_dir() -> tuple[Path, int]:
    """The first usable cache folder and a descriptor of it. When every shared place is unsafe
    (someone squats ``$TMPDIR/minillm-kernels-<uid>``), a fresh folder for this process alone
    (rebuilt each run, removed at exit); ``RuntimeError`` listing why when not even that works."""
    problems = []
    for path, tighten in default_dirs():
        try:
            return path, open_private_dir(path, tighten)
        except UnsafeCacheDir as exc:
            warnings.warn(f"minillm: skipped an unsafe place for compiled kernels: {exc}", UntrustedLibrary,
                          stacklevel=3)
            problems.append(str(exc))
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
    try:
        path = Path(tempfile.mkdtemp(prefix="minillm-kernels-", dir=tempfile.gettempdir()))  # 0700, new
    except OSError as exc:
        problems.append(f"a fresh temporary folder: {exc.strerror or exc}")
        raise RuntimeError("no private folder for the kernel cache: " + "; ".join(problems)) from None
    atexit.register(shutil.rmtree, path, True)  # the loaded library stays mapped
    return path, open_private_dir(path)


def private_inductor_cache() -> str:
    """Make sure torch's inductor cache (``TORCHINDUCTOR_CACHE_DIR``, by default
    ``$TMPDIR/torchinductor_<user>``) is this user's alone before anything is compiled, and
    return it. Inductor keeps generated code, compiled libraries and pickled graphs there and
    loads what it finds under a predictable name (a file already present is not rewritten),
    so a folder another user made first, or can write, would run their code as ours. Such a
    folder is refused (``UntrustedLibrary`` warning naming why) and ``TORCHINDUCTOR_CACHE_DIR``
    is pointed at ``inductor/`` inside the kernel cache folder instead."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        path = Path(configured)
    else:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        path = Path(default_cache_dir())
    try:
        os.close(open_private_dir(path.absolute()))
    except (UnsafeCacheDir, OSError) as exc:
        folder, dfd = private_dir()
        os.close(dfd)
        fallback = folder / "inductor"
        os.close(open_private_dir(fallback))
        warnings.warn(f"minillm: torch's inductor cache {path} is not safe ({exc}); using {fallback}",
                      UntrustedLibrary, stacklevel=2)
        path = fallback
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path.absolute())
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def _read_manifest(dfd: int, stem: str) -> str | None:
    """The SHA-256 recorded for ``stem``, or None when there is no (well-formed, own) record."""
    try:
        fd = os.open(f"{stem}.sha256", os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=dfd)
    except FileNotFoundError:
        return None
    try:
        check_owned(os.fstat(fd), f"manifest {stem}.sha256", stat.S_ISREG)
        text = os.pread(fd, 200, 0).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if len(text) != SHA_HEX or any(c not in "0123456789abcdef" for c in text):
        raise UnsafeCacheDir(f"manifest {stem}.sha256 does not hold a SHA-256")
    return text


def open_verified(dfd: int, stem: str) -> int | None:
    """A descriptor of ``stem``'s library when it passes every check; None when not built yet.
    ``UnsafeCacheDir`` names the failed check."""
    sha = _read_manifest(dfd, stem)
    if sha is None:
        return None
    name = f"{stem}-{sha[:16]}.so"
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeCacheDir(f"library {name} cannot be opened safely ({exc.strerror})") from None
    try:
        check_owned(os.fstat(fd), f"library {name}", stat.S_ISREG)
        actual = sha256_fd(fd)
        if actual != sha:
            raise UnsafeCacheDir(f"library {name} has SHA-256 {actual[:16]}..., not the {sha[:16]}... "
                                 f"recorded when it was built (modified after the build)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove(dfd: int, stem: str) -> None:
    """Drop ``stem``'s manifest and libraries (only files we own can be in our own folder)."""
    for entry in os.listdir(dfd):
        if entry == f"{stem}.sha256" or (entry.startswith(f"{stem}-") and entry.endswith(".so")):
            try:
                os.unlink(entry, dir_fd=dfd)
            except OSError:
                pass


def _record(dfd: int, folder: Path, stem: str, built: Path) -> None:
    """Move a fresh build into the folder under its hash, then point the manifest at it (atomically)."""
    with open(built, "rb") as f:
        sha = sha256_fd(f.fileno())
    os.chmod(built, 0o700)
    os.replace(built, folder / f"{stem}-{sha[:16]}.so")
    tmp = folder / f".{stem}.sha256.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(sha + "\n")
    os.replace(tmp, folder / f"{stem}.sha256")


def loadable_path(fd: int) -> str:
    """A name the dynamic loader resolves to the open file ``fd`` (kept open for good)."""
    _held_fds.append(fd)
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fd}"


def cached_library(stem: str, build: Callable[[Path], None]) -> str:
    """A verified, loadable name for the library ``stem`` (``<name>-<key>``), building it with
    ``build(output_path)`` when it is missing or failed a check. Build errors propagate."""
    folder, dfd = private_dir()
    try:
        try:
            fd = open_verified(dfd, stem)
        except UnsafeCacheDir as exc:
            warnings.warn(f"minillm: refusing the cached kernel in {folder}: {exc}; rebuilding it",
                          UntrustedLibrary, stacklevel=2)
            _remove(dfd, stem)
            fd = None
        if fd is None:
            with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
                built = Path(tmp) / f"{stem}.so"
                build(built)
                _record(dfd, folder, stem, built)
            fd = open_verified(dfd, stem)
            if fd is None:
                raise RuntimeError(f"the kernel library {stem} vanished from {folder} right after its build")
        return loadable_path(fd)
    finally:
        os.close(dfd)
