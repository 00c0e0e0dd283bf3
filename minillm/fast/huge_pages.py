"""The weights and the KV pool in 2 MB pages (Linux transparent huge pages).

Decode reads every weight once per step and every request's KV blocks wherever the allocator
put them. On 4 KB pages a weight stream crosses a page (a TLB miss, and a point where the
hardware prefetcher stops) every 4 KB, and nearly every KV block is a TLB miss and a page walk
before its first byte arrives; the attention kernel's prefetches of the next row's blocks
(``kernels/paged_decode.c``) wait for those walks too. Measured on an AMD EPYC Zen 4 core, one
thread (``benchmarks/README.md``, *The next row fetched ahead* and *The weights in 2 MB pages*):
the attention kernel's decode call over 64 rows read the pool at 15.1 GB/s against 12.0 on
4 KB pages, and SmolLM2-135M's batch-1 eager TPOT fell from 26-30 to 21-26 ms with its weights
here.

How: a mapping of its own (``mmap``, private and anonymous, so advice given to it never
reaches memory the allocator hands out later), advised ``MADV_HUGEPAGE`` before anything
touches it, so each 2 MB faults in as one huge page: ``zeros`` (the pool) zeroes one,
``rehome`` (the weights) copies the model's parameters and buffers into one, each keeping its
shape, strides and object. Nothing else in the process changes. Where the system says no (another OS,
transparent huge pages set to "never", the GPU, a small model) tensors stay on 4 KB pages; the
reference path (``LLM(fast=False)``) never asks.
"""

from __future__ import annotations

import math
import mmap
import sys

import torch

HUGE_PAGE = 2 << 20
#: tensors (or a model's weights together) smaller than this stay as they are
MIN_BYTES = 8 << 20


def arena(nbytes: int) -> torch.Tensor | None:
    """``nbytes`` of fresh memory as a uint8 tensor starting on a 2 MB boundary, in a private
    anonymous mapping advised ``MADV_HUGEPAGE`` (unmapped when the last tensor on it goes); None
    where the system has no such advice or the mapping cannot be had."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # (keeps the mapping alive)
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + nbytes]


def zeros(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``, in huge pages where the system allows."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    home = arena(nbytes) if torch.device(device).type == "cpu" and nbytes >= MIN_BYTES else None
    if home is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return home.view(dtype).view(shape).zero_()  # touched now, as torch.zeros would


def rehome(module: torch.nn.Module) -> int:
    """Move ``module``'s CPU parameters and buffers into one huge-page arena (each tensor keeps its
    shape, strides, dtype and Parameter object; a tied weight stays one tensor). Decode streams
    every weight once per step: on 4 KB pages each stream crosses a page every 4 KB, and with 2 MB
    pages one Zen 4 core streamed SmolLM2-135M's weights 1.2-1.3x faster. Returns the bytes moved
    (0: nothing moved: too small, not on the CPU, or no huge-page advice here)."""
    tensors = _dense_cpu_tensors(module)
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // 64) * 64  # each tensor 64-byte aligned
    home = arena(total) if total >= MIN_BYTES else None
    if home is None:
        return 0
    for t, off in zip(tensors, offsets):
        nbytes = t.numel() * t.element_size()
        moved = home[off:off + nbytes].view(t.dtype).as_strided(t.shape, t.stride())
        moved.copy_(t)
        t.data = moved  # the same Parameter / buffer object, now in the arena
    return total


def advised(t: torch.Tensor) -> bool:
    """Whether a mapping under ``t`` carries the huge-page advice (/proc/self/smaps' VmFlags "hg";
    False where that cannot be read). For tests: the kernel may still hand out 4 KB pages when
    memory is fragmented, so this checks the asking, not the getting."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    inside = False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split(None, 1)[0]
                if not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                    a, b = (int(x, 16) for x in head.split("-"))
                    inside = a < hi and b > lo
                elif inside and head == "VmFlags:" and "hg" in line.split()[1:]:
                    return True
    except (OSError, ValueError):
        return False
    return False


def _dense_cpu_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Each CPU parameter and buffer of ``module`` once (by identity) that alone fills its storage
    (any order of strides): a view of a larger storage, or a storage two tensors share, stays where
    it is, so no sharing is broken by a copy."""
    found = {}
    for t in list(module.parameters()) + list(module.buffers()):
        if t.device.type == "cpu" and t.numel() > 0:
            found[id(t)] = t
    users: dict[int, int] = {}
    for t in found.values():
        key = t.untyped_storage().data_ptr()
        users[key] = users.get(key, 0) + 1
    out = []
    for t in found.values():
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        alone = users[t.untyped_storage().data_ptr()] == 1
        fills = t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
        if alone and fills and span == t.numel() and all(s > 0 for s in t.stride()):
            out.append(t)
    return out
