"""The KV pool in 2 MB pages (Linux transparent huge pages), for the attention kernel's sake.

A decode batch's attention reads every request's blocks wherever the allocator put them in a
pool of hundreds of MB. With 4 KB pages nearly every block is a TLB miss and a page walk
before its first byte arrives, and the kernel's prefetches of the next row's blocks
(``kernels/paged_decode.c``) wait for those walks too. With 2 MB pages one TLB entry covers
256 blocks of the shipped model. Measured on an AMD EPYC Zen 4 core, one thread: the kernel's
decode call over 64 rows read the pool at 15.1 GB/s against 12.0 on 4 KB pages; the mixed
64-request workload of ``minillm bench`` ran 1.06-1.07x faster (medians of 6 alternating runs;
``benchmarks/README.md``, *The next row fetched ahead*).

How: ``zeros`` takes fresh memory (``torch.empty``; a pool this size is its own mapping),
asks for huge pages with ``madvise(MADV_HUGEPAGE)`` on its 2 MB-aligned part, then zeroes it,
so the first touch of each 2 MB faults in one huge page. Nothing is copied and nothing else in
the process changes. Where the system says no (another OS, transparent huge pages set to
"never", a pool on the GPU, a small pool) the pool is the same zeroed tensor on 4 KB pages.
"""

from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE = 2 << 20
#: pools smaller than this stay as they are (a few huge pages would not be worth a system call)
MIN_BYTES = 8 << 20
MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux

_madvise = None


def zeros(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``, in huge pages where the system allows."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if t.device.type == "cpu" and t.numel() * t.element_size() >= MIN_BYTES:
        advise(t)
    return t.zero_()


def advise(t: torch.Tensor) -> bool:
    """Ask for huge pages under ``t``'s 2 MB-aligned span; whether the system took the advice."""
    libc_madvise = _libc_madvise()
    start = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    end = (t.data_ptr() + t.numel() * t.element_size()) // HUGE_PAGE * HUGE_PAGE
    if libc_madvise is None or end <= start:
        return False
    return libc_madvise(start, end - start, MADV_HUGEPAGE) == 0


def _libc_madvise():
    """libc's ``madvise`` on Linux, else None."""
    global _madvise
    if _madvise is None and sys.platform.startswith("linux"):
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):
            return None
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
        _madvise = fn
    return _madvise


def pages_of(t: torch.Tensor) -> tuple[int, bool]:
    """(bytes of ``t``'s mappings now in huge pages, whether they carry the huge-page advice), from
    /proc/self/smaps; (0, False) where that cannot be read. For benchmarks and tests: the kernel
    may hand out fewer huge pages than asked when memory is fragmented."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    huge, advised, inside = 0, False, False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split(None, 1)[0]
                if not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                    a, b = (int(x, 16) for x in head.split("-"))
                    inside = a < hi and b > lo
                elif inside and head == "AnonHugePages:":
                    huge += int(line.split()[1]) * 1024
                elif inside and head == "VmFlags:":
                    advised = advised or "hg" in line.split()[1:]
    except (OSError, ValueError):
        return 0, False
    return huge, advised
