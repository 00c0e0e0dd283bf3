"""The kernel library cache (``minillm.fast.kernel_cache``) as an attacker would try it: a library
planted in a shared folder, a folder others can write, a library changed after its build or
swapped between the check and the load, a symlink in place of the folder or the library. Each
is refused (with a warning naming why) and the real library is built and loaded instead.

Uses a one-line C library (a fraction of a second to compile), not the real kernel."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import pytest

from minillm.fast import kernel_cache

CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")
OTHER_UID = 65534  # "nobody"


def _compile(tmp_path, value: int):
    src = tmp_path / f"answer{value}.c"
    src.write_text(f"int answer(void) {{ return {value}; }}\n")

    def build(out):
        subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return build


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A private cache folder and a private temporary folder, both under ``tmp_path``."""
    monkeypatch.setenv("MINILLM_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "cache"


def _answer(name: str) -> int:
    return ctypes.CDLL(name).answer()


def test_a_build_is_recorded_and_loaded_from_its_own_descriptor(cache, tmp_path):
    name = kernel_cache.cached_library("answer-aaaa", _compile(tmp_path, 41))
    assert name.startswith(("/proc/self/fd/", "/dev/fd/"))
    assert _answer(name) == 41
    assert (cache.stat().st_mode & 0o777) == 0o700
    sha = (cache / "answer-aaaa.sha256").read_text().strip()
    lib = cache / f"answer-aaaa-{sha[:16]}.so"
    assert lib.is_file() and (lib.stat().st_mode & 0o077) == 0
    again = kernel_cache.cached_library("answer-aaaa", _compile(tmp_path, 99))  # cached: not rebuilt
    assert _answer(again) == 41


def test_a_modified_library_is_refused_and_rebuilt(cache, tmp_path):
    kernel_cache.cached_library("answer-bbbb", _compile(tmp_path, 7))
    sha = (cache / "answer-bbbb.sha256").read_text().strip()
    lib = cache / f"answer-bbbb-{sha[:16]}.so"
    with open(lib, "ab") as f:
        f.write(b"\0planted")
    with pytest.warns(kernel_cache.UntrustedLibrary, match="SHA-256.*modified after the build"):
        name = kernel_cache.cached_library("answer-bbbb", _compile(tmp_path, 8))
    assert _answer(name) == 8


def test_a_library_owned_by_another_user_is_refused(cache, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    kernel_cache.cached_library("answer-cccc", _compile(tmp_path, 1))
    sha = (cache / "answer-cccc.sha256").read_text().strip()
    os.chown(cache / f"answer-cccc-{sha[:16]}.so", OTHER_UID, OTHER_UID)
    with pytest.warns(kernel_cache.UntrustedLibrary, match=f"belongs to user id {OTHER_UID}"):
        name = kernel_cache.cached_library("answer-cccc", _compile(tmp_path, 2))
    assert _answer(name) == 2


@pytest.mark.parametrize("attack", ["group-writable", "other-owner", "symlink"])
def test_an_unsafe_folder_is_never_used(cache, tmp_path, attack):
    """The issue's attack: a shared folder with a library of the expected name in it. The folder
    is refused whole (with a warning), and the build goes to the per-user fallback instead."""
    if attack == "other-owner" and os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    planted = tmp_path / "shared"
    planted.mkdir()
    build = _compile(tmp_path, 666)
    build(planted / "evil.so")
    sha = kernel_cache.sha256_fd(os.open(planted / "evil.so", os.O_RDONLY))
    (planted / "answer-dddd.sha256").write_text(sha + "\n")
    os.replace(planted / "evil.so", planted / f"answer-dddd-{sha[:16]}.so")
    if attack == "group-writable":  # the user's own choice of folder (MINILLM_KERNEL_CACHE): refused as is
        os.chmod(planted, 0o777)
        os.replace(planted, cache)
        match = "can be written by other users"
    elif attack == "other-owner":
        os.chown(planted, OTHER_UID, OTHER_UID)
        os.replace(planted, cache)
        match = f"belongs to user id {OTHER_UID}"
    else:
        os.symlink(planted, cache)
        match = "symlink"
    with pytest.warns(kernel_cache.UntrustedLibrary, match=match):
        name = kernel_cache.cached_library("answer-dddd", _compile(tmp_path, 5))
    assert _answer(name) == 5
    fallback = tmp_path / "tmp" / f"minillm-kernels-{os.geteuid()}"
    assert (fallback / "answer-dddd.sha256").is_file() and (fallback.stat().st_mode & 0o777) == 0o700


def test_a_symlinked_library_is_refused(cache, tmp_path):
    kernel_cache.cached_library("answer-eeee", _compile(tmp_path, 3))
    sha = (cache / "answer-eeee.sha256").read_text().strip()
    lib = cache / f"answer-eeee-{sha[:16]}.so"
    os.replace(lib, tmp_path / "elsewhere.so")
    os.symlink(tmp_path / "elsewhere.so", lib)
    with pytest.warns(kernel_cache.UntrustedLibrary, match="cannot be opened safely"):
        name = kernel_cache.cached_library("answer-eeee", _compile(tmp_path, 4))
    assert _answer(name) == 4


def test_what_is_loaded_is_what_was_checked(cache, tmp_path):
    """A library swapped under its name after the check still cannot be what gets loaded."""
    kernel_cache.cached_library("answer-ffff", _compile(tmp_path, 10))
    dfd = os.open(cache, os.O_RDONLY)
    try:
        fd = kernel_cache.open_verified(dfd, "answer-ffff")
    finally:
        os.close(dfd)
    sha = (cache / "answer-ffff.sha256").read_text().strip()
    _compile(tmp_path, 666)(tmp_path / "swap.so")
    os.replace(tmp_path / "swap.so", cache / f"answer-ffff-{sha[:16]}.so")
    assert _answer(kernel_cache.loadable_path(fd)) == 10


def test_no_usable_folder_is_a_clear_error(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("MINILLM_KERNEL_CACHE", str(blocked / "kernels"))
    monkeypatch.setattr(kernel_cache.tempfile, "gettempdir", lambda: str(blocked))
    with pytest.raises(RuntimeError, match="no private folder for the kernel cache"):
        kernel_cache.cached_library("answer-gggg", _compile(tmp_path, 1))


def test_when_every_shared_folder_is_unsafe_a_fresh_private_one_is_used(cache, tmp_path):
    """Someone squatting both the configured folder and ``$TMPDIR/minillm-kernels-<uid>`` only
    costs a rebuild in a fresh per-process folder: the kernel still loads, never from theirs."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    squat = tmp_path / "tmp" / f"minillm-kernels-{os.geteuid()}"
    for folder in (cache, squat):
        folder.mkdir(mode=0o777)
        os.chmod(folder, 0o777)
    os.chown(squat, OTHER_UID, OTHER_UID)
    with pytest.warns(kernel_cache.UntrustedLibrary, match=f"belongs to user id {OTHER_UID}"):
        name = kernel_cache.cached_library("answer-hhhh", _compile(tmp_path, 12))
    assert _answer(name) == 12
    fresh = [p for p in (tmp_path / "tmp").iterdir() if p != squat]
    assert len(fresh) == 1 and (fresh[0].stat().st_mode & 0o777) == 0o700
    assert not list(squat.iterdir()) and not list(cache.iterdir())


def test_minillms_own_folder_left_group_writable_is_tightened_and_its_files_still_checked(monkeypatch, tmp_path):
    """``~/.cache/minillm/kernels`` made 0775 under umask 002 is the user's own: set to 0700 and
    used; a library someone else put there while it was open is still refused (owner)."""
    monkeypatch.delenv("MINILLM_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = tmp_path / "xdg" / "minillm" / "kernels"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o775)
    kernel_cache.cached_library("answer-iiii", _compile(tmp_path, 20))
    assert (folder.stat().st_mode & 0o777) == 0o700 and (folder / "answer-iiii.sha256").is_file()
    if os.geteuid() != 0:
        return
    os.chmod(folder, 0o777)
    for f in folder.iterdir():
        os.chown(f, OTHER_UID, OTHER_UID)  # as if replaced by another user while the folder was open
    with pytest.warns(kernel_cache.UntrustedLibrary, match=f"belongs to user id {OTHER_UID}"):
        name = kernel_cache.cached_library("answer-iiii", _compile(tmp_path, 21))
    assert _answer(name) == 21 and (folder.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("attack", ["made-by-another-user", "world-writable", "symlink", "configured-and-shared"])
def test_torchs_inductor_cache_folder_is_ours_before_anything_is_compiled(cache, tmp_path, monkeypatch, attack):
    """torch keeps compiled code and pickled graphs in ``$TMPDIR/torchinductor_<user>`` and loads
    a file already there under the name it expects: a folder someone else made first (or can
    write) would run their code. Both compile paths point torch at a folder of ours first."""
    import torch
    from torch._inductor.runtime import cache_dir_utils

    from minillm.fast.compiled import CompiledModel

    if attack == "made-by-another-user" and os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    shared = tmp_path / "torchinductor_me"
    shared.mkdir()
    if attack == "made-by-another-user":
        os.chown(shared, OTHER_UID, OTHER_UID)
    elif attack in ("world-writable", "configured-and-shared"):
        os.chmod(shared, 0o777)
    else:
        os.rename(shared, tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", shared)
    if attack == "configured-and-shared":
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    else:
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        monkeypatch.setattr(cache_dir_utils, "default_cache_dir", lambda: str(shared))
    model = torch.nn.Linear(1, 1)
    with pytest.warns(kernel_cache.UntrustedLibrary, match="inductor cache"):
        CompiledModel(model)  # torch.compile is lazy: nothing is built here
    used = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert used == str(cache / "inductor") and cache_dir_utils.cache_dir() == used, used
    assert (os.stat(used).st_mode & 0o777) == 0o700 and model.compiled


def test_an_inductor_cache_folder_of_our_own_is_kept(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert kernel_cache.private_inductor_cache() == str(tmp_path / "mine")
    assert (os.stat(tmp_path / "mine").st_mode & 0o777) == 0o700


def _planted_folder(tmp_path, tools) -> tuple:
    """``course/``, the folder the process starts in (a learner's, say), holding programs named
    ``tools`` that leave the returned marker file when run."""
    planted = tmp_path / "course"
    planted.mkdir()
    marker = tmp_path / "planted-tool-ran"
    for tool in tools:
        (planted / tool).write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
        (planted / tool).chmod(0o755)
    return planted, marker


def _built_answer(tmp_path, source: str) -> int:
    """``answer()`` of ``source`` built the way the kernels are (``cpu_kernel.build_library``)."""
    from minillm.fast import cpu_kernel

    src = tmp_path / "answer.c"
    src.write_text(source)
    return _answer(cpu_kernel.build_library("answer", src, ["-shared", "-fPIC"]))


def test_gccs_own_search_lists_never_reach_the_current_folder(cache, tmp_path, monkeypatch):
    """gcc reads its own lists too: an empty or relative entry of ``COMPILER_PATH`` (tools),
    ``CPATH`` / ``C_INCLUDE_PATH`` (headers) or ``LIBRARY_PATH`` is the folder the process started
    in, so a header planted there was compiled into the kernel and a tool planted there ran. Only
    absolute entries reach the compiler, and its temporary files go to a private folder."""
    from minillm.fast import cpu_kernel

    planted, marker = _planted_folder(tmp_path, ("as", "ld", "collect2", "cc1"))
    (planted / "stdint.h").write_text("#error planted header compiled in\n")
    monkeypatch.chdir(planted)
    for name in ("COMPILER_PATH", "CPATH", "C_INCLUDE_PATH", "LIBRARY_PATH"):
        monkeypatch.setenv(name, os.pathsep.join(["", ".", "/nonexistent-minillm"]))
    monkeypatch.setenv("GCC_EXEC_PREFIX", "course/")
    shared_tmp = tmp_path / "shared-tmp"
    shared_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    env = cpu_kernel.compiler_env(str(tmp_path / "private"))
    assert env["CPATH"] == "/nonexistent-minillm" and "GCC_EXEC_PREFIX" not in env
    assert env["TMPDIR"] == str(tmp_path / "private")
    assert _built_answer(tmp_path, "#include <stdint.h>\nint answer(void) { return (int)sizeof(int32_t) + 5; }\n") == 9
    assert not marker.exists()


def test_a_build_never_runs_tools_planted_in_the_current_folder(cache, tmp_path, monkeypatch):
    """``PATH=":/usr/bin"`` (an empty entry is the current folder): the compiler ran an ``as``
    planted where the process started. The build looks the tools up on absolute entries only."""
    from minillm.fast import cpu_kernel

    planted, marker = _planted_folder(tmp_path, ("cc", "gcc", "as", "ld"))
    real = os.path.dirname(os.path.realpath(CC))
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PATH", os.pathsep.join(["", ".", "bin", real, "/usr/bin", "/bin"]))
    monkeypatch.delenv("CC", raising=False)
    cc = cpu_kernel.find_compiler("CC", ("cc", "gcc"), "C")
    assert os.path.isabs(cc) and not cc.startswith(str(planted)), cc
    assert _built_answer(tmp_path, "int answer(void) { return 9; }\n") == 9
    assert not marker.exists()


def test_a_changed_header_rebuilds_every_library_that_includes_it(cache, tmp_path):
    """The cache key hashes the headers a kernel includes by quoted name (and theirs), not only
    the ``.c`` file: with the key on the ``.c`` alone, a changed ``vec.h`` would have left both
    small_ops and paged_decode loading their old builds."""
    from minillm.fast import cpu_kernel

    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "shared.h").write_text('#include "value.h"\n#define PLUS(x) ((x) + VALUE)\n')
    (kernels / "value.h").write_text("#define VALUE 1\n")
    for name in ("one", "two"):
        (kernels / f"{name}.c").write_text('#include "shared.h"\nint answer(void) { return PLUS(%d); }\n'
                                           % len(name * 10))
    flags = ["-shared", "-fPIC"]
    before = {n: cpu_kernel.build_library(n, kernels / f"{n}.c", flags) for n in ("one", "two")}
    assert {n: _answer(p) for n, p in before.items()} == {"one": 31, "two": 31}
    assert cpu_kernel.key_sources([kernels / "one.c"]) == [kernels / n for n in ("one.c", "shared.h", "value.h")]
    (kernels / "value.h").write_text("#define VALUE 2\n")  # two includes deep
    after = {n: cpu_kernel.build_library(n, kernels / f"{n}.c", flags) for n in ("one", "two")}
    assert {n: _answer(p) for n, p in after.items()} == {"one": 32, "two": 32}
    assert len(list(cache.glob("one-*.sha256"))) == len(list(cache.glob("two-*.sha256"))) == 2  # new keys


def test_the_shipped_kernels_keys_cover_their_headers_and_the_package_ships_them():
    """small_ops.c and paged_decode.c share ``vec.h``, gemv.c includes ``gemv_body.h``: each is
    in its library's key, and every file of ``kernels/`` is in the package data (a wheel without
    a header could not build its kernel)."""
    import fnmatch
    import tomllib
    from pathlib import Path

    from minillm.fast import cpu_kernel, gemv, small_ops

    kernels = Path(cpu_kernel.__file__).with_name("kernels")
    assert kernels / "vec.h" in cpu_kernel.key_sources([small_ops.SOURCE])
    assert kernels / "vec.h" in cpu_kernel.key_sources([cpu_kernel.SOURCE, cpu_kernel.OP_SOURCE])
    assert kernels / "gemv_body.h" in cpu_kernel.key_sources([gemv.SOURCE])
    root = Path(cpu_kernel.__file__).parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["minillm"]
    for path in kernels.iterdir():
        rel = str(path.relative_to(root / "minillm"))
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not in the package data"
