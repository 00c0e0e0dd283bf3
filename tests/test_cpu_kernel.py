"""The CPU paged decode attention kernel (``minillm/fast/kernels/paged_decode.c`` via
``minillm.fast.cpu_kernel``) and the "kernel"/"auto" backends: it equals attention computed the slow
obvious way on every head layout (its fast paths and its generic one), reads nothing outside
each row's context, refuses bad tables instead of reading outside the pool, and an engine
using it gives the reference's tokens; "auto" falls back to the reference where the kernel
cannot be built, and an explicit "kernel" there says why."""

from __future__ import annotations

import os

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.fast import cpu_kernel
from minillm.fast.attention import NULL_BLOCK, resolve_backend
from conftest import run_to_end

pytestmark = pytest.mark.skipif(not cpu_kernel.available(),
                                reason=f"the kernel cannot be built here: {cpu_kernel.unavailable_reason()}")


def _naive(q, k_pool, v_pool, table, length, scale):
    """One row's decode attention token by token, in float64."""
    bs, kv_heads = k_pool.shape[1], k_pool.shape[2]
    keys = torch.stack([k_pool[table[j // bs], j % bs] for j in range(length)]).double()
    values = torch.stack([v_pool[table[j // bs], j % bs] for j in range(length)]).double()
    per = q.shape[0] // kv_heads
    keys, values = keys.repeat_interleave(per, 1), values.repeat_interleave(per, 1)
    weights = torch.softmax(torch.einsum("hd,lhd->hl", q.double(), keys) * scale, -1)
    return torch.einsum("hl,lhd->hd", weights, values).float()


def _case(lengths, heads, kv_heads, dim, block_size, seed=0, extra_width=0):
    g = torch.Generator().manual_seed(seed)
    width = -(-max(lengths) // block_size) + extra_width
    num_blocks = sum(-(-n // block_size) for n in lengths) + 2
    k_pool = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    v_pool = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lengths]
    padded = torch.tensor([t + [NULL_BLOCK] * (width - len(t)) for t in tables])
    q = torch.randn(len(lengths), heads, dim, generator=g) * 3  # sharp softmaxes too
    return q, k_pool, v_pool, tables, padded, torch.tensor(lengths)


# (heads, kv_heads, dim): the compiled fast paths (head size 64 or 128, 1-8 query heads per KV
# head: SmolLM2's 9/3 of 64, the shipped model's 4/2), and shapes only the generic loop serves
SHAPES = [(9, 3, 64), (4, 2, 64), (2, 2, 64), (8, 1, 64), (16, 2, 128), (12, 4, 128),
          (6, 2, 8), (3, 1, 48), (20, 2, 64), (4, 4, 80)]


@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_kernel_equals_naive_attention(heads, kv_heads, dim, block_size):
    lengths = [1, 17, 40, 16, 3, 33]  # a tail of 1..15 tokens past a 16-lane chunk, and none
    q, kp, vp, tables, padded, lens = _case(lengths, heads, kv_heads, dim, block_size, extra_width=2)
    scale = dim ** -0.5
    got = cpu_kernel.paged_decode(q, kp, vp, padded, lens, scale)
    for i, (t, n) in enumerate(zip(tables, lengths)):
        want = _naive(q[i], kp, vp, t, n, scale)
        assert (got[i] - want).abs().max().item() < 1e-5, (i, n)  # float32 rounding
    # nothing past a row's context is read: poison every block no row reaches
    used = {b for t in tables for b in t}
    for b in range(kp.shape[0]):
        if b not in used:
            kp[b], vp[b] = float("nan"), float("nan")
    assert torch.equal(cpu_kernel.paged_decode(q, kp, vp, padded, lens, scale), got)


def _paged(keys, values, block_size, seed):
    """keys/values [n, kv_heads, dim] laid out in a pool of ``block_size``-token blocks, in a random order."""
    n = keys.shape[0]
    nblocks = -(-n // block_size)
    order = (torch.randperm(nblocks + 2, generator=torch.Generator().manual_seed(seed)) + 1)[:nblocks].tolist()
    kp = torch.randn(nblocks + 3, block_size, *keys.shape[1:])
    vp = torch.randn_like(kp)
    for j in range(n):
        kp[order[j // block_size], j % block_size] = keys[j]
        vp[order[j // block_size], j % block_size] = values[j]
    return kp, vp, torch.tensor([order])


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 64), (16, 2, 128), (6, 2, 8)])
def test_a_rows_result_does_not_depend_on_how_its_context_is_paged(heads, kv_heads, dim):
    """The same context in blocks of 1, 5, 16 or 37 tokens gives the same bits: the kernel sums
    each score in one way wherever its token falls in a block or in a group of vector lanes
    (its fast path scores 8 or 16 tokens at a time, padding a short group)."""
    g = torch.Generator().manual_seed(3)
    for n in (1, 15, 16, 17, 40, 100):
        keys, values = torch.randn(n, kv_heads, dim, generator=g), torch.randn(n, kv_heads, dim, generator=g)
        q = torch.randn(1, heads, dim, generator=g) * 3
        outs = []
        for block_size in (1, 5, 16, 37):
            kp, vp, table = _paged(keys, values, block_size, seed=n + block_size)
            outs.append(cpu_kernel.paged_decode(q, kp, vp, table, torch.tensor([n]), dim ** -0.5))
        assert all(torch.equal(outs[0], o) for o in outs[1:]), n


@pytest.mark.parametrize("isa, extra", [("avx2", ["-mno-avx512f"]),
                                         ("plain", ["-mno-avx512f", "-mno-avx2", "-mno-fma"])])
def test_every_shape_of_vec_h_serves_both_kernels(monkeypatch, isa, extra):
    """``kernels/vec.h`` (the vector type and exp that paged_decode.c and small_ops.c share) built
    for AVX2 + FMA and for no vector set at all, whatever this CPU has: the attention kernel
    still equals the naive one (vectorised with AVX2, its plain loop without) and the fused small
    ops still equal torch's, exp's clamps included."""
    import torch.nn.functional as F

    from minillm.fast import small_ops

    flags = [*cpu_kernel.FLAGS, *extra]
    fn, error = cpu_kernel.load_library(f"paged_decode-{isa}", cpu_kernel.SOURCE, flags, cpu_kernel._declare,
                                        libs=["-lm"])
    ops, ops_error = cpu_kernel.load_library(f"small_ops-{isa}", small_ops.SOURCE, flags, small_ops._declare,
                                             libs=["-lm"])
    assert error is None and ops_error is None, (error, ops_error)
    monkeypatch.setattr(cpu_kernel, "_lib", fn)
    monkeypatch.setattr(small_ops, "_lib", ops)
    assert cpu_kernel.has_fast_path(64, 3) is (isa == "avx2")
    for heads, kv_heads, dim in ((9, 3, 64), (16, 2, 128), (6, 2, 8)):
        lengths = [1, 17, 40, 3]
        q, kp, vp, tables, padded, lens = _case(lengths, heads, kv_heads, dim, 5)
        got = cpu_kernel.paged_decode(q, kp, vp, padded, lens, dim ** -0.5)
        for i, (t, n) in enumerate(zip(tables, lengths)):
            assert (got[i] - _naive(q[i], kp, vp, t, n, dim ** -0.5)).abs().max().item() < 1e-5, (heads, dim, i)
    g = torch.Generator().manual_seed(7)
    gate_up = torch.randn(5, 2 * 37, generator=g) * 8
    gate_up[0, :4] = torch.tensor([-120.0, 120.0, 0.0, -0.0])
    x, w = torch.randn(5, 37, generator=g), torch.randn(37, generator=g)
    with torch.inference_mode():
        gate, up = gate_up.split(37, dim=-1)
        torch.testing.assert_close(small_ops.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-5)
        want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
        torch.testing.assert_close(small_ops.rms_norm(x, w, 1e-5), want, rtol=1e-5, atol=1e-5)


def test_kernel_takes_strided_queries_and_any_thread_count():
    q, kp, vp, tables, padded, lens = _case([30, 7, 64], 9, 3, 64, 16)
    wide = torch.randn(3, 2 * 9 * 64)
    strided = wide[:, :9 * 64].view(3, 9, 64)  # rows further apart than their heads
    strided.copy_(q)
    want = cpu_kernel.paged_decode(q, kp, vp, padded, lens, 0.125)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(cpu_kernel.paged_decode(strided, kp, vp, padded, lens, 0.125), want)
    finally:
        torch.set_num_threads(before)


def test_kernel_refuses_tables_outside_the_pool_and_bad_inputs():
    q, kp, vp, tables, padded, lens = _case([20, 9], 4, 2, 64, 16)
    for bad in (kp.shape[0], -1, 10 ** 9):
        t = padded.clone()
        t[1, 0] = bad
        with pytest.raises(ValueError, match="block id outside the KV pool"):
            cpu_kernel.paged_decode(q, kp, vp, t, lens, 0.125)
    with pytest.raises(ValueError, match="fewer blocks than a context needs"):
        cpu_kernel.paged_decode(q, kp, vp, padded[:, :1], lens, 0.125)
    with pytest.raises(ValueError, match="float32"):
        cpu_kernel.paged_decode(q.double(), kp.double(), vp.double(), padded, lens, 0.125)
    with pytest.raises(ValueError, match="int64"):
        cpu_kernel.paged_decode(q, kp, vp, padded.int(), lens, 0.125)
    with pytest.raises(ValueError, match="contiguous KV pool"):
        strided = kp.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, not contiguous
        cpu_kernel.paged_decode(q, strided, strided, padded, lens, 0.125)
    zero = cpu_kernel.paged_decode(q, kp, vp, padded, torch.tensor([0, 9]), 0.125)
    assert (zero[0] == 0).all()  # an empty context attends nothing


def _engine(tiny_llama, backend, **kw):
    return LLM(str(tiny_llama[0]), "cpu", "float32", block_size=4, num_kv_blocks=48, max_num_seqs=8,
               attention_backend=backend, **kw)


@pytest.fixture(scope="module")
def heads_of_64(tmp_path_factory):
    """A random Llama whose heads (2 query / 1 KV of 64) take the kernel's vectorised path."""
    from conftest import make_model

    folder = tmp_path_factory.mktemp("heads64")
    make_model(folder, "llama", hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    return folder, None


@pytest.mark.parametrize("model", ["tiny_llama", "heads_of_64"])
def test_an_engine_on_the_kernel_gives_the_reference_tokens_through_preemption(model, request):
    """A pool too small for every request at once (preemptions, recomputation), a shared
    prefix (cache hits), seeded sampling: the same tokens and logprobs as the reference, on the
    kernel's generic loop (heads of 16) and on its vectorised path (heads of 64)."""
    folder = request.getfixturevalue(model)
    fast = model == "heads_of_64"
    if fast and not cpu_kernel.has_fast_path(64, 2):
        pytest.skip("this CPU has neither AVX-512 nor AVX2 + FMA: the kernel has no vectorised path here")
    assert not cpu_kernel.has_fast_path(16, 2)
    runs = {}
    for backend in ("gather", "kernel", "auto"):
        llm = _engine(folder, backend)
        # "auto" takes the kernel only where its vectorised path serves the heads
        assert llm.attention_backend == (("kernel" if fast else "gather") if backend == "auto" else backend)
        g = torch.Generator().manual_seed(3)
        prefix = torch.randint(2, 320, (10,), generator=g).tolist()
        reqs = [llm.add_request(prompt_token_ids=prefix + torch.randint(2, 320, (n,), generator=g).tolist(),
                                params=SamplingParams(max_tokens=24, temperature=0.8 if i % 2 else 0,
                                                      seed=i, logprobs=2, ignore_eos=True))
                for i, n in enumerate((3, 25, 9, 14, 1, 30))]
        run_to_end(llm)
        assert llm.cache_stats().used_blocks == 0
        assert any(e.kind == "step" and e.data["num_preempted"] for e in llm.trace), \
            "the pool was meant to be too small"
        runs[backend] = [(r.output_token_ids, [sorted(lp) for lp in r.logprobs]) for r in reqs]
    assert runs["kernel"] == runs["gather"] == runs["auto"]


def test_the_shipped_model_runs_the_kernel_by_default():
    if not cpu_kernel.has_fast_path(64, 2):
        pytest.skip("this CPU has neither AVX-512 nor AVX2 + FMA: the kernel has no vectorised path here")
    llm = LLM(num_kv_blocks=16)
    assert llm.attention_backend == "kernel" and llm.runner.attention.name == "kernel"
    assert not cpu_kernel.has_fast_path(48, 2) and not cpu_kernel.has_fast_path(64, 9)


def test_eager_decode_graphs_call_the_kernel(tiny_llama):
    llm = _engine(tiny_llama, "kernel", decode_graphs="eager")
    assert llm.runner.graphs.attention is llm.runner.attention
    ref = _engine(tiny_llama, "gather")
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = []
    for engine in (llm, ref):
        reqs = [engine.add_request(prompt_token_ids=list(range(2, 2 + n)), params=params) for n in (3, 11, 6)]
        run_to_end(engine)
        outs.append([r.output_token_ids for r in reqs])
    assert outs[0] == outs[1]
    assert sum(g.runs for g in llm.runner.graphs.graphs.values()) > 0


def test_auto_falls_back_to_the_reference_where_the_kernel_cannot_run(monkeypatch, tmp_path):
    assert resolve_backend("auto", "cpu", torch.bfloat16) == "gather"
    assert resolve_backend("auto", "cuda", torch.float32) == "flex"  # the GPU's paged backend, not the kernel
    with pytest.raises(ValueError, match=r"attention_backend='kernel'.*float32 KV cache on the CPU"):
        resolve_backend("kernel", "cpu", torch.bfloat16)
    # no compiler: "auto" is the reference, "kernel" names what is missing
    monkeypatch.setattr(cpu_kernel, "_lib", None)
    monkeypatch.setattr(cpu_kernel._library, "reason", None)
    monkeypatch.setenv("MINILLM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(cpu_kernel.shutil, "which", lambda name: None)
    assert not cpu_kernel.available()
    assert resolve_backend("auto", "cpu", torch.float32) == "gather"
    with pytest.raises(ValueError, match="attention_backend='kernel' cannot be used here"):
        resolve_backend("kernel", "cpu", torch.float32)


@pytest.mark.parametrize("part", ["kernel", "operator"])
def test_a_broken_build_is_reported_not_raised(monkeypatch, tmp_path, part):
    """A build that fails (the ctypes kernel, or the torch operator) makes ``available()`` /
    ``op_available()`` False with the compiler's complaint, and leaves no library to load."""
    name, source_at, state, check, reason = {
        "kernel": ("paged_decode.c", (cpu_kernel._library, "source"),
                   ((cpu_kernel, "_lib"), (cpu_kernel._library, "reason")), cpu_kernel.available,
                   cpu_kernel.unavailable_reason),
        "operator": ("paged_decode_op.cpp", (cpu_kernel, "OP_SOURCE"), ((cpu_kernel, "_op"), (cpu_kernel, "_op_error")),
                     cpu_kernel.op_available, cpu_kernel.op_unavailable_reason)}[part]
    source = tmp_path / name
    source.write_text("this is not C\n")
    monkeypatch.setattr(*source_at, source)
    for owner, attr in state:
        monkeypatch.setattr(owner, attr, None)
    if part == "operator":
        monkeypatch.setattr(cpu_kernel.torch.ops, "minillm", object())  # as if never loaded
    monkeypatch.setenv("MINILLM_KERNEL_CACHE", str(tmp_path / "cache"))
    assert not check()
    assert f"building {name} failed" in reason()
    assert not list((tmp_path / "cache").glob("*.so"))  # no half-built library left to load


@pytest.mark.parametrize("module", ["small_ops", "gemv", "layer_step"])
def test_every_kernel_library_loads_through_the_one_loader_and_falls_back(monkeypatch, tmp_path, module):
    """The fused small ops, the gemv kernel and the one-call layer are built, loaded and checked by
    the same ``cpu_kernel.LazyLibrary`` as the attention kernel: a source that does not compile
    leaves them unavailable with the compiler's complaint (their callers keep torch's ops), no
    library in the cache, and the failure remembered (a second call does not build again)."""
    import importlib

    mod = importlib.import_module(f"minillm.fast.{module}")
    if not all(need.available() for need in mod._library.needs):  # (loaded before the count below)
        pytest.skip("a library the one-call layer calls cannot be built here")
    source = tmp_path / mod._library.source.name
    source.write_text("this is not C\n")
    monkeypatch.setattr(mod._library, "source", source)
    monkeypatch.setattr(mod, "_lib", None)
    monkeypatch.setattr(mod._library, "reason", None)
    monkeypatch.setenv("MINILLM_KERNEL_CACHE", str(tmp_path / "cache"))
    builds = []
    monkeypatch.setattr(cpu_kernel, "_compile", lambda *a, _c=cpu_kernel._compile: builds.append(1) or _c(*a))
    assert not mod.available()
    assert f"building {source.name} failed" in mod.unavailable_reason()
    assert len(builds) == 1 and not list((tmp_path / "cache").glob("*.so"))
    if module == "small_ops":  # the model keeps its reference modules
        from minillm.models.llama import RMSNorm

        model = torch.nn.Sequential(RMSNorm(8, 1e-5))
        assert mod.use_small_ops(model) is False and type(model[0]) is RMSNorm


def test_a_library_that_calls_others_is_not_built_without_them(monkeypatch):
    """The one-call layer's library calls the gemv, small_ops and attention kernels by address:
    where one of them cannot be loaded it is not built at all, and its reason names the missing one."""
    from minillm.fast import gemv, layer_step, small_ops

    if not (small_ops.available() and cpu_kernel.available()):
        pytest.skip("the small ops cannot be built here")
    monkeypatch.setattr(gemv, "_lib", None)
    monkeypatch.setattr(gemv._library, "reason", "RuntimeError: no C compiler here")
    monkeypatch.setattr(layer_step, "_lib", None)
    monkeypatch.setattr(layer_step._library, "reason", None)
    builds = []

    def build(name, *args):
        builds.append(name)
        raise RuntimeError(f"building {name}")

    monkeypatch.setattr(cpu_kernel, "_compile", build)
    assert not layer_step.available() and not builds
    assert layer_step.unavailable_reason() == "needs the gemv kernel(s), unavailable here"


def test_a_read_only_cache_builds_into_the_temporary_directory(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a cache "directory" below a file cannot be made
    monkeypatch.setenv("MINILLM_KERNEL_CACHE", str(blocked / "kernels"))
    monkeypatch.setattr(cpu_kernel.kernel_cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    built = cpu_kernel._build()
    private = tmp_path / "tmp" / f"minillm-kernels-{os.geteuid()}"
    assert os.path.samefile(built, next(private.glob("paged_decode-*.so")))
    assert (private.stat().st_mode & 0o777) == 0o700


def test_the_kernel_refuses_impossible_arguments_before_running():
    """Issue 26: a mismatched ``v_pool`` crashed the process, ``kv_heads=0`` or
    ``block_size=0`` killed it with SIGFPE. Python names the problem; the C entry point
    refuses the same arguments on its own (-3) if called directly."""
    q, kp, vp, tables, padded, lens = _case([20, 9], 4, 2, 64, 16)
    bad = {
        "v_pool has shape": (q, kp, vp[:, :, :1].contiguous(), padded, lens),
        "kv_heads must be at least 1": (q, kp[:, :, :0], vp[:, :, :0], padded, lens),
        "block_size must be at least 1": (q, kp[:, :0], vp[:, :0], padded, lens),
        "multiple of kv_heads": (q[:, :3].contiguous(), kp, vp, padded, lens),
        "CPU tensor": (q, kp, vp, [[1]], lens),
        r"block_tables must be int64 \[2, W\]": (q, kp, vp, padded[0], lens),
    }
    for match, args in bad.items():
        with pytest.raises(ValueError, match=match):
            cpu_kernel.paged_decode(*args, 0.125)
    fn = cpu_kernel._library.get()
    out = torch.empty_like(q)
    for kv_heads, block_size in ((0, 16), (2, 0), (3, 16)):
        assert fn(q.data_ptr(), q.stride(0), q.stride(1), kp.data_ptr(), vp.data_ptr(), kp.shape[0],
                  padded.data_ptr(), padded.shape[1], lens.data_ptr(), out.data_ptr(), 2, 4, kv_heads, 64,
                  block_size, 0.125, 1) == -3
    assert fn(None, 0, 0, None, None, 1, None, 1, None, None, 2, 4, 2, 64, 16, 0.125, 1) == -3


needs_op = pytest.mark.skipif(not cpu_kernel.op_available(),
                              reason=f"the kernel's torch operator cannot be built here: {cpu_kernel.op_unavailable_reason()}")


@needs_op
@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_the_operator_is_the_kernel(heads, kv_heads, dim):
    """``torch.ops.minillm.paged_decode`` (what compiled graphs call) gives the ctypes call's
    output bit for bit, strided queries included, eagerly and traced."""
    lengths = [1, 17, 40, 16, 3, 33]
    q, kp, vp, tables, padded, lens = _case(lengths, heads, kv_heads, dim, 5, extra_width=1)
    scale = dim ** -0.5
    want = cpu_kernel.paged_decode(q, kp, vp, padded, lens, scale)
    assert torch.equal(torch.ops.minillm.paged_decode(q, kp, vp, padded, lens, scale), want)
    wide = torch.zeros(len(lengths), heads, 2 * dim)
    wide[:, :, :dim] = q
    assert torch.equal(torch.ops.minillm.paged_decode(wide[:, :, :dim], kp, vp, padded, lens, scale), want)
    traced = torch.compile(lambda *a: torch.ops.minillm.paged_decode(*a, scale), fullgraph=True, backend="aot_eager")
    assert torch.equal(traced(q, kp, vp, padded, lens), want)


@needs_op
def test_the_operator_refuses_bad_inputs():
    q, kp, vp, tables, padded, lens = _case([20, 9], 4, 2, 64, 16)
    op = torch.ops.minillm.paged_decode
    t = padded.clone()
    t[1, 0] = kp.shape[0]
    with pytest.raises(RuntimeError, match="block id outside the KV pool"):
        op(q, kp, vp, t, lens, 0.125)
    with pytest.raises(RuntimeError, match="fewer blocks than a context needs"):
        op(q, kp, vp, padded[:, :1].contiguous(), lens, 0.125)
    with pytest.raises(RuntimeError, match="float32"):
        op(q.double(), kp.double(), vp.double(), padded, lens, 0.125)
    with pytest.raises(RuntimeError, match="int64"):
        op(q, kp, vp, padded.int(), lens, 0.125)
    strided = torch.zeros(*kp.shape[:3], 2 * kp.shape[3])[..., :kp.shape[3]]
    with pytest.raises(RuntimeError, match="contiguous KV pool"):
        op(q, strided, vp, padded, lens, 0.125)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        op(q, kp, vp[:, :, :1], padded, lens, 0.125)
    with pytest.raises(RuntimeError, match=r"contiguous \[n, W\]"):
        op(q, kp, vp, padded[:1], lens, 0.125)
    for pools in ((kp[:, :, :0], vp[:, :, :0]), (kp[:, :0], vp[:, :0])):  # kv_heads 0, block_size 0
        with pytest.raises(RuntimeError, match="shapes do not match|at least 1"):
            op(q, *pools, padded, lens, 0.125)


@needs_op
def test_compiled_decode_graphs_call_the_kernel_operator(tiny_llama):
    """With the "kernel" backend a compiled graph's attention is the kernel itself (through
    its operator), and its tokens are the eager reference's; with "gather" the graphs keep
    their traced reads (``PagedReductions``)."""
    kw = dict(block_size=4, num_kv_blocks=48, max_num_seqs=2, num_threads=1)
    llm = LLM(str(tiny_llama[0]), "cpu", "float32", attention_backend="kernel", decode_graphs="compile", **kw)
    assert llm.runner.graphs.attention is llm.runner.attention
    other = LLM(str(tiny_llama[0]), "cpu", "float32", attention_backend="gather", decode_graphs="compile", **kw)
    assert other.runner.graphs.attention.name == "reductions"
    ref = _engine(tiny_llama, "gather")
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    outs = []
    for engine in (llm, ref):
        reqs = [engine.add_request(prompt_token_ids=list(range(2, 2 + n)), params=params) for n in (3, 13)]
        run_to_end(engine)
        outs.append([r.output_token_ids for r in reqs])
    assert outs[0] == outs[1]
    graphs = llm.runner.graphs
    assert graphs.compiles == len({b for b, _ in graphs.graphs}) and graphs.compiler == "aot", graphs.aot_error
    assert sum(g.runs for g in graphs.graphs.values()) >= 20


def test_without_the_operator_compiled_graphs_keep_their_own_reads(monkeypatch, tiny_llama):
    monkeypatch.setattr(cpu_kernel, "op_available", lambda: False)
    llm = LLM(str(tiny_llama[0]), "cpu", "float32", block_size=4, num_kv_blocks=16, attention_backend="kernel",
              decode_graphs="compile")
    assert llm.runner.graphs.attention.name == "reductions"
