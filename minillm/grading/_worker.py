"""The sandboxed kernel's side of ``minillm grade`` (runs only in the child process).

It executes the submission's code cells one at a time in an IPython shell, then answers the
grader's requests on a private pipe: "what is variable X" and "call function X with these
arguments". Replies are data (see :mod:`wire`). Nothing here is trusted by the grader: the
submission can rewrite this module's behaviour from a cell, and all it gains is the power to
choose its own answers, which it has anyway.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _reply(out, obj) -> None:
    out.write((json.dumps(obj) + "\n").encode("utf-8"))
    out.flush()


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<")]
    if frames:
        where = f" (line {frames[-1].lineno}, in {frames[-1].name})"
    return f"{type(exc).__name__}{': ' + text[:300] if text else ''}{where}"


def _end_helpers(spare: int | None = None) -> None:
    """In the jail (its own PID namespace), end every other process of the submission before a graded
    call (a helper started by a cell could otherwise answer for the graded function), except the
    clean room ``spare``."""
    import signal

    if spare is None:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (os.getpid(), spare, 1):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


#: most bytes a graded call's process may send back to the clean room (notes and its value)
MAX_CALL_REPORT = 24 * 2**20


def _clean_room(rfd: int, wfd: int) -> None:
    """The clean room's loop (a child forked before any cell ran; see :mod:`export`). It runs no
    code of the learner's itself: per graded call it rebuilds the learner's function from the
    notebook's own ``def`` and hands it to a process of its own (:func:`_call_apart`), then relays
    what that process reported to the grader. It ends when the grader closes the pipe."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the kernel cannot read or trace us
    except (AttributeError, OSError):  # not Linux: the jail (Linux only) is not there either
        pass
    from . import export, wire
    from .engine_guard import ALLOW, WHOLE_ENGINE, copies_in, disable_engine, prepare

    cmd_in, out = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")
    trusted: dict = {}
    for line in cmd_in:
        msg = json.loads(line)
        if msg.get("op") == "prepare":
            prepare()
            import torch  # imported and warmed up here, not inside a graded call's time

            x = torch.randn(2, 8)
            x.sort(dim=-1, descending=True)[0].softmax(dim=-1).cumsum(dim=-1).masked_fill(x > 0, 0.0)
            trusted = export.trusted_code([str(s) for s in msg.get("sources", [])])
            disable_engine()
            _reply(out, {"op": "prepared"})
            continue
        forbid = [str(s) for s in msg.get("forbid", [])]
        loaded = len(sys.modules)
        try:  # runs nothing of the learner's: modules imported, library objects looked up by name
            fn = export.rebuild(msg["fn"], trusted, [s[len(ALLOW):] for s in forbid if s.startswith(ALLOW)])
            args = [wire.decode(a) for a in msg["args"]]
            kwargs = {str(k): wire.decode(v) for k, v in msg.get("kwargs", {}).items()}
        except Exception as exc:  # noqa: BLE001 - a malformed export is the kernel's doing: its call fails
            _reply(out, {"op": "raised", "error": _short_error(exc), "exc_type": type(exc).__name__})
            continue
        if len(sys.modules) != loaded:  # the rebuild imported a module: its functions too
            disable_engine()
        copied = copies_in([fn, *fn.__globals__.values()]) if WHOLE_ENGINE in forbid else []
        try:
            replies = [{"op": "engine_used", "names": copied}] if copied else _call_apart(fn, args, kwargs, forbid,
                                                                                         (rfd, wfd))
        except OSError as exc:  # no process could be made for it (the notebook's processes fill the limit)
            replies = [{"op": "raised", "error": f"the call could not be started: {exc.strerror or exc}",
                        "exc_type": "OSError"}]
        for reply in replies:
            _reply(out, reply)


def _call_apart(fn, args, kwargs, forbid: list, grader_fds: tuple) -> list[dict]:
    """Call ``fn`` in a process forked for this call alone, and return what it reported: its notes
    (each written the moment the watch saw it), then one of returned / raised / engine_used.

    Whatever the call does, it does in that process: the grader's pipes are closed there (it cannot
    answer for later calls), the engine's functions raise there (:func:`engine_guard.disable_engine`),
    and files, programs, sockets and other processes are refused to it by a seccomp filter
    (:func:`jail.call_filter`), so it cannot load the engine again either. A process that ends
    without a last word reports that as the call's error."""
    from .jail import call_filter, install_filter

    prog = call_filter()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's side, seen through what it reports
        try:
            os.close(r)
            for fd in grader_fds:
                os.close(fd)
            _call_here(fn, args, kwargs, forbid, w, prog, install_filter)
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    try:
        while len(data) <= MAX_CALL_REPORT and not _has_last_word(data):
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        try:
            os.kill(pid, 9)  # done: whatever it left running (it may have closed its end) ends here
        except OSError:
            pass
        os.waitpid(pid, 0)
    return _reports(data)


_LAST_WORDS = (b'{"op": "returned"', b'{"op": "raised"', b'{"op": "engine_used"')


def _has_last_word(data: bytes) -> bool:
    """Has the call's process written a complete line that ends its report?"""
    return any(line.startswith(_LAST_WORDS) for line in data.split(b"\n")[:-1])


def _call_here(fn, args, kwargs, forbid: list, w: int, prog: bytes, install_filter) -> None:
    """The forked process's part: filter (no files, programs, signals; no code made from text),
    call under the clean room's watch, write the outcome."""
    from . import export, wire  # noqa: F401 - everything the watch imports, imported before files close
    from .engine_guard import clean_room_call, prepare, refuse_new_code

    prepare()  # the engine's fingerprints (done once in the clean room; here too when called directly)

    write, dumps = os.write, json.dumps  # kept here: what the call may change cannot reach them

    def emit(what: str) -> None:
        write(w, (dumps({"op": "note", "what": str(what)[:300]}) + "\n").encode("utf-8"))

    install_filter(prog)
    refuse_new_code(forbid)
    try:
        with clean_room_call(forbid, emit) as reached:
            value = fn(*args, **kwargs)
        value = wire.encode(value)  # exact types only: no code of the learner's runs here
        last = {"op": "engine_used", "names": reached} if reached else {"op": "returned", "value": value}
    except BaseException as exc:  # noqa: BLE001 - the learner's error is feedback
        last = {"op": "raised", "error": _short_error(exc), "exc_type": type(exc).__name__}
    write(w, (dumps(last) + "\n").encode("utf-8"))


def _reports(data: bytes) -> list[dict]:
    """The call process's report as replies for the grader: its notes, then its first last word.
    A report that is not well formed, or has no last word, is the call's error."""
    notes, last = [], None
    for line in data.split(b"\n")[:10_000]:
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(msg, dict):
            continue
        if msg.get("op") == "note":
            notes.append({"op": "note", "what": str(msg.get("what"))[:300]})
        elif msg.get("op") in ("returned", "raised", "engine_used"):
            last = msg
            break
    if last is None:
        last = {"op": "raised", "error": "the call ended its own process without returning", "exc_type": "SystemExit"}
    return notes + [last]


def _start_clean_room() -> int | None:
    """Fork the clean room (when the grader gave it pipes); returns its pid in the kernel."""
    fds = os.environ.pop("MINILLM_GRADER_CLEAN_FDS", None)
    if not fds:
        return None
    rfd, wfd = (int(x) for x in fds.split(","))
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (int(x) for x in os.environ.get("MINILLM_GRADER_FDS", "").split(",") if x):
                os.close(fd)
            _clean_room(rfd, wfd)
        finally:
            os._exit(0)
    os.close(rfd)
    os.close(wfd)
    return pid


def _load_engine() -> None:
    """Import the engine (and torch) now, as ``import minillm`` did before the package became lazy:
    the clean room forks with it loaded, and no cell's deadline pays for importing it."""
    import minillm

    for name in minillm.__all__:
        getattr(minillm, name)


def main(jailed: bool = False) -> None:
    _load_engine()
    clean_pid = _start_clean_room()  # before any cell: nothing of the notebook's is in it
    rfd, wfd = (int(x) for x in os.environ.pop("MINILLM_GRADER_FDS").split(","))
    cmd_in = os.fdopen(rfd, "rb")
    out = os.fdopen(wfd, "wb")
    from IPython.core.interactiveshell import InteractiveShell

    from . import wire
    from .engine_guard import WHOLE_ENGINE, guard_state, prepare, unavailable
    from .export import export

    state_of, state_code = guard_state, guard_state.__code__
    boot_state = state_of()  # before any cell

    shell = InteractiveShell.instance()
    ns = shell.user_ns
    try:  # did the grader manage to give this kernel a read-only view of the file system?
        read_only = bool(os.statvfs("/").f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    _reply(out, {"op": "ready", "read_only": read_only})
    for line in cmd_in:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "run":
            result = shell.run_cell(msg["source"], store_history=False, silent=True)
            err = result.error_in_exec or result.error_before_exec
            _reply(out, {"op": "ran", "error": _short_error(err) if err else None})
        elif op == "get":
            name = msg["name"]
            if name not in ns:
                _reply(out, {"op": "value", "missing": True})
                continue
            value = ns[name]
            try:
                if hasattr(value, "to_data") and type(value).__name__ == "DiagramEditor":
                    value = value.to_data()
                data = wire.encode(value)
            except Exception as exc:
                data = {"t": "other", "type": f"unencodable {type(value).__name__} ({_short_error(exc)})"}
            _reply(out, {"op": "value", "value": data, "callable": callable(ns[name])})
        elif op == "prepare":
            prepare()
            _reply(out, {"op": "prepared"})
        elif op == "export":
            try:
                _reply(out, {"op": "exported", "fn": export(ns.get(msg["name"]), ns)})
            except Exception as exc:  # Unexportable, or a value the wire refused: the grader says so
                _reply(out, {"op": "exported", "error": _short_error(exc)})
        elif op == "call":
            fn = ns.get(msg["name"])
            try:
                args = [wire.decode(a) for a in msg["args"]]
                kwargs = {str(k): wire.decode(v) for k, v in msg.get("kwargs", {}).items()}
                forbid = [str(s) for s in msg.get("forbid", [])]
                if jailed and WHOLE_ENGINE in forbid:
                    _end_helpers(clean_pid)
                if forbid and (state_of.__code__ is not state_code or state_of() != boot_state):
                    _reply(out, {"op": "engine_used", "names": ["(a cell changed the grader's guard)"]})
                    continue
                with unavailable(forbid) as reached:
                    value = fn(*args, **kwargs)
                if reached:
                    _reply(out, {"op": "engine_used", "names": reached})
                    continue
                _reply(out, {"op": "returned", "value": wire.encode(value)})
            except BaseException as exc:  # SystemExit and KeyboardInterrupt are feedback too
                _reply(out, {"op": "raised", "error": _short_error(exc), "exc_type": type(exc).__name__})
        else:
            _reply(out, {"op": "error", "error": "unknown op"})


def run(jailed: bool = False) -> None:
    """:func:`main`, ending quietly on any error: the grader sees a closed pipe and reports that the kernel died.
    ``jailed``: the kernel is alone in its own PID namespace (:mod:`jail`), where it may end the rest."""
    try:
        main(jailed)
    except BaseException:
        sys.exit(1)


if __name__ == "__main__":
    run()
