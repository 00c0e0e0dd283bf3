"""LLM(num_threads=...): torch's CPU thread count, chosen from the model size by default."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM
from minillm.engine_args import PARAMS_PER_THREAD, default_num_threads

CPU = torch.device("cpu")


@pytest.fixture
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_default_grows_with_the_model_and_stops_at_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert default_num_threads(3_400_000, CPU, cores=16) == 1          # the shipped model
    assert default_num_threads(135_000_000, CPU, cores=16) == 2        # SmolLM2-135M
    assert default_num_threads(135_000_000, CPU, cores=1) == 1
    assert default_num_threads(8_000_000_000, CPU, cores=16) == 16
    assert default_num_threads(PARAMS_PER_THREAD * 3, CPU, cores=8) == 3
    assert default_num_threads(10**9, torch.device("cuda")) is None    # kernels, not host threads


def test_an_explicit_environment_choice_is_left_alone(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_num_threads(10**9, CPU, cores=16) is None


def test_llm_sets_the_thread_count(tiny_llama, keep_threads, monkeypatch):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=16, num_threads=2)
    assert llm.num_threads == 2 and torch.get_num_threads() == 2
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=16)  # a tiny model: one thread
    assert llm.num_threads == 1 and torch.get_num_threads() == 1


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True])
def test_bad_num_threads_names_the_option(tiny_llama, bad):
    with pytest.raises(ValueError, match="num_threads"):
        LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=16, num_threads=bad)


def test_bench_threads_flag_is_checked():
    from minillm.apps.bench import parse_args

    assert parse_args(["--threads", "2"]).threads == 2
    with pytest.raises(SystemExit):
        parse_args(["--threads", "0"])
