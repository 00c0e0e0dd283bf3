"""A compiled decode graph called straight through inductor's entry point, without torch's
per-call wrappers.

An ahead-of-time compiled decode graph (``decode_graphs``) is still entered through several
layers of Python: the traced function's prologue (every weight fetched from its module), then
dynamo's and AOTAutograd's runtime wrappers, then inductor's ``CompiledFxGraph``, which finally
calls the C++ entry with a flat list of tensors. For a small model that is a measurable share of
a step (~0.1 ms of the shipped model's ~1 ms, one thread). Yet a bucket's graph is always called
with the same tensors: its persistent input buffers, the weights and the KV pool. So the list
the innermost call receives is recorded once, on the bucket's first call (``record``), and
replayed from then on (``InnerCall``): one Python call into C++ per step.

This leans on inductor's internals (``torch._inductor.output_code.CompiledFxGraph``), so it is
only used after it has been checked: the recorded call must be the only one, be given the
bucket's own buffers, return exactly the graph's outputs (no extra outputs a wrapper would copy
back into mutated inputs) and, run again on the same buffers (a decode step writes the same keys
and values to the same slots again), give the same results bit for bit. Anything else, and the graph stays on the wrapped call (the reason
is kept: ``DecodeGraphs.direct_error``).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class InnerCall:
    """Inductor's compiled graph with its recorded inputs: ``call()`` runs one step."""

    def __init__(self, compiled, inputs: list):
        self.fn = compiled.current_callable
        # integers (the dynamic width) as tensors once, not converted by inductor every call
        self.inputs = [x if isinstance(x, torch.Tensor) else torch.tensor(x) for x in inputs]

    def __call__(self):
        return self.fn(list(self.inputs))  # (the entry empties the list it is given)


@contextmanager
def _spy(calls: list):
    """Record every ``CompiledFxGraph`` call (object and inputs) made inside the block."""
    from torch._inductor.output_code import CompiledFxGraph

    real = CompiledFxGraph.__call__

    def spy(self, inputs):
        calls.append((self, list(inputs)))
        return real(self, inputs)

    CompiledFxGraph.__call__ = spy
    try:
        yield
    finally:
        CompiledFxGraph.__call__ = real


def record(fn, args: tuple):
    """Run ``fn(*args)`` (a compiled decode graph on its buffers) and try to record its inner
    call. Returns (fn's outputs, an ``InnerCall`` or None, why not)."""
    calls: list = []
    try:
        with _spy(calls):
            out = fn(*args)
    except ImportError as exc:  # no such internals in this torch
        return fn(*args), None, f"{type(exc).__name__}: {exc}"
    if len(calls) != 1:
        return out, None, f"the graph made {len(calls)} inner calls, not one"
    compiled, inputs = calls[0]
    if not all(any(x is a for x in inputs) for a in args):  # (another thread's graph, say)
        return out, None, "the inner call was not given the bucket's own buffers"
    if getattr(compiled, "current_callable", None) is None:
        return out, None, "inductor's graph has no current_callable"
    direct = InnerCall(compiled, inputs)
    again = direct()
    want = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(again) != len(want) or not all(torch.equal(a, b) for a, b in zip(again, want)):
        return out, None, "the inner call did not give the graph's outputs"
    return out, direct, None
