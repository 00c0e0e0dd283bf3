"""Host time of one sampler call at a real vocabulary: 64 rows x 151,936 (Qwen's), sampled
with ``logprobs=5``, unseeded and seeded, and how many ``exponential_`` launches it makes.

    python benchmarks/sampler_host.py [--device cpu] [--rows 64] [--vocab 151936] [--reps 5]

Wall time per call, the device synchronised after it (on the CPU the "device" work is host
work too, so this is the whole cost there). What changed the numbers is in the README here."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minillm.params import SamplingParams  # noqa: E402
from minillm.request import Request  # noqa: E402
from minillm.fast.sampler import BatchedSampler as Sampler  # noqa: E402
from minillm.sampler import make_generator  # noqa: E402


class _Count(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.exponential = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "exponential_":
            self.exponential += 1
        return func(*args, **(kwargs or {}))


def _requests(rows: int, device: str, seeded: bool, logprobs: int | None):
    reqs = []
    for i in range(rows):
        params = SamplingParams(temperature=0.8, logprobs=logprobs, seed=i if seeded else None)
        r = Request(str(i), "x", params, prompt_token_ids=[1])
        r._generator = make_generator(1000 + i, device)
        reqs.append(r)
    return reqs


def measure(device: str = "cpu", rows: int = 64, vocab: int = 151936, reps: int = 5) -> dict:
    """Median ms per sampler call per case, and the ``exponential_`` launches of one call."""
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, vocab, device=device, generator=g) * 3
    out = {"device": device, "rows": rows, "vocab": vocab}
    for name, seeded, logprobs, shared in (("unseeded", False, None, None), ("unseeded_shared_noise", False, None, True),
                                           ("unseeded_logprobs5", False, 5, None), ("seeded_logprobs5", True, 5, None)):
        sampler = Sampler()
        sampler.shared_noise = shared  # None: the device's default (one launch for all on CUDA)
        reqs = _requests(rows, device, seeded, logprobs)
        with _Count() as count:
            sampler(logits, reqs)
        times = []
        for _ in range(reps):
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            sampler(logits, reqs)
            if device != "cpu":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out[name] = {"ms": round(statistics.median(times) * 1e3, 2), "exponential_launches": count.exponential}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(json.dumps(measure(args.device, args.rows, args.vocab, args.reps), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
