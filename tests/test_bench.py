"""The benchmark harness on a tiny random model: the token-identity check, the JSON, the CLI.

Fast (tiny sizes, one round) and without any assertion on speed: timings on a shared
machine say nothing in a test.
"""

from __future__ import annotations

import json
import os

import pytest

from minillm.apps.bench.harness import TokenMismatch, check_identical, load_engines
from minillm.apps.bench.models import TINY_SHAPE, build_random_llama
from minillm.apps.bench.workloads import Settings, kv_cache, latency, throughput

TINY = dict(runs=1, prompt_lens=(8, 24), new_tokens=6, num_requests=6, prompt_range=(4, 20),
            output_range=(3, 10), batch_sizes=(1, 4), small_batch_requests=4, kv_points=(12, 40),
            kv_decode_steps=2)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_random_llama(tmp_path_factory.mktemp("bench") / "tiny", TINY_SHAPE, init_std=0.08)


@pytest.fixture(scope="module")
def engines(tiny_model):
    return load_engines(tiny_model, "cpu", kv_cache_tokens=2048)


def test_check_identical_names_the_first_difference():
    assert check_identical("x", [[1, 2, 3], [4]], [[1, 2, 3], [4]])["identical"]
    with pytest.raises(TokenMismatch, match="1 of 2 requests .*request 1 at output position 2"):
        check_identical("x", [[1], [1, 2, 3]], [[1], [1, 2, 4]])
    loose = check_identical("x", [[1, 2]], [[1, 2, 3]], strict=False)  # a shorter output differs too
    assert not loose["identical"] and loose["mismatches"][0]["position"] == 2


def test_each_benchmark_checks_tokens_before_timing(engines, monkeypatch):
    """A baseline that returns one wrong token makes every comparison fail loudly."""
    real = engines.hf.generate
    vocab = engines.vocab_size

    def off_by_one(*args, **kwargs):
        out = real(*args, **kwargs)
        out[:, -1] = (out[:, -1] + 1) % vocab
        return out

    monkeypatch.setattr(engines.hf, "generate", off_by_one)
    s = Settings(**TINY)
    with pytest.raises(TokenMismatch, match="latency prompt=8"):
        latency(engines, s)
    with pytest.raises(TokenMismatch, match="generate\\(\\) batch 1"):
        throughput(engines, s)


def test_kv_cache_recompute_gives_the_engine_tokens(engines):
    res = kv_cache(engines, Settings(**TINY))
    assert [p["context"] for p in res["points"]] == [12, 40]
    for p in res["points"]:
        assert p["check"]["identical"]
        assert p["cached_s"]["median"] > 0 and p["recompute_s"]["median"] > 0 and p["ratio"] > 0


def test_cli_writes_json_plots_and_readme(tiny_model, tmp_path, monkeypatch):
    from minillm.apps.cli import main as cli_main

    monkeypatch.setattr(Settings, "quick_settings", classmethod(lambda cls, runs=None: cls(**TINY, quick=True)))
    out = tmp_path / "out"
    assert cli_main(["bench", "--model", str(tiny_model), "--quick", "--out", str(out)]) == 0
    result = json.loads((out / "results_tiny.json").read_text())
    assert {"model", "machine", "settings", "latency", "throughput", "kv_cache", "plots"} <= set(result)
    assert result["model"]["parameters"] > 0 and result["model"]["dtype"] == "float32"
    assert result["machine"]["device"] == "cpu" and result["machine"]["logical_cpus"] >= 1

    lat = result["latency"]["prompts"]
    assert [r["prompt_tokens"] for r in lat] == [8, 24]
    for r in lat:
        assert r["check"]["identical"] and r["ttft_ratio"] > 0 and r["tpot_ratio"] > 0
        assert len(r["minillm"]["tpot_s"]["runs"]) == len(r["transformers"]["tpot_s"]["runs"]) == 1

    thr = result["throughput"]
    assert thr["num_requests"] == 6 and thr["useful_output_tokens"] == sum(thr["output_lens"])
    assert all(c["identical"] for c in thr["checks"])
    assert {c["what"] for c in thr["checks"]} >= {"generate() batch 1", "generate() batch 4", "minillm static"}
    assert [b["batch_size"] for b in thr["generate_batch_sizes"]] == [1, 4]
    assert thr["generate_best_batch_size"] in (1, 4)
    for key in ("ratio_minillm_vs_generate_best", "ratio_continuous_vs_static"):
        assert thr[key] > 0
    assert all(p["check"]["identical"] for p in result["kv_cache"]["points"])

    for png in result["plots"]:
        assert (out / png.split("/")[-1]).read_bytes()[:4] == b"\x89PNG"
    readme = (out / "README.md").read_text()
    assert "bench:results:begin" in readme and "Batch-1 latency" in readme and "Mixed workload" in readme


def test_decode_groups_and_contiguous_contexts_give_the_same_tokens(tiny_model):
    """The engine paths the benchmarks tuned: length groups, the gather workspace, and a lone
    request attended in place when its blocks are consecutive. Same greedy tokens either way."""
    from minillm import LLM, SamplingParams
    from minillm.fast.runner import split_by_length

    assert split_by_length([7, 7, 7]) == [(0, 3)]
    assert split_by_length([500, 490, 480, 20, 10, 5], group_cost=100) == [(0, 3), (3, 6)]
    assert split_by_length([500, 20], group_cost=1000) == [(0, 2)]  # not worth a second call

    llm = LLM(str(tiny_model), block_size=4, num_kv_blocks=128, enable_prefix_caching=False)
    used = []
    real = llm.runner._decode_group

    def spy(*args):
        g = real(*args)
        used.append(g.first_slot is not None)
        return g

    llm.runner._decode_group = spy
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    prompt = list(range(5, 19))
    alone = llm.add_request(prompt_token_ids=prompt, params=params)
    while llm.has_unfinished():
        llm.step()
    assert all(used)  # a fresh pool hands out consecutive blocks: attended in place
    used.clear()
    # three requests growing side by side interleave their blocks: gathered, in groups
    others = [llm.add_request(prompt_token_ids=list(range(30, 30 + n)), params=params) for n in (3, 40)]
    crowded = llm.add_request(prompt_token_ids=prompt, params=params)
    while llm.has_unfinished():
        llm.step()
    assert not any(used)
    assert crowded.output_token_ids == alone.output_token_ids
    assert all(len(r.output_token_ids) == 20 for r in others)


# --- minillm bench --peers ----------------------------------------------------------------------
def test_first_divergence_and_peer_availability():
    from minillm.apps.bench.peers import available_peers, first_divergence

    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # a shorter output differs where it stops
    status = available_peers()
    assert set(status) == {"ctranslate2", "llama.cpp"}
    assert all(v is None or "not installed" in v for v in status.values())


def _reuse_llama_cpp_source(monkeypatch):
    """Point the peers at a llama.cpp source tree fetched before (the user cache), if any, so a
    test with its own empty cache does not fetch the sdist again."""
    from minillm.apps.bench import peers

    if "MINILLM_LLAMA_CPP_SRC" not in os.environ:
        found = sorted(peers.cache_root().glob("llama-cpp-python-*-src/vendor/llama.cpp"))
        if found:
            monkeypatch.setenv("MINILLM_LLAMA_CPP_SRC", str(found[-1]))


def test_peers_bench_on_a_tiny_model_checks_tokens_and_writes_a_table(tiny_model, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2", reason="pip install 'minillm[peers]'")
    from minillm.apps.bench import peers

    _reuse_llama_cpp_source(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the CT2 conversion goes there
    r = peers.bench_peers("tiny", tiny_model, threads_list=(1,), rounds=1, prompt_lens=(8, 24), new_tokens=6,
                          num_requests=5, log=lambda m: None)
    e = r["threads"]["1"]
    ct2 = next(n for n in e["engines"] if n.startswith("CTranslate2"))
    assert e["engines"][0] == "minillm"
    for row in e["latency"]:  # same float32 weights, same ids: the same greedy tokens
        assert row["checks"][ct2] == {"identical": True, "first_divergence": None}
        assert row["tpot"]["minillm"]["median"] > 0 and row["tpot"][ct2]["median"] > 0
    checks = e["workload"]["checks"]
    assert checks and all(c["identical_requests"] == c["requests"] == 5 for c in checks.values())
    assert e["workload"]["best_batch"][ct2] in peers.CTranslate2Engine.batch_sizes
    assert (tmp_path / "cache" / "minillm" / "peers").is_dir()
    if peers.available_peers()["llama.cpp"] is None:  # installed: it converts, loads and agrees
        assert not any(k.startswith("llama.cpp") for k in r["peers_not_run"]), r["peers_not_run"]
        lc = next(n for n in e["engines"] if n.startswith("llama.cpp"))
        assert lc.endswith(" F32") and all(row["checks"][lc]["identical"] for row in e["latency"])
    else:
        assert "llama.cpp was not run" in peers.peers_markdown([r])
    readme = tmp_path / "README.md"
    readme.write_text("# B\n\nintro\n")
    peers.update_peers_readme(readme, [r])
    peers.update_peers_readme(readme, [r])  # the block is replaced, not appended again
    text = readme.read_text()
    assert text.count(peers.PEERS_BEGIN) == 1 and "intro" in text and "TPOT minillm" in text


def test_llama_cpp_peer_converts_the_folder_and_batches_continuously(tmp_path, monkeypatch):
    """Where llama-cpp-python is installed (it builds from source: not part of any extra), the
    shipped model becomes a float32 GGUF through llama.cpp's own converter (the sdist of the
    installed version, fetched from PyPI), batch 1 gives minillm's greedy tokens, and the
    continuous-batching loop gives every request its wanted number of tokens (one sequence at a
    time: exactly the tokens it gets alone; several at once, llama.cpp's batched kernels may
    round differently, which the benchmark reports as first divergences) and frees every sequence."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python (builds llama.cpp from source)")
    from conftest import DEFAULT_MODEL

    from minillm.apps.bench import peers

    _reuse_llama_cpp_source(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    gguf = peers.llama_cpp_gguf_for(DEFAULT_MODEL)
    assert gguf.is_file() and gguf == peers.llama_cpp_gguf_for(DEFAULT_MODEL)  # converted once
    mini = peers.MinillmEngine(DEFAULT_MODEL, 1, 4096)
    lc = peers.LlamaCppEngine(gguf, 1, n_ctx=256)
    prompts = [[40 + i, 17, 300 + 2 * i, 9] * (1 + i % 3) for i in range(6)]
    wanted = [6, 3, 9, 4, 7, 5]
    alone = [lc.latency(p, n)[2] for p, n in zip(prompts, wanted)]
    assert alone == [mini.latency(p, n)[2] for p, n in zip(prompts, wanted)]
    assert lc.workload(prompts, wanted, 1)[1] == alone
    _, outs = lc.workload(prompts, wanted, 6)
    assert [len(o) for o in outs] == wanted
    batcher = lc._batchers[6]
    mem = llama_cpp.llama_get_memory(batcher.ctx)
    assert all(llama_cpp.llama_memory_seq_pos_max(mem, s) == -1 for s in range(batcher.max_seqs))


def test_llama_cpp_loads_a_byte_tokenizer_folder_with_no_merges(tiny_model, tmp_path, monkeypatch):
    """The random models' byte-level BPE has no merges; the converter then wrote no merges key
    and llama.cpp refused the file ("cannot find tokenizer merges"). Converted now with a merge
    that never fires: F32 gives minillm's greedy tokens, Q8_0 (same weights) loads and is named
    so, and a file llama.cpp cannot load is reported with llama.cpp's own reason."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python (builds llama.cpp from source)")
    from minillm.apps.bench import peers

    _reuse_llama_cpp_source(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert json.loads((tiny_model / "tokenizer.json").read_text())["model"]["merges"] == []
    f32, q8 = (peers.llama_cpp_gguf_for(tiny_model, outtype=t) for t in ("f32", "q8_0"))
    mini = peers.MinillmEngine(tiny_model, 1, 4096)
    lc, lq = peers.LlamaCppEngine(f32, 1, n_ctx=128), peers.LlamaCppEngine(q8, 1, n_ctx=128)
    assert lc.name.endswith(" F32") and lq.name.endswith(" Q8_0")
    prompt = [5, 70, 300, 2, 9, 411, 33]
    assert lc.latency(prompt, 8)[2] == mini.latency(prompt, 8)[2]
    assert len(lq.latency(prompt, 8)[2]) == 8
    assert [len(o) for o in lq.workload([prompt, prompt[:3]], [4, 3], 2)[1]] == [4, 3]  # batched, Q8_0
    with pytest.raises(ValueError, match="outtype must be one of f32, q8_0"):
        peers.llama_cpp_gguf_for(tiny_model, outtype="q4_0")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(f32.read_bytes()[:4096])  # cut short
    with pytest.raises(ValueError, match=r"Failed to load model from file: .*bad\.gguf \(.*error loading model"):
        peers.LlamaCppEngine(bad, 1, n_ctx=128)


def test_llama_cpp_types_option_names_the_allowed_types(capsys):
    from minillm.apps.bench import parse_args

    assert parse_args(["--peers", "--llama-cpp-types", "F32, q8_0"]).llama_cpp_types == ("f32", "q8_0")
    assert parse_args(["--peers"]).llama_cpp_types == ("f32",)
    with pytest.raises(SystemExit):
        parse_args(["--peers", "--llama-cpp-types", "f32,q4_0"])
    assert "--llama-cpp-types must be a comma-separated list of f32, q8_0, got ['q4_0']" in capsys.readouterr().err


def test_the_random_model_for_peers_is_built_once(tmp_path):
    """Its conversions are cached by folder (names, sizes, times): rebuilt each run, every run
    would convert it again into a new ~0.5 GB GGUF and CTranslate2 model."""
    from minillm.apps.bench import peers

    first = peers.cached_random_llama("tiny", TINY_SHAPE, cache=tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = peers.cached_random_llama("tiny", TINY_SHAPE, cache=tmp_path)
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
    assert peers._key(again) == peers._key(first)
    assert peers.cached_random_llama("tiny", TINY_SHAPE, seed=1, cache=tmp_path) != first
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".building")] == []


def test_peers_table_compares_each_minillm_variant_with_the_best_peer_only():
    """With ``--decode-graphs`` two minillm engines run; the best *peer* is chosen among the
    other engines (never the second minillm) of the same weight kind (float32 against float32,
    int8 against Q8_0) and each minillm variant gets its own ratio line."""
    from minillm.apps.bench import peers

    def spread(x):
        return {"median": x, "min": x, "max": x}

    names = ["minillm", peers.MINILLM_GRAPHS, peers.MINILLM_INT8, "CTranslate2 x fp32", "llama.cpp x F32",
             "llama.cpp x Q8_0"]
    tps = {"minillm": 100.0, peers.MINILLM_GRAPHS: 120.0, peers.MINILLM_INT8: 90.0, "CTranslate2 x fp32": 50.0,
           "llama.cpp x F32": 40.0, "llama.cpp x Q8_0": 60.0}
    tpot = {"minillm": 0.004, peers.MINILLM_GRAPHS: 0.002, peers.MINILLM_INT8: 0.003, "CTranslate2 x fp32": 0.002,
            "llama.cpp x F32": 0.001, "llama.cpp x Q8_0": 0.001}
    entry = {"engines": names, "rounds": 1, "load_average_start": [1, 1, 1], "load_average_end": [1, 1, 1],
             "latency": [{"prompt": 16, "checks": {}, "tpot": {n: spread(v) for n, v in tpot.items()}}],
             "workload": {"requests": 4, "wanted_tokens": 40, "rounds": 1, "checks": {},
                          "best_batch": {"minillm": None, peers.MINILLM_GRAPHS: None, peers.MINILLM_INT8: None,
                                         "CTranslate2 x fp32": 8, "llama.cpp x F32": 16, "llama.cpp x Q8_0": 16},
                          "tokens_per_s": {n: spread(v) for n, v in tps.items()}}}
    text = peers.peers_markdown([{"model": "m", "new_tokens": 8, "rounds": 1, "threads": {"1": entry},
                                  "peers_not_run": {}}])
    assert "minillm / the best peer (CTranslate2 x fp32) on the mixed workload: **2.00×**" in text
    assert f"{peers.MINILLM_GRAPHS} / the best peer (CTranslate2 x fp32) on the mixed workload: **2.40×**" in text
    assert f"batch-1 TPOT, {peers.MINILLM_GRAPHS} / CTranslate2 x fp32: 1.00×; llama.cpp x F32: 2.00×" in text
    # the faster Q8_0 peer is the int8 engine's best peer, never float32 minillm's
    assert f"{peers.MINILLM_INT8} / the best peer (llama.cpp x Q8_0) on the mixed workload: **1.50×**" in text
    assert "(continuous batching)" in text


def test_peers_table_without_the_mixed_workload():
    from minillm.apps.bench import peers

    spread = {"median": 0.002, "min": 0.002, "max": 0.002}
    entry = {"engines": ["minillm", "llama.cpp x F32"], "rounds": 1, "load_average_start": [1, 1, 1],
             "load_average_end": [1, 1, 1], "workload": None,
             "latency": [{"prompt": 16, "checks": {}, "tpot": {"minillm": spread, "llama.cpp x F32": spread}}]}
    text = peers.peers_markdown([{"model": "m", "new_tokens": 8, "rounds": 1, "threads": {"1": entry},
                                  "peers_not_run": {}}])
    assert "batch-1 TPOT, minillm / llama.cpp x F32: 1.00×" in text and "--workload-runs 0" in text


def test_peers_result_names_the_machine_its_bandwidth_and_cpu_time(tiny_model, monkeypatch):
    """Whatever peers are installed, the result records the CPU, the read bandwidth at each
    thread count (before and after), the weights' bytes, and CPU time beside every wall time;
    the table prints them with the weight-streaming floor."""
    from minillm.apps.bench import peers
    from minillm.apps.bench.models import param_count

    monkeypatch.setattr(peers, "available_peers", lambda: {"ctranslate2": "not installed (test)",
                                                           "llama.cpp": "not installed (test)"})
    monkeypatch.setattr("minillm.apps.bench.harness.read_bandwidth", lambda threads, **kw: 10.0 * threads)
    r = peers.bench_peers("tiny", tiny_model, threads_list=(1,), rounds=1, prompt_lens=(8,), new_tokens=5,
                          num_requests=3, log=lambda m: None, int8=True)
    m = r["machine"]
    assert m["cpu"] and m["read_gbs_start"] == {"1": 10.0} and m["read_gbs_end"] == {"1": 10.0}
    assert r["weight_bytes"] == 4 * param_count(tiny_model)
    e = r["threads"]["1"]
    row = e["latency"][0]
    assert row["cpu_per_token"]["minillm"]["median"] > 0  # this process computed those tokens
    assert e["workload"]["cpu_per_token"]["minillm"]["median"] > 0
    text = peers.peers_markdown([r])
    assert "Machine: " in text and "1 thread(s) 10.0 → 10.0" in text
    assert "CPU time per output token" in text and "Weight-streaming floor at 1 thread(s)" in text
    floor = r["weight_bytes"] / 10e9
    assert f"{floor / row['tpot']['minillm']['median']:.0%}" in text
    # int8 minillm: its tokens checked against float32 minillm's, its floor from its own bytes
    assert e["engines"] == ["minillm", peers.MINILLM_INT8] and peers.MINILLM_INT8 in row["checks"]
    own = r["weight_bytes_by_engine"][peers.MINILLM_INT8]
    assert r["weight_bytes"] / 4 < own < r["weight_bytes"] / 2  # a byte a weight, plus the scales
    assert f"{peers.MINILLM_INT8}: {1e3 * own / 10e9:.2f} ms for its" in text
    assert f"{own / 10e9 / row['tpot'][peers.MINILLM_INT8]['median']:.0%}" in text
    # the bandwidth is probed in every round too; the floor takes the best probe of the run
    assert row["read_gbs"] == [10.0]
    row["read_gbs"] = [25.0]
    text = peers.peers_markdown([r])
    assert "at 25.0 GB/s, the best of 3 probes" in text
    assert f"{r['weight_bytes'] / 25e9 / row['tpot']['minillm']['median']:.0%}" in text


def test_read_bandwidth_and_the_cpu_clock():
    import time

    from minillm.apps.bench.harness import CpuClock, read_bandwidth

    assert read_bandwidth(1, nbytes=8 << 20, repeats=2) > 0
    with CpuClock() as asleep:
        time.sleep(0.05)
    assert asleep.wall >= 0.05 and asleep.cpu < asleep.wall  # sleeping costs no CPU
    with CpuClock() as busy:
        sum(i * i for i in range(200_000))
    assert busy.cpu > 0
