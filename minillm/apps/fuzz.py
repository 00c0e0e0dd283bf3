"""Random programs against the engine, checked after every action.

A program is a random sequence of: add a request (prompts that share prefixes, greedy or
seeded sampling, auto-release or not), step, cancel, release, a step whose forward pass
raises at a random layer (an injected exception or a KeyboardInterrupt), and a cancel issued
from a second thread while the main thread steps. After every action the block accounting
must be exact (``check_invariants``); at the end of a program every request must be RELEASED
with a stop reason, no block held, and **every output equal to the same request run alone**
(token for token; a cancelled one a prefix of it).

    python -m minillm.apps.fuzz --programs 2000 --seed 1            # the shipped model, minutes
    python -m minillm.apps.fuzz --programs 50 --model path/to/folder

``tests/test_property.py`` drives the same ``EngineFuzzer`` from hypothesis.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time

from ..params import SamplingParams
from ..request import RequestState, StopReason

S = RequestState
LIVE_QUEUED = (S.WAITING, S.PREEMPTED, S.PREFILL, S.DECODE)


class InjectedFailure(Exception):
    """Raised on purpose inside the model's forward pass."""


class EngineFuzzer:
    """Actions on ``llm`` with the checks that must hold after each. ``make_reference()``
    builds an engine with room for one request at a time, used to run each request alone."""

    def __init__(self, llm, make_reference):
        self.llm = llm
        self._make_reference = make_reference
        self._reference = None
        self._alone: dict[tuple, list[int]] = {}
        self.ids: list[str] = []
        self.failures_injected = 0

    # --- actions -------------------------------------------------------------------------
    def add(self, prompt: list[int], max_tokens: int, temperature: float, seed: int, auto_release: bool):
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=True)
        req = self.llm.add_request(prompt_token_ids=prompt, params=params, auto_release=auto_release)
        self.ids.append(req.request_id)
        return req

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.llm.step()

    def cancel(self, index: int) -> None:
        if self.ids:
            self.llm.cancel(self.ids[index % len(self.ids)])

    def release(self, index: int) -> None:
        done = [i for i in self.ids if self.llm.requests[i].state == S.FINISHED]
        if done:
            self.llm.release(done[index % len(done)])

    def failing_step(self, layer: int, interrupt: bool) -> None:
        """One step whose forward pass raises in layer ``layer`` (mod the number of layers)."""
        layers = self.llm.model.model.layers
        target = layers[layer % len(layers)]
        exc = KeyboardInterrupt if interrupt else InjectedFailure

        def boom(*args, **kwargs):
            raise exc(f"injected in layer {layer % len(layers)}")

        target.forward = boom
        try:
            self.llm.step()
        except (InjectedFailure, KeyboardInterrupt):
            self.failures_injected += 1
        finally:
            del target.forward  # back to the class's forward

    def cancel_from_thread(self, index: int, steps: int = 2) -> None:
        """A second thread cancels one request while this one steps."""
        if not self.ids:
            return self.step(steps)
        rid = self.ids[index % len(self.ids)]
        t = threading.Thread(target=self.llm.cancel, args=(rid,))
        t.start()
        self.step(steps)
        t.join()
        req = self.llm.requests[rid]
        assert req.state == S.RELEASED and not req.block_table, req

    # --- checks --------------------------------------------------------------------------
    def check(self) -> None:
        """Blocks in use = blocks held by requests; queues hold exactly the live requests."""
        llm = self.llm
        alloc = llm.kv_cache.allocator
        if hasattr(alloc, "check_invariants"):
            alloc.check_invariants()
        holders: dict[int, int] = {}
        for rid in self.ids:
            req = llm.requests[rid]
            assert len(set(req.block_table)) == len(req.block_table), f"{req} holds a block twice"
            for b in req.block_table:
                holders[b] = holders.get(b, 0) + 1
        assert alloc.num_used == len(holders), (alloc.num_used, holders)
        for b, n in holders.items():
            assert alloc.ref_count[b] == n, (b, alloc.ref_count[b], n)
        sched = llm.scheduler
        queued = [r.request_id for r in sched.waiting] + [r.request_id for r in sched.running]
        assert len(queued) == len(set(queued)), queued
        for rid in self.ids:
            req = llm.requests[rid]
            assert (rid in queued) == (req.state in LIVE_QUEUED), req
            if req.state in (S.WAITING, S.PREEMPTED):
                assert not req.block_table, req
            if req.state == S.FINISHED:
                assert req.stop_reason is not None and not req.auto_release, req
            if req.state == S.RELEASED:
                assert not req.block_table and req.stop_reason is not None, req
        assert set(llm.blocks_held()) == {r for r in self.ids if llm.requests[r].block_table}

    def alone(self, req) -> list[int]:
        """The tokens ``req`` gets when it runs alone on a fresh engine."""
        p = req.params
        key = (tuple(req.prompt_token_ids), p.max_tokens, p.temperature, p.seed)
        if key not in self._alone:
            if self._reference is None:
                self._reference = self._make_reference()
            ref = self._reference
            r = ref.add_request(prompt_token_ids=list(req.prompt_token_ids), params=p)
            while ref.has_unfinished():
                ref.step()
            self._alone[key] = list(r.output_token_ids)
        return self._alone[key]

    def drain(self, max_steps: int = 5000) -> None:
        """Release what waits for it, step to the end, then check every output."""
        llm = self.llm
        for _ in range(max_steps):
            for rid in self.ids:
                if llm.requests[rid].state == S.FINISHED:
                    llm.release(rid)
            if not llm.has_unfinished():
                break
            llm.step()
            self.check()
        else:
            raise AssertionError("the engine did not finish")
        for rid in self.ids:
            req = llm.requests[rid]
            assert req.state == S.RELEASED and req.stop_reason is not None, req
            want = self.alone(req)
            got = req.output_token_ids
            if req.stop_reason == StopReason.MAX_TOKENS:
                assert got == want, (req, got, want)
            else:  # cancelled (or the pool was full): what it got so far is the same prefix
                assert got == want[:len(got)], (req, got, want)
        self.check()
        assert llm.cache_stats().used_blocks == 0


PREFIXES = ([], [5, 6, 7, 8], [5, 6, 7, 8, 9, 10, 11, 12])


def random_program(fz: EngineFuzzer, rng: random.Random, length: int, vocab: int) -> None:
    """``length`` random actions on ``fz``, then drain and check."""
    for _ in range(length):
        action = rng.choices(["add", "step", "cancel", "release", "fail", "thread_cancel"],
                             weights=[4, 4, 1, 1, 1, 1])[0]
        if action == "add":
            tail = [rng.randrange(2, min(vocab, 300)) for _ in range(rng.randint(1, 10))]
            fz.add(rng.choice(PREFIXES) + tail, rng.randint(1, 12), rng.choice([0.0, 0.8]),
                   rng.randrange(1 << 30), rng.random() < 0.7)
        elif action == "step":
            fz.step(rng.randint(1, 4))
        elif action == "cancel":
            fz.cancel(rng.randrange(1 << 30))
        elif action == "release":
            fz.release(rng.randrange(1 << 30))
        elif action == "fail":
            fz.failing_step(rng.randrange(64), rng.random() < 0.5)
        else:
            fz.cancel_from_thread(rng.randrange(1 << 30))
        fz.check()
    fz.drain()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm.apps.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--length", type=int, default=25, help="actions per program")
    ap.add_argument("--model", default=None, help="a model folder (default: the shipped model)")
    ap.add_argument("--decode-graphs", default=None, choices=["eager", "compile"],
                    help="fuzz an engine whose decode-only steps run through decode graphs (the reference stays plain)")
    args = ap.parse_args(argv)
    from ..llm import LLM

    def engine(**kw):
        return LLM(args.model, device="cpu", block_size=4, max_model_len=48, **kw)

    llm = engine(num_kv_blocks=10, max_num_seqs=4, max_num_batched_tokens=24, decode_graphs=args.decode_graphs)
    make_reference = lambda: engine(num_kv_blocks=64, max_num_seqs=1)  # noqa: E731
    fz = EngineFuzzer(llm, make_reference)
    rng = random.Random(args.seed)
    vocab = llm.model_config.vocab_size
    t0 = time.perf_counter()
    for i in range(args.programs):
        fz.ids = []
        try:
            random_program(fz, rng, args.length, vocab)
        except AssertionError as exc:
            print(f"program {i} (seed {args.seed}) broke an invariant: {exc}", file=sys.stderr)
            return 1
        if (i + 1) % 100 == 0:
            print(f"{i + 1} programs ok ({time.perf_counter() - t0:.0f} s, "
                  f"{fz.failures_injected} injected failures)", flush=True)
        for rid in fz.ids:  # keep the engine small between programs
            llm.requests.pop(rid, None)
        llm.clear_trace()
    print(f"{args.programs} programs, {fz.failures_injected} injected failures: every invariant held "
          f"and every output equals its request run alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
