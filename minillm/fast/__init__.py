"""The fast layer: what makes the engine fast on a device, behind one seam.

The reference path (``LLM(fast=False)``: ``minillm.runner``, ``minillm.sampler``, the model's own
attention) is what the chapter reads. ``LLM()`` runs this layer instead, token for token the same
(the parity, fuzz and SIGINT tests run both), and the reference path knows nothing of it:

* ``runner``: ``FastRunner``, the step's integers in one upload, block tables kept on the device
  (``BlockTableRows``), decode rows attended together;
* ``attention``: the backends that read the paged pool for all decode rows at once (gather in
  groups, paged, the C kernel, FlexAttention);
* ``sampler``: ``BatchedSampler``, the whole batch in a fixed number of device operations;
* ``decode_graphs``, ``graph_call``, ``compiled``: fixed-shape graphs of decode steps (called straight
  through inductor's entry once checked), ``torch.compile`` of the forward;
* ``cpu_kernel``, ``kernel_cache``, ``kernels/``: the C kernel and its checked build cache;
* ``threaded``: projections split by output rows across persistent threads;
* ``gemv``: decode's few-row projections (float32, int8) on a C kernel that streams each weight
  once and shares output rows with persistent worker threads (``stream_weights``, on the CPU);
* ``small_ops``: a decoder layer's RMSNorms, residual add and SiLU·mul fused in C (eager steps);
* ``layer_step``: a decode step's whole decoder layer as one C call of those kernels (eager
  steps of a few rows on the attention kernel);
* ``packed``: a wide product of a decode batch (an lm head over 9-256 rows) on oneDNN with the
  weight packed once (``gemv.StreamLinear`` calls it);
* ``huge_pages``: the weights (``prepare_model``) and the KV pool (``kv_pool_zeros``, passed to
  ``KVCache``) in 2 MB pages on Linux.

``prepare_model(llm, options)`` changes the weights (int8, the row split) before the KV cache
is sized; ``build(llm, options, ...)`` assembles the runner and sampler an ``LLM`` uses.
"""

from __future__ import annotations


def prepare_model(llm, opts) -> None:
    """int8 weights (``minillm.models.weights``), the streaming decode kernel (``gemv``, on the
    CPU) and the row split (``threaded``), as asked:
    after the thread count (chosen from the float parameters), before the KV budget (what the
    weights leave of the memory). ``llm.shard_pool`` holds the row split's threads (None: unused)."""
    import torch

    if opts.weight_dtype is not None:
        from ..models.weights import quantize_weights

        quantize_weights(llm.model, opts.weight_dtype)
    if opts.fast and llm.device.type == "cpu":
        from .huge_pages import rehome

        rehome(llm.model)  # the weights in 2 MB pages: decode streams every one of them each step
    if opts.fast and llm.device.type == "cpu" and not opts.compile:
        # (not under LLM(compile=True): its one graph for every step would guard on the
        # kernel's few-rows test and recompile past its bound; tests/test_compile.py)
        from ..models.weights import MIN_STREAM_BYTES, stream_weights

        # inside a decode graph, or a layer made one C call (``layer_step``), the kernel's call costs
        # what F.linear's does, and torch's small products ran at 5-10 GB/s there (the shipped
        # model's 0.25-0.7 MB projections): stream all
        one_call = _layer_step_serves(llm, opts)
        stream_weights(llm.model, min_bytes=0 if opts.decode_graphs is not None or one_call else MIN_STREAM_BYTES)
        from .small_ops import use_small_ops

        # a layer's norms, residual add and SiLU·mul fused (eager steps), and then, on the attention
        # kernel, a decode step's whole layer in one C call
        if use_small_ops(llm.model) and one_call:
            from .layer_step import use_layer_step

            use_layer_step(llm.model)
    if opts.weight_dtype is not None and opts.decode_graphs == "compile":
        _check_int8_graphs(llm.model)
    threads = llm.num_threads or (torch.get_num_threads() if llm.device.type == "cpu" else 1)
    if opts.row_split and threads >= 2 and not opts.compile:
        from .threaded import use_row_split

        llm.shard_pool = use_row_split(llm.model, threads)


def _layer_step_serves(llm, opts) -> bool:
    """Whether eager decode steps will run each layer as one C call (``layer_step``): float32
    activations, the "kernel" attention backend, and the library built here."""
    import torch

    from .attention import resolve_backend

    cfg = llm.model_config
    if llm.dtype != torch.float32 or cfg.qk_norm:  # (q/k norms: not in the C layer)
        return False
    try:
        backend = resolve_backend(opts.attention_backend, llm.device, llm.dtype, cfg.head_dim,
                                  cfg.num_attention_heads // cfg.num_key_value_heads)
    except ValueError:  # build() reports it
        return False
    if backend != "kernel":
        return False
    from . import layer_step

    return layer_step.available()


def _check_int8_graphs(model) -> None:
    """Decode graphs trace int8 projections only as the streaming kernel's op (torch's packed
    int8 linear cannot be traced): a ValueError saying why where that kernel is not there."""
    from ..models.weights import Int8Linear
    from . import gemv

    streamed = all(m.streaming for m in model.modules() if isinstance(m, Int8Linear))
    why = None if streamed else (gemv.unavailable_reason() or f"{gemv.ENV_SWITCH}=0 turned it off")
    if why is None and not gemv.op_available():
        why = gemv.op_unavailable_reason()
    if why is not None:
        raise ValueError(f"decode_graphs='compile' with int8 weights needs the streaming kernel's op "
                         f"(minillm.fast.gemv), which is unavailable here: {why}; use decode_graphs='eager' "
                         f"or float weights")


def kv_pool_zeros(shape, dtype, device):
    """A zeroed layer of the KV pool, in huge pages where the system allows (``huge_pages``)."""
    from .huge_pages import zeros

    return zeros(shape, dtype, device)


def build(llm, opts, cfg, parts):
    """The fast runner and sampler for ``llm`` (model, KV cache and device already made) and the
    attention backend's name ("auto" resolved). Returns (runner, sampler, backend)."""
    from .attention import resolve_backend
    from .runner import FastRunner
    from .sampler import BatchedSampler

    backend = resolve_backend(opts.attention_backend, llm.device, llm.dtype, cfg.head_dim,
                              cfg.num_attention_heads // cfg.num_key_value_heads)
    runner = FastRunner(llm.model, llm.kv_cache, llm.device, backend)
    if opts.decode_graphs is not None:
        from .decode_graphs import DecodeGraphs

        runner.graphs = DecodeGraphs(llm.model, llm.kv_cache, llm.device, opts.decode_graphs,
                                     opts.max_num_seqs, llm.max_model_len, runner.attention)
    if opts.compile:  # the runner calls the compiled forward; llm.model stays eager
        from .compiled import CompiledModel

        runner.model = CompiledModel(llm.model)
    sampler = BatchedSampler(parts.top_k_filter, parts.top_p_filter)
    sampler.seed = opts.seed  # the unseeded rows' shared noise on CUDA (``BatchedSampler._noise``)
    return runner, sampler, backend
