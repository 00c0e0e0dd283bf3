"""Admitting a request whose 2k-token prefix sits in the prefix cache (all its blocks free
but cached), in a small and a large pool: the cost must not depend on the pool size.

Admission is what the scheduler does for a new request: ``can_allocate`` then ``allocate``,
with the request's own hash list (a fresh request: every block hashed once), followed by
the commit of the prompt's full blocks; then the request is freed so its prefix is cached
again. With ``--before REV`` the same loop also runs on the allocator of an older commit
(its methods take no hash list), for comparison.

    python benchmarks/prefix_admission.py               # this allocator
    python benchmarks/prefix_admission.py --before 2b1e512
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def load_allocator(rev: str | None):
    """``BlockAllocator`` of the working tree, or of git revision ``rev``."""
    if rev is None:
        from minillm.kv_cache import BlockAllocator
        return BlockAllocator
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:minillm/kv_cache.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"kv_cache_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module.BlockAllocator


def admission_ms(allocator_cls, num_blocks: int, prefix_tokens: int, block_size: int, repeats: int,
                 takes_hashes: bool) -> float:
    alloc = allocator_cls(num_blocks, block_size)
    prefix = [(7 * i) % 5000 for i in range(prefix_tokens)]
    prompt = prefix + [1, 2, 3]
    # serve it once so the prefix is cached, then free it: its blocks sit at the end of a
    # free list that holds the rest of the pool
    table, _ = alloc.allocate(prompt)
    alloc.commit_full_blocks(table, prompt, len(prompt))
    alloc.free(table)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if takes_hashes:
            hashes: list[bytes] = []  # a new request's list
            assert alloc.can_allocate(prompt, hashes)
            table, cached = alloc.allocate(prompt, hashes)
            alloc.commit_full_blocks(table, prompt, len(prompt), hashes)
        else:
            assert alloc.can_allocate(prompt)
            alloc.match_prefix(prompt)  # the old scheduler asked for the hit count separately
            table, cached = alloc.allocate(prompt)
            alloc.commit_full_blocks(table, prompt, len(prompt))
        times.append(time.perf_counter() - start)
        assert cached == prefix_tokens
        alloc.free(table)
    return statistics.median(times) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", metavar="REV", help="also time the allocator of this git revision")
    ap.add_argument("--prefix-tokens", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    variants = [("now", None, True)]
    if args.before:
        variants.insert(0, (args.before, args.before, False))
    print(f"admitting a cached {args.prefix_tokens}-token prefix, block_size {args.block_size}, "
          f"median of {args.repeats} (ms)")
    print(f"{'allocator':>10} {'1k blocks':>10} {'100k blocks':>12} {'ratio':>6}")
    for name, rev, takes_hashes in variants:
        cls = load_allocator(rev)
        small = admission_ms(cls, 1_000, args.prefix_tokens, args.block_size, args.repeats, takes_hashes)
        large = admission_ms(cls, 100_000, args.prefix_tokens, args.block_size, args.repeats, takes_hashes)
        print(f"{name:>10} {small:10.2f} {large:12.2f} {large / small:6.2f}")


if __name__ == "__main__":
    main()
