"""A submission's code, run where it cannot touch the grade: a separate, limited, killable process.

:class:`Kernel` starts ``python -I -m minillm.grading._worker`` in its own session (so its own
process group) with resource limits (CPU seconds, address space, file size, open files, and
processes where the limit applies), a scratch working directory and ``HOME``, and no stdout
or stderr reaching the grader. Every request to it — run a cell, read a variable, call a
function — has a deadline, and the whole run has one more; when either passes, or anything
goes wrong, the process group is sent SIGKILL, which a cell cannot ignore, and C code holding
the GIL cannot outlive. The grader makes itself a *child subreaper* so that processes which
escape the group (``setsid``, double fork) are reparented to it and killed too.

The kernel starts inside the jail of :mod:`jail` (bubblewrap, else ``unshare``): its own user,
mount, PID and network namespaces, a read-only view of only what Python needs, no ``tests/`` and
no model answers. Where a ``pids`` cgroup can be made, it also caps the kernel's tasks (a fork
bomb stops there even for root, whom ``RLIMIT_NPROC`` does not bind).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import time

from . import jail as jails
from . import wire
from .engine_guard import WHOLE_ENGINE

MAX_REPLY = 32 * 2**20
MEMORY_LIMIT = 4 * 2**30
FILE_SIZE_LIMIT = 64 * 2**20
EXTRA_PROCESSES = 256
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


class KernelDied(RuntimeError):
    """The kernel is gone (killed at a deadline, crashed, or closed its pipe)."""


class Deadline(KernelDied):
    """A request or the whole run passed its deadline; the kernel was killed."""


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid:
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
_KEEP_WRITABLE = ("/proc", "/sys", "/dev")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read_only_view(scratch: str) -> None:
    """In the child, before exec: a private user and mount namespace in which every file system is
    read-only except the scratch folder, with every capability dropped so the kernel cannot undo it.
    Raises OSError where the platform does not allow it (the snapshot/restore still guards then)."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), what)

    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    s = scratch.encode()
    check(libc.mount(s, s, None, MS_BIND | MS_REC, None), "bind the scratch folder")
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in points:
        if point == scratch or point.startswith(scratch + "/"):
            continue
        if any(point == k or (k != "/dev" and point.startswith(k + "/")) for k in _KEEP_WRITABLE) \
                or point.startswith("/dev/pts"):
            continue
        p = point.encode()
        if libc.mount(p, p, None, MS_BIND | MS_REC, None) == 0:
            libc.mount(None, p, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    check(libc.mount(None, b"/", None, MS_BIND | MS_REMOUNT | MS_RDONLY, None), "read-only root")
    os.chdir(scratch)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _limits(cpu_seconds: int, nproc: int | None, scratch: str | None = None, cgroups: tuple = ()):
    def apply() -> None:
        os.umask(0o077)
        try:  # if the grader dies, so does the kernel (and the jail it is in)
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:
            pass
        for cgroup in cgroups:
            try:
                _write(os.path.join(cgroup, "cgroup.procs"), str(os.getpid()))
            except OSError:
                pass
        if scratch is not None:
            try:
                _read_only_view(scratch)
            except Exception:  # no user namespaces here: the grader's snapshot/restore still guards
                pass
        for what, value in ((resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_AS, MEMORY_LIMIT),
                            (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT), (resource.RLIMIT_CORE, 0),
                            (resource.RLIMIT_NOFILE, 512)):
            try:
                resource.setrlimit(what, (value, value))
            except (ValueError, OSError):
                pass
        if nproc is not None:
            try:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            except (ValueError, OSError):
                pass

    return apply


def _user_tasks() -> int:
    uid, n = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return n


_CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")


def _remove_stale_cgroups(base: str, older_than: float = 60.0) -> None:
    """Remove the empty task cgroups a killed grader left behind (a cgroup that still holds a task
    cannot be removed; one made in the last minute may be about to receive its kernel)."""
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith("minillm-grade-") and e.is_dir()]
    except OSError:
        return
    for entry in entries:
        try:
            if time.time() - entry.stat().st_mtime > older_than:
                os.rmdir(entry.path)
        except OSError:
            continue


def _make_task_cgroup(limit: int) -> str | None:
    """A fresh ``pids`` cgroup allowing ``limit`` tasks, or None where this process may not make one."""
    for base in _CGROUP_ROOTS:
        if not os.path.isfile(os.path.join(base, "cgroup.procs")) or \
                (base == "/sys/fs/cgroup" and not os.path.isfile(os.path.join(base, "cgroup.controllers"))):
            continue
        if os.access(base, os.W_OK):
            _remove_stale_cgroups(base)
        path = tempfile.mkdtemp(prefix="minillm-grade-", dir=base) if os.access(base, os.W_OK) else None
        if path is None:
            continue
        try:
            _write(os.path.join(path, "pids.max"), str(limit))
            return path
        except OSError:
            _remove_cgroup(path)
    return None


#: what the kernel and everything it starts may hold in memory together, page cache of its tmpfs and
#: kernel objects (its files) included, where a memory cgroup can be made
MEMORY_CGROUP_LIMIT = 6 * 2**30


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in the hierarchy of ``controller`` ("" for the unified one)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if controller in names.split(",") if controller else names == "":
                    return path
    except (OSError, ValueError):
        pass
    return None


def _make_memory_cgroup(limit: int) -> str | None:
    """A fresh memory cgroup below this process's own, capped at ``limit`` bytes, or None where this
    process may not make one (cgroup v1 ``memory``, or v2 with the controller delegated)."""
    for root, controller, knob in (("/sys/fs/cgroup/memory", "memory", "memory.limit_in_bytes"),
                                   ("/sys/fs/cgroup", "", "memory.max")):
        own = _own_cgroup(controller)
        base = os.path.normpath(root + own) if own is not None else None
        if base is None or not os.path.isfile(os.path.join(base, "cgroup.procs")) or not os.access(base, os.W_OK):
            continue
        _remove_stale_cgroups(base)
        try:
            path = tempfile.mkdtemp(prefix="minillm-grade-", dir=base)
        except OSError:
            continue
        try:
            _write(os.path.join(path, knob), str(limit))
            return path
        except OSError:
            _remove_cgroup(path)
    return None


def _remove_cgroup(path: str | None) -> None:
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass


class Kernel:
    """One sandboxed kernel. Use as a context manager; :meth:`close` always kills everything."""

    def __init__(self, overall_deadline: float, cell_timeout: float, files: dict[str, bytes] | None = None,
                 jail: jails.Jail | None = None):
        self.ends_at = time.monotonic() + overall_deadline
        self.cell_timeout = cell_timeout
        self.proc: subprocess.Popen | None = None
        self.scratch = tempfile.mkdtemp(prefix="minillm-grade-")
        for name, data in (files or {}).items():
            with open(os.path.join(self.scratch, os.path.basename(name)), "wb") as f:
                f.write(data)
        self._buf = b""
        self.isolated = False
        self.jail = jail if jail is not None else jails.Jail("none", "no jail was asked for")
        self.cgroups: list[str] = []
        self._prepared = False
        #: the notebook's code cells: the clean room compiles them itself (see :mod:`export`)
        self.sources: list[str] = []
        self._clean_ready = False
        self._exports: dict[str, dict] = {}

    # --- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        _become_subreaper()
        self._known_children = set(_children_of(os.getpid()))
        cmd_r, cmd_w = os.pipe()
        rep_r, rep_w = os.pipe()
        clean_r, clean_w = os.pipe()  # the clean room's own pair: the kernel closes its ends at once
        clean_rep_r, clean_rep_w = os.pipe()
        inside = jails.JAIL_SCRATCH if self.jail.isolated else self.scratch
        os.makedirs(os.path.join(self.scratch, "home"), exist_ok=True)
        home = os.path.join(inside, "home")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "IPYTHONDIR": os.path.join(home, "ipy"),
               "MPLCONFIGDIR": os.path.join(home, "mpl"), "MPLBACKEND": "Agg", "TQDM_DISABLE": "1",
               "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
               "MINILLM_GRADER_FDS": f"{cmd_r},{rep_w}", "MINILLM_GRADER_CLEAN_FDS": f"{clean_r},{clean_rep_w}"}
        for key in ("MINILLM_MODEL", "MINILLM_DEVICE"):
            if key in os.environ:
                env[key] = os.environ[key]
        remaining = max(1, int(self.ends_at - time.monotonic()) + 2)
        nproc = _user_tasks() + (EXTRA_PROCESSES if os.getuid() != 0 else 4 * EXTRA_PROCESSES)
        self.cgroups = [c for c in (_make_task_cgroup(EXTRA_PROCESSES), _make_memory_cgroup(MEMORY_CGROUP_LIMIT)) if c]
        seccomp = jails.seccomp_pipe() if self.jail.mode == "bwrap" else None
        argv = jails.command(self.jail, os.path.realpath(self.scratch), ["-I", "-B", "-X", "utf8"], seccomp)
        unjailed_view = None if self.jail.isolated else os.path.realpath(self.scratch)
        try:
            self.proc = subprocess.Popen(
                argv, cwd=self.scratch, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=tuple(fd for fd in (cmd_r, rep_w, clean_r, clean_rep_w, seccomp) if fd is not None),
                start_new_session=True, close_fds=True,
                preexec_fn=_limits(remaining, nproc, unjailed_view, tuple(self.cgroups)))
        finally:
            for fd in (cmd_r, rep_w, clean_r, clean_rep_w, seccomp):
                if fd is not None:
                    os.close(fd)
        self._cmd = os.fdopen(cmd_w, "wb")
        self._rep = rep_r
        os.set_blocking(self._rep, False)
        self._clean_cmd = os.fdopen(clean_w, "wb")
        self._clean_rep, self._clean_buf = clean_rep_r, b""
        os.set_blocking(self._clean_rep, False)
        self.isolated = bool(self._read(min(60.0, self.cell_timeout * 4), expect="ready").get("read_only"))

    def close(self) -> None:
        """SIGKILL the kernel's process group and every process that escaped it; remove the scratch folder."""
        if self.proc is not None:
            pgid, me = self.proc.pid, os.getpid()
            give_up = time.monotonic() + 10
            while time.monotonic() < give_up:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                strays = [p for p in _children_of(me) if p not in self._known_children and p != pgid]
                for pid in strays:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                for pid in strays:
                    try:
                        os.waitpid(pid, 0)
                    except ChildProcessError:
                        pass
                try:
                    self.proc.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    continue
                if not strays:
                    time.sleep(0.05)  # a last look: a grandchild may be being reparented right now
                    if not [p for p in _children_of(me) if p not in self._known_children and p != pgid]:
                        break
            for f in (getattr(self, "_cmd", None), getattr(self, "_clean_cmd", None)):
                try:
                    f and f.close()
                except OSError:
                    pass
            for name in ("_rep", "_clean_rep"):
                try:
                    os.close(getattr(self, name))
                except (OSError, AttributeError):
                    pass
            self.proc = None
        for cgroup in self.cgroups:
            _remove_cgroup(cgroup)
        self.cgroups = []
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> "Kernel":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- protocol ---------------------------------------------------------------------------
    def _send(self, obj: dict, clean: bool = False) -> None:
        if not self.alive:
            raise KernelDied("the kernel is not running")
        try:
            pipe = self._clean_cmd if clean else self._cmd
            pipe.write((json.dumps(obj) + "\n").encode("utf-8"))
            pipe.flush()
        except (BrokenPipeError, OSError):
            self.close()
            raise KernelDied("the kernel closed its pipe") from None

    def _read(self, timeout: float, expect: str | None = None, clean: bool = False) -> dict:
        """The next reply line from the kernel (``clean``: from the clean room's own pipe)."""
        buf = "_clean_buf" if clean else "_buf"
        until = min(time.monotonic() + timeout, self.ends_at)
        overall = until == self.ends_at
        while b"\n" not in getattr(self, buf):
            left = until - time.monotonic()
            if left <= 0:
                self.close()
                raise Deadline("the whole run's time limit passed" if overall else f"no answer within {timeout:g} s")
            chunk = self._chunk(self._clean_rep if clean else self._rep, left)
            if chunk is None:
                continue
            setattr(self, buf, getattr(self, buf) + chunk)
            if len(getattr(self, buf)) > MAX_REPLY:
                self.close()
                raise KernelDied("the kernel sent too much data")
        line, rest = getattr(self, buf).split(b"\n", 1)
        setattr(self, buf, rest)
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested deep enough to exhaust the parser
            self.close()
            raise KernelDied("the kernel sent something that is not a reply") from None
        if not isinstance(msg, dict) or (expect and msg.get("op") != expect):
            self.close()
            raise KernelDied("the kernel sent an unexpected reply")
        return msg

    def _chunk(self, fd: int, left: float) -> bytes | None:
        """What ``fd`` has now (None: nothing yet); :class:`KernelDied` when the kernel is gone."""
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            if self.proc is not None and self.proc.poll() is not None:
                self.close()
                raise KernelDied("the kernel exited")
            return None
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return None
        if not chunk:
            self.close()
            raise KernelDied("the kernel exited")
        return chunk

    def run_cell(self, source: str) -> str | None:
        """Run one cell; its error as one line, or None. Raises :class:`Deadline` when it runs too long."""
        self._send({"op": "run", "source": source})
        err = self._read(self.cell_timeout, "ran").get("error")
        return str(err)[:500] if err is not None else None

    def get(self, name: str):
        """``(found, value, is_callable)`` for a variable of the kernel's namespace."""
        self._send({"op": "get", "name": name})
        msg = self._read(self.cell_timeout, "value")
        if msg.get("missing"):
            return False, None, False
        return True, wire.decode(msg.get("value")), bool(msg.get("callable"))

    def call(self, name: str, args: tuple, kwargs: dict, timeout: float, forbid: tuple = ()):
        """``("returned", value)``, ``("raised", (message, exception type name))``, or
        ``("engine_used", names)`` when it reached an engine function in ``forbid``."""
        if WHOLE_ENGINE in forbid:
            return self._clean_call(name, args, kwargs, timeout, forbid)
        return self._kernel_call(name, args, kwargs, timeout, forbid)

    def _clean_call(self, name: str, args: tuple, kwargs: dict, timeout: float, forbid: tuple):
        """A call the engine must not answer, made in the clean room (see :mod:`export`). A function
        that cannot leave the kernel is called there as before, and the answer says so ("unverified")."""
        if not self._clean_ready:  # one-off work, outside any call's time limit
            self._send({"op": "prepare", "sources": self.sources}, clean=True)
            self._read(max(self.cell_timeout, 30.0), "prepared", clean=True)
            self._clean_ready = True
        if name not in self._exports:
            self._send({"op": "export", "name": name})
            self._exports[name] = self._read(self.cell_timeout, "exported")
        exported = self._exports[name]
        if "fn" not in exported:
            kind, payload = self._kernel_call(name, args, kwargs, timeout, forbid)
            return "unverified", (kind, payload, str(exported.get("error"))[:200])
        self._send({"op": "call", "fn": exported["fn"], "args": [wire.encode(a) for a in args],
                    "kwargs": {k: wire.encode(v) for k, v in kwargs.items()}, "forbid": list(forbid)}, clean=True)
        notes = []
        while True:
            msg = self._read(timeout, clean=True)
            if msg.get("op") != "note":
                break
            notes.append(str(msg.get("what")))
        if notes or msg.get("op") == "engine_used":
            found = notes or [str(n) for n in msg.get("names", [])]
            return "engine_used", ", ".join(found)[:200]
        return self._answer(msg)

    def _kernel_call(self, name: str, args: tuple, kwargs: dict, timeout: float, forbid: tuple):
        if forbid and not self._prepared:  # the guard's one-off work, outside any call's time limit
            self._send({"op": "prepare"})
            self._read(max(self.cell_timeout, 10.0), "prepared")
            self._prepared = True
        self._send({"op": "call", "name": name, "args": [wire.encode(a) for a in args],
                    "kwargs": {k: wire.encode(v) for k, v in kwargs.items()}, "forbid": list(forbid)})
        return self._answer(self._read(timeout))

    def _answer(self, msg: dict):
        if msg.get("op") == "engine_used":
            return "engine_used", ", ".join(str(n) for n in msg.get("names", []))[:200]
        if msg.get("op") == "returned":
            return "returned", wire.decode(msg.get("value"))
        if msg.get("op") == "raised":
            return "raised", (str(msg.get("error"))[:500], str(msg.get("exc_type"))[:80])
        self.close()
        raise KernelDied("the kernel sent an unexpected reply")
