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


def _clean_room(rfd: int, wfd: int) -> None:
    """The clean room's loop (a child forked before any cell ran; see :mod:`export`): rebuild the
    learner's function from the notebook's own ``def``, call it under the strict guard, answer the
    grader on this room's own pipe. It ends when the grader closes the pipe."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the kernel cannot read or trace us
    except (AttributeError, OSError):  # not Linux: the jail (Linux only) is not there either
        pass
    from . import export, wire
    from .engine_guard import clean_room_call, prepare

    write, dumps = os.write, json.dumps  # kept here: what the call may change cannot reach them

    def emit(what: str) -> None:
        write(wfd, (dumps({"op": "note", "what": str(what)[:300]}) + "\n").encode("utf-8"))

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
            _reply(out, {"op": "prepared"})
            continue
        try:
            args = [wire.decode(a) for a in msg["args"]]
            kwargs = {str(k): wire.decode(v) for k, v in msg.get("kwargs", {}).items()}
            fn = export.rebuild(msg["fn"], trusted)  # runs nothing of the learner's: before the guard
            with clean_room_call([str(s) for s in msg.get("forbid", [])], emit) as reached:
                value = fn(*args, **kwargs)
            value = wire.encode(value)  # exact types only: no code of the learner's runs here
            if reached:
                _reply(out, {"op": "engine_used", "names": reached})
            else:
                _reply(out, {"op": "returned", "value": value})
        except BaseException as exc:  # noqa: BLE001 - the learner's error is feedback
            _reply(out, {"op": "raised", "error": _short_error(exc), "exc_type": type(exc).__name__})


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
