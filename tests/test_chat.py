"""Chat: a conversation becomes prompt ids with exactly one BOS; ``minillm chat`` streams
replies, keeps the history, and Ctrl-C cancels a reply in the engine (blocks freed)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from minillm import LLM, SamplingParams
from minillm.chat import FALLBACK_CHAT_TEMPLATE, encode_conversation, render_conversation, validate_messages
from minillm.apps.chat_repl import FALLBACK_NOTICE, fit_conversation, run_chat
from minillm.request import StopReason

LLAMA3_STYLE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture
def tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama[0]))


def _adds_bos(tokenizer):
    """Make the tokenizer add BOS itself, as Llama's does."""
    from tokenizers.processors import TemplateProcessing

    tokenizer._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    assert tokenizer.encode("hi")[0] == 0
    return tokenizer


def test_template_that_writes_bos_gives_one_bos(tokenizer):
    tokenizer = _adds_bos(tokenizer)
    tokenizer.chat_template = LLAMA3_STYLE
    conv = [{"role": "user", "content": "hi there"}]
    ids = encode_conversation(tokenizer, conv)
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    # the trap: encoding the rendered text the ordinary way gives two
    assert tokenizer.encode(render_conversation(tokenizer, conv))[:2] == [0, 0]
    assert tokenizer.decode(ids).endswith("<|assistant|>")


def test_template_without_bos_gets_the_one_the_tokenizer_wants(tokenizer):
    tokenizer = _adds_bos(tokenizer)
    tokenizer.chat_template = LLAMA3_STYLE.replace("{{ bos_token }}", "")
    ids = encode_conversation(tokenizer, [{"role": "user", "content": "hi"}])
    assert ids[0] == 0 and ids.count(0) == 1


def test_no_bos_when_the_tokenizer_adds_none(tokenizer):
    tokenizer.chat_template = LLAMA3_STYLE.replace("{{ bos_token }}", "")
    assert tokenizer.encode("hi")[0] != 0
    assert 0 not in encode_conversation(tokenizer, [{"role": "user", "content": "hi"}])


def test_fallback_template_for_a_model_without_one(tokenizer):
    assert not tokenizer.chat_template
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a fox"}]
    assert render_conversation(tokenizer, conv) == "system: Be brief.\nuser: a fox\nassistant:"
    assert render_conversation(tokenizer, conv, add_generation_prompt=False) == "system: Be brief.\nuser: a fox\n"
    assert "messages" in FALLBACK_CHAT_TEMPLATE


@pytest.mark.parametrize("messages,message", [
    ([], "non-empty list"), ("hello", "non-empty list"), ([{"role": "user"}], r"messages\[0\]"),
    ([{"role": "robot", "content": "x"}], r"messages\[0\]\['role'\] must be one of"),
    ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\] must be a string"),
])
def test_bad_conversations_are_named(messages, message):
    with pytest.raises(ValueError, match=message):
        validate_messages(messages)


def test_fit_conversation_drops_oldest_turns_keeps_system(tokenizer):
    conv = [{"role": "system", "content": "S"}]
    for i in range(6):
        conv += [{"role": "user", "content": f"question {i} about the fox"},
                 {"role": "assistant", "content": f"answer {i} about the river"}]
    conv.append({"role": "user", "content": "last one"})
    full = encode_conversation(tokenizer, conv)
    kept, ids = fit_conversation(tokenizer, conv, len(full) // 2)
    assert kept[0]["role"] == "system" and kept[-1]["content"] == "last one"
    assert len(ids) < len(full) // 2 and len(kept) < len(conv)
    with pytest.raises(ValueError, match="this message alone"):
        fit_conversation(tokenizer, [{"role": "user", "content": "fox " * 50}], 10)


# --- the terminal loop ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    return LLM(None, device="cpu", num_kv_blocks=64, block_size=16)


def lines(*items):
    it = iter(items)

    def read(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    return read


def test_chat_loop_streams_and_keeps_history(shipped):
    out = io.StringIO()
    seen_prompts = []
    real_add = shipped.add_request

    def spy(*args, **kwargs):
        seen_prompts.append(kwargs["prompt_token_ids"])
        return real_add(*args, **kwargs)

    shipped.add_request = spy
    try:
        rc = run_chat(shipped, SamplingParams(max_tokens=8, temperature=0), lines("Once upon a time", "", "The fox"),
                      out)
    finally:
        del shipped.add_request
    text = out.getvalue()
    assert rc == 0
    assert text.startswith(FALLBACK_NOTICE)
    assert text.count("assistant> ") == 2
    assert len(seen_prompts) == 2
    second = shipped.tokenizer.decode(seen_prompts[1])
    assert "user: Once upon a time\nassistant:" in second and second.endswith("user: The fox\nassistant:")
    assert shipped.cache_stats().used_blocks == 0


def test_ctrl_c_during_a_reply_cancels_it_in_the_engine(shipped):
    out = io.StringIO()
    real_step, calls, cancelled = shipped.step, [0], []

    def step():
        calls[0] += 1
        if calls[0] == 3:  # in the middle of the first reply
            cancelled.extend(r for r in shipped.requests.values() if r.is_live)
            raise KeyboardInterrupt
        return real_step()

    shipped.step = step
    try:
        rc = run_chat(shipped, SamplingParams(max_tokens=10, temperature=0), lines("Once upon a time", "The fox"), out)
    finally:
        del shipped.step
    assert rc == 0
    text = out.getvalue()
    assert "[stopped]" in text and "that turn was dropped" in text
    assert len(cancelled) == 1 and cancelled[0].stop_reason == StopReason.CANCELLED
    assert shipped.cache_stats().used_blocks == 0
    assert text.count("assistant> ") == 2 and not shipped.has_unfinished()


def test_slash_commands(shipped):
    out = io.StringIO()
    assert run_chat(shipped, SamplingParams(max_tokens=3, temperature=0), lines("/reset", "/exit", "never read"),
                    out) == 0
    assert "(conversation forgotten)" in out.getvalue() and "assistant> " not in out.getvalue()


def test_minillm_chat_with_piped_stdin():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "minillm", "chat", "--max-tokens", "6", "--temperature", "0",
                          "--device", "cpu"], input="Once upon a time\n/exit\n", capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert FALLBACK_NOTICE in run.stdout
    reply = run.stdout.split("assistant> ", 1)[1].split("\n", 1)[0]
    assert reply.strip()


def test_minillm_chat_bad_option_is_an_error_not_a_traceback():
    run = subprocess.run([sys.executable, "-m", "minillm", "chat", "--temperature", "-1"], input="",
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 2 and "minillm chat: error:" in run.stderr and "temperature" in run.stderr
