"""The first code a sandboxed kernel runs (``python -c`` with this file's text and a JSON config).

It must not import ``minillm`` before the jail is complete: under bubblewrap the jail already is;
under ``unshare`` (own user, mount, PID and network namespaces, root in there) this builds it —
a new root on a tmpfs holding only the interpreter, the package (model answers replaced), the
scratch folder and a few devices — moves it onto ``/``, enters it, and drops every capability so
the kernel cannot unmount or remount anything. Then it starts :mod:`minillm.grading._worker`.
"""

import ctypes
import json
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = (
    1, 2, 4, 32, 4096, 8192, 16384, 1 << 18)
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
       "/etc/ssl", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/fonts")
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/full")
libc = ctypes.CDLL(None, use_errno=True)


def _enc(s):
    return s.encode() if isinstance(s, str) else s


def _mount(src, dst, fstype=None, flags=0, data=None):
    if libc.mount(_enc(src), _enc(dst), _enc(fstype), flags, _enc(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount {src} on {dst}: {os.strerror(ctypes.get_errno())}")


def _bind(root, path, target=None, writable=False, recursive=True):
    """Bind ``path`` at ``root + (target or path)``, read-only unless ``writable``."""
    dst = root + (target or path)
    if os.path.isdir(path):
        os.makedirs(dst, exist_ok=True)
    elif not os.path.exists(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(path, dst, None, MS_BIND | (MS_REC if recursive else 0))
    if not writable:
        _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def _drop_capabilities():
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "no_new_privs")


def _refuse_keyrings(hex_prog):
    """Install the grader's seccomp program (keyring calls fail with EPERM; see ``jail.keyring_filter``)."""
    prog = bytes.fromhex(hex_prog)
    if not prog:
        return
    buf = ctypes.create_string_buffer(prog, len(prog))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp")


def _scratch_in(root, cfg):
    """The jail's /scratch: a tmpfs of bounded size and file count holding a copy of the files the
    grader put in the scratch folder (so filling it fills no disk that others need)."""
    sizes = cfg["sizes"]
    os.makedirs(root + "/scratch", exist_ok=True)
    _mount("tmpfs", root + "/scratch", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={sizes['scratch']},nr_inodes={sizes['files']},mode=0700")
    os.makedirs(root + "/scratch/home", exist_ok=True)
    for name in os.listdir(cfg["scratch"]):
        path = os.path.join(cfg["scratch"], name)
        if name not in (".jail-root", "home") and os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as src, open(os.path.join(root + "/scratch", name), "wb") as dst:
                dst.write(src.read())


def build_unshare_jail(cfg):
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = os.path.join(cfg["scratch"], ".jail-root")
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for path in SYSTEM:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            _bind(root, path)
    for path in ETC + DEVICES:
        if os.path.exists(path):
            _bind(root, path, writable=path.startswith("/dev/"))
    for path in cfg["keep"]:
        if path != cfg["scratch"]:
            _bind(root, path)
    for target in cfg["blinded"]:  # model answers (in every copy of the package): blind
        _bind(root, cfg["blind"], target)
    for folder in cfg["hidden"]:  # their compiled copies: an empty, read-only folder instead
        _mount("tmpfs", root + folder, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k")
    _scratch_in(root, cfg)
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("/proc", root + "/proc", None, MS_BIND | MS_REC)
    for name in ("keys", "key-users"):  # the keyrings are not namespaced: the grader user's would show
        if os.path.exists(root + "/proc/" + name):
            _mount("/dev/null", root + "/proc/" + name, None, MS_BIND)
    os.makedirs(root + "/tmp", exist_ok=True)
    sizes = cfg["sizes"]
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={sizes['tmp']},nr_inodes={sizes['files']}")
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    os.chdir(root)
    _mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/scratch")
    _drop_capabilities()
    _refuse_keyrings(cfg.get("seccomp", ""))
    try:
        os.setsid()  # as bubblewrap's --new-session: a signal to "my process group" stays in the jail
    except OSError:
        pass


def main():
    cfg = json.loads(sys.argv[1])
    if cfg["mode"] == "unshare":
        build_unshare_jail(cfg)
    if cfg.get("scratch"):
        os.chdir("/scratch" if cfg["mode"] != "none" else cfg["scratch"])
    sys.path.insert(0, cfg["lib"])
    sys.argv = [sys.argv[0]]
    probe = os.environ.pop("MINILLM_JAIL_PROBE", None)
    if probe is not None:
        exec(compile(probe, "<jail probe>", "exec"), {"__name__": "__probe__"})
        return
    from minillm.grading import _worker

    _worker.run(jailed=cfg["mode"] in ("bwrap", "unshare"))


main()
