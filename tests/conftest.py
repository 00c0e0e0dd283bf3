"""Shared fixtures: tiny random Llama / Qwen2 / Qwen3 checkpoints made with transformers.

Each is saved with ``save_pretrained`` (safetensors + config.json) next to a small
byte-level BPE tokenizer, exactly the kind of folder a learner would point ``LLM`` at.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

# One torch (OpenMP) thread in the test processes and in everything they start (servers, scripts,
# kernels), unless the caller chose: the suite runs two workers on two cores, and a 2-thread OpenMP
# team whose partner thread is descheduled spins at every op's barrier. A tiny Llama's forward, 300
# times on a busy 2-core machine: 0.36 CPU-s with one thread, 5.0 CPU-s with two. Tests about
# threads set their count themselves (num_threads=2, torch.set_num_threads, monkeypatch.delenv).
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402 - after OMP_NUM_THREADS, which torch reads once

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")
# `minillm grade` jails a submission's code (bubblewrap, else unshare) and refuses where neither works.
# A CI runner without user namespaces still runs the grading tests, in the weaker mode; the tests of the
# jail itself skip there (tests/test_grading_isolation.py), and the refusal is tested with this unset.
os.environ.setdefault("MINILLM_GRADE_UNJAILED", "1")
warnings.filterwarnings("ignore", category=UserWarning)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "minillm" / "assets" / "stories-3m"

_CORPUS = [
    "Once upon a time there was a little fox who lived in a green forest near a river.",
    "The robot found a shiny key under the old bridge and smiled at the moon.",
    "Mia and her dog ran to the beach, where the waves were big and blue.",
    "A small bird sang a happy song every morning in the garden.",
] * 20


def make_tokenizer(folder: Path, vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    return fast


def make_model(folder: Path, family: str, **overrides):
    """Save a random model of ``family`` (llama, llama3rope, qwen2, qwen3) into ``folder``."""
    import transformers as tf

    torch.manual_seed(1234)
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=0, eos_token_id=1, pad_token_id=1)
    if family.startswith("qwen"):
        # transformers' Qwen tokenizers add <|endoftext|> as the next id (320): the vocabulary must hold it,
        # or the loader rightly refuses a tokenizer that can emit ids >= vocab_size
        common["vocab_size"] = 336
    common.update(overrides)
    if family == "llama":
        cfg = tf.LlamaConfig(**common)
        model = tf.LlamaForCausalLM(cfg)
    elif family == "llama3rope":
        cfg = tf.LlamaConfig(rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64},
                             tie_word_embeddings=True, **common)
        model = tf.LlamaForCausalLM(cfg)
    elif family == "qwen2":
        cfg = tf.Qwen2Config(**common)
        model = tf.Qwen2ForCausalLM(cfg)
    elif family == "qwen3":
        cfg = tf.Qwen3Config(head_dim=24, **common)  # head_dim != hidden / heads on purpose
        model = tf.Qwen3ForCausalLM(cfg)
    else:
        raise ValueError(family)
    # random init gives near-flat logits; a larger scale makes greedy choices clear-cut
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
            else:  # norm weights: not all ones, so a wrongly applied norm shows up
                p.uniform_(0.8, 1.2)
    model.eval()
    model.save_pretrained(folder)
    make_tokenizer(folder)
    return model


# --- where the engine runs in the parity tests ---------------------------------------------
# CPU float32 by default; MINILLM_TEST_DEVICE=cuda runs the engine of tests/test_parity.py on CUDA
# in the dtype dtype="auto" picks there (bfloat16 where the GPU has it natively, float16 on older
# ones such as a T4; MINILLM_TEST_DTYPE overrides), against the same float32 CPU reference, with
# looser tolerances, over the attention backends CUDA runs (not the CPU-only "kernel").
TEST_DEVICE = os.environ.get("MINILLM_TEST_DEVICE", "cpu")
#: max |logit difference| to the float32 reference, per engine dtype (bf16 keeps 8 mantissa bits)
LOGITS_ATOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}


def backends_on_test_device() -> list[str]:
    """The attention backends the engine can run on ``TEST_DEVICE`` (the parity tests
    parametrise over these): on CUDA not the CPU-only "kernel", which would refuse the engine."""
    from minillm.fast.attention import backends_for

    return sorted(backends_for(TEST_DEVICE, getattr(torch, engine_dtype_name(TEST_DEVICE))))


def engine_dtype_name(device: str) -> str:
    """MINILLM_TEST_DTYPE, else what the engine's dtype="auto" picks on ``device``."""
    from minillm.engine_args import auto_dtype

    auto = str(auto_dtype(torch.device(device))).removeprefix("torch.")
    return os.environ.get("MINILLM_TEST_DTYPE", auto)


@pytest.fixture(scope="session")
def device() -> str:
    if TEST_DEVICE.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"MINILLM_TEST_DEVICE={TEST_DEVICE} but CUDA is not available")
    return TEST_DEVICE


@pytest.fixture(scope="session")
def dtype(device) -> str:
    return engine_dtype_name(device)


@pytest.fixture(scope="session")
def logits_atol(dtype) -> float:
    return LOGITS_ATOL[dtype]


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory):
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            folder = tmp_path_factory.mktemp(family)
            cache[family] = (folder, make_model(folder, family))
        return cache[family]

    return get


@pytest.fixture(scope="session")
def tiny_llama(model_factory):
    """(folder, transformers model) of a random 2-layer Llama."""
    return model_factory("llama")


@pytest.fixture
def tiny_llm(tiny_llama):
    from minillm import LLM

    return LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64)


@pytest.fixture(scope="session")
def default_llm_factory():
    from minillm import LLM

    if not (DEFAULT_MODEL / "model.safetensors").is_file():
        pytest.fail("the shipped default model is missing from minillm/assets/stories-3m")
    return LLM


def run_to_end(llm, max_steps: int = 10_000):
    for _ in range(max_steps):
        if not llm.has_unfinished():
            return
        llm.step()
    raise AssertionError("engine did not finish")


def greedy_tokens(llm, prompts: list[list[int]], n: int = 8) -> list[list[int]]:
    """The tokens ``llm`` decodes greedily for each prompt (token ids), ``n`` each, all in one batch."""
    from minillm import SamplingParams

    reqs = [llm.add_request(prompt_token_ids=p, params=SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
            for p in prompts]
    run_to_end(llm)
    return [r.output_token_ids for r in reqs]


def copy_of(tiny_llama, tmp_path: Path, name: str = "m") -> Path:
    """A copy of the tiny model's folder to break or edit."""
    return Path(shutil.copytree(tiny_llama[0], tmp_path / name))


def edit_config(folder: Path, **changes) -> None:
    """Set fields of ``folder``'s config.json."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def record_logits(llm) -> list:
    """Every step's logits as the runner returns them (copies), appended as the engine steps;
    ``del llm.runner.run`` stops recording."""
    seen, run = [], llm.runner.run

    def run_and_keep(*args, **kwargs):
        logits = run(*args, **kwargs)
        seen.append(logits.detach().clone())
        return logits

    llm.runner.run = run_and_keep
    return seen


def check_block_invariants(llm):
    """Blocks in use == blocks held by requests, each block's refcount == number of holders."""
    alloc = llm.kv_cache.allocator
    holders: dict[int, int] = {}
    for req in llm.requests.values():
        assert len(set(req.block_table)) == len(req.block_table), f"{req} holds a block twice"
        if req.state.value == "RELEASED":
            assert not req.block_table, f"released request {req.request_id} still holds blocks"
        for b in req.block_table:
            holders[b] = holders.get(b, 0) + 1
    assert alloc.num_used == len(holders), (alloc.num_used, holders)
    for b in range(alloc.num_blocks):
        assert alloc.ref_count[b] == holders.get(b, 0), (b, alloc.ref_count[b], holders.get(b, 0))
    assert alloc.num_used + alloc.num_free == alloc.num_blocks
    alloc.check_invariants()  # free list, hash index and counters agree with each other


def load_script(name: str):
    """``scripts/<name>.py`` as a module (the repo-only tools are not in the package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_in_thread(coro):
    """``asyncio.run(coro)`` in a thread of its own: the browser tests' Playwright keeps an event
    loop running in the main thread for the whole session (and a worker may run other files after
    them), where ``asyncio.run`` refuses to start."""
    import asyncio
    import threading

    box = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target, name="run_async")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def run_async():
    """``run_in_thread`` as a fixture."""
    return run_in_thread


# The files a developer's quick loop (`bash scripts/test.sh -m "not slow"`) leaves to the full run:
# a real browser, notebook executions, torch.compile and the 93 MB GGUF model.
SLOW_FILES = ("browser/", "test_notebooks_rerun", "test_compile.py", "test_decode_graphs.py", "test_gguf.py",
              "test_flex_compiled.py", "test_gpu_check.py",
              "test_grading_notebook.py")
# ... and single tests of other files that compile graphs or start a real JupyterLab
SLOW_TESTS = ("test_interrupt.py::test_real_sigint_at_random_moments_never_changes_an_output[compile-",
              "test_cpu_kernel.py::test_compiled_decode_graphs_call_the_kernel_operator",
              "test_lab.py::test_minillm_lab_starts_answers_and_stops")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(Path(str(item.fspath)).relative_to(REPO)) if str(item.fspath).startswith(str(REPO)) else ""
        if (path.endswith(".ipynb") or any(part in path for part in SLOW_FILES)
                or any(t in item.nodeid for t in SLOW_TESTS)):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with the heaviest files handed out first (tests/suite_order.py), so the two
    workers of scripts/test.sh finish together instead of one waiting on a notebook file."""
    if config.getoption("dist") != "loadfile":
        return None
    from suite_order import HeaviestFileFirst

    return HeaviestFileFirst(config, log)
