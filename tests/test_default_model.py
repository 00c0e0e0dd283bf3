"""The model shipped inside the package: loads offline, tells stories, ends them with EOS,
and gives the same greedy tokens through minillm as through transformers."""

from __future__ import annotations

import math
import re
import os
import subprocess
import sys

import pytest
import torch

from minillm import SamplingParams, StopReason
from conftest import DEFAULT_MODEL, REPO

PROMPTS = [
    "Once upon a time", "One day, Mia went to the beach", "The little robot", "Once upon a time, there was a fox named",
    "Long ago, in a small village", "Tom found a red ball", "There was a happy dog", "The sun was warm and",
    "Lily and her cat", "In the forest, a tiny bird",
]


@pytest.fixture(scope="module")
def llm(default_llm_factory):
    return default_llm_factory()


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(DEFAULT_MODEL), dtype=torch.float32).eval()


def test_checkpoint_is_standard_and_small():
    names = {p.name for p in DEFAULT_MODEL.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", "README.md"} <= names
    size = sum(p.stat().st_size for p in DEFAULT_MODEL.iterdir() if p.is_file())
    assert size <= 20 * 2**20


def test_llm_with_no_argument_loads_it(llm):
    assert llm.model_path == DEFAULT_MODEL
    assert llm.model_config.architecture == "LlamaForCausalLM"


def test_greedy_story_ends_with_eos(llm):
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=200, temperature=0))[0]
    assert out.stop_reason == StopReason.EOS, out.text
    words = out.text.split()
    assert len(words) > 20 and out.text.rstrip()[-1] in ".!?\"'"
    # the incrementally detokenised text equals decoding all the tokens at once
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_sampled_stories_end_with_eos(llm):
    params = [SamplingParams(max_tokens=256, temperature=0.8, seed=s) for s in range(50)]
    outs = llm.generate(["Once upon a time"] * 50, params)
    eos = sum(o.stop_reason == StopReason.EOS for o in outs)
    assert eos >= 45, f"only {eos}/50 ended with EOS"
    assert len({tuple(o.token_ids) for o in outs}) > 40  # seeds give different stories


def test_next_token_distribution_has_real_choices(llm):
    logits = llm.next_token_logits("Once upon a time, there was a little")
    p = logits.softmax(-1)
    entropy_bits = -(p * p.clamp_min(1e-30).log2()).sum().item()
    assert entropy_bits > 1.0
    assert (p > 0.02).sum().item() >= 5  # several plausible words, not one


def test_prompts_matter(llm):
    outs = llm.generate(PROMPTS[:4], SamplingParams(max_tokens=120, temperature=0))
    assert len({o.text for o in outs}) == 4


def assert_greedy_matches_transformers(llm, hf_model, prompts, max_new_tokens=60):
    tok = llm.tokenizer
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        ours = llm.generate([prompt], SamplingParams(max_tokens=max_new_tokens, temperature=0))[0].token_ids
        assert ours == ref[0, ids.shape[1]:].tolist(), prompt


def test_greedy_matches_transformers_generate(llm, hf_model):
    assert_greedy_matches_transformers(llm, hf_model, PROMPTS)


def test_logits_match_transformers(llm, hf_model):
    ids = llm.tokenizer.encode("Once upon a time, there was a little fox who liked to run.")
    ref = hf_model(torch.tensor([ids])).logits[0]
    assert (ref - llm.model.full_logits(ids)).abs().max().item() < 1e-4


def test_cli_generate_offline():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "minillm.apps.cli", "generate", "Once upon a time", "--max-tokens", "30",
                          "--temperature", "0.8", "--seed", "3"], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Once upon a time")
    assert "stop reason:" in out.stdout and "TTFT:" in out.stdout and "TPOT:" in out.stdout


def test_cli_bad_input_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "minillm.apps.cli", "generate", "hi", "--temperature", "-1"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2 and "temperature" in out.stderr and "Traceback" not in out.stderr


def test_entropy_is_measured_not_assumed(llm):
    """A check of the check: a confident context has low entropy, so the test above can fail."""
    ids = llm.tokenizer.encode("Once upon a")
    p = llm.next_token_logits(ids).softmax(-1)
    assert -(p * p.clamp_min(1e-30).log2()).sum().item() < 2.0 and not math.isnan(p.sum().item())


# --- Chinese (issue 14): the same model reads and writes Chinese short stories -----------------------

ZH_PROMPTS = ["从前有一只小狐狸，它", "从前，有一个叫小明的男孩", "有一天，小兔子在森林里", "天空很蓝，",
              "小猫和它的好朋友", "很久很久以前，在一个小村子里"]
_HAN = re.compile(r"[\u4e00-\u9fff]")
_LATIN = re.compile(r"[A-Za-z]")


def _is_chinese(text: str) -> bool:
    return bool(_HAN.search(text)) and not _LATIN.search(text)


def test_chinese_prompt_tokens_are_characters_not_bytes(llm):
    """The issue's prompt: no byte-fallback pieces, every token shows as real text (the stepper
    displays each token's own text, so a partial UTF-8 byte would show as U+FFFD)."""
    ids = llm.tokenizer.encode("从前有一只小狐狸，它", add_special_tokens=False)
    assert len(ids) <= len("从前有一只小狐狸，它")
    pieces = [llm.tokenizer.decode([i]) for i in ids]
    assert all("\ufffd" not in p for p in pieces), pieces
    assert "".join(pieces) == "从前有一只小狐狸，它"


def test_chinese_sentence_of_n_characters_is_at_most_n_tokens(llm):
    sys.path.insert(0, str(REPO / "scripts"))
    from story_corpus_zh import generate_stories_zh

    sentences = set()
    for story in generate_stories_zh(30, seed=4242):  # a seed the model was not trained on
        sentences.update(s + "。" for s in story.split("。") if s.strip())
    sentences.update(["从前有一只小狐狸，它很喜欢跑步。", "今天天气很好，我们去公园玩吧！", "小明找到了一个红色的球。"])
    worst = max(sentences, key=lambda s: len(llm.tokenizer.encode(s, add_special_tokens=False)) / len(s))
    for s in sentences:
        n = len(llm.tokenizer.encode(s, add_special_tokens=False))
        assert n <= len(s), f"{s!r}: {n} tokens for {len(s)} characters (worst: {worst!r})"


def test_chinese_next_token_distribution_has_real_choices(llm):
    for prompt in ("从前有一只小狐狸，它", "从前，有一个叫小明的男孩"):
        p = llm.next_token_logits(prompt).softmax(-1)
        entropy_bits = -(p * p.clamp_min(1e-30).log2()).sum().item()
        assert entropy_bits > 1.0, (prompt, entropy_bits)
        assert (p > 0.02).sum().item() >= 3, prompt


def test_greedy_chinese_story_ends_with_eos(llm):
    out = llm.generate(["从前有一只小狐狸，它"], SamplingParams(max_tokens=300, temperature=0))[0]
    assert out.stop_reason == StopReason.EOS, out.text
    assert _is_chinese(out.text) and len(out.text) > 40, out.text
    assert out.text.rstrip()[-1] in "。！？”", out.text
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_sampled_chinese_stories_end_with_eos_in_chinese(llm):
    params = [SamplingParams(max_tokens=300, temperature=0.8, seed=s) for s in range(50)]
    outs = llm.generate(["从前有一只小狐狸，它"] * 50, params)
    eos = sum(o.stop_reason == StopReason.EOS for o in outs)
    chinese = sum(_is_chinese(o.text) for o in outs)
    assert eos >= 45, f"only {eos}/50 Chinese stories ended with EOS"
    assert chinese >= 45, f"only {chinese}/50 stayed in Chinese"
    assert len({tuple(o.token_ids) for o in outs}) > 40


def test_sampled_english_stories_stay_english(llm):
    params = [SamplingParams(max_tokens=256, temperature=0.8, seed=s) for s in range(50)]
    outs = llm.generate(["Once upon a time"] * 50, params)
    english = sum(not _HAN.search(o.text) for o in outs)
    assert english >= 45, f"only {english}/50 English stories stayed English"


def test_chinese_prompts_matter_and_match_transformers(llm, hf_model):
    outs = llm.generate(ZH_PROMPTS[:4], SamplingParams(max_tokens=80, temperature=0))
    assert len({o.text for o in outs}) == 4
    assert_greedy_matches_transformers(llm, hf_model, ZH_PROMPTS)
