"""IncrementalDetokenizer: the streamed text equals decode(prompt + output) - decode(prompt)
for SentencePiece-style (Metaspace, and Llama-2's byte-fallback decoder), byte-level BPE and
the shipped model's tokenizer; multi-byte characters appear only once complete; stop
strings and stop-token text follow vLLM's meaning."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from minillm import SamplingParams
from minillm.detokenizer import PROMPT_WINDOW, IncrementalDetokenizer, decoder_for, find_stop
from conftest import DEFAULT_MODEL, _CORPUS, make_tokenizer

UTF8_TEXT = "你好，世界！ Emoji 👋🏽 and a family 👩\u200d👩\u200d👧 café ñ"
UNSEEN = " 🦊猫"  # not in any training text: byte tokens in every family that has them


def _metaspace_tokenizer():
    """SentencePiece-style (Metaspace pre-tokenizer and decoder, as TinyLlama's current
    tokenizer.json): the decoder strips the leading space of the first token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(_CORPUS + [UTF8_TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _llama2_tokenizer():
    """Llama-2's legacy layout: no pre-tokenizer, spaces -> '▁' in the normalizer, byte
    fallback tokens <0x00>..<0xFF>, decoder Replace + ByteFallback + Fuse + Strip(1 left)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    data = json.loads(_metaspace_tokenizer().backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    data["model"]["byte_fallback"] = True
    data["pre_tokenizer"] = None
    data["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    data["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    tok = Tokenizer.from_str(json.dumps(data))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _shipped_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))


@pytest.fixture(scope="module")
def tokenizers_by_family(tmp_path_factory):
    return {
        "metaspace": _metaspace_tokenizer(),
        "llama2": _llama2_tokenizer(),
        "byte_bpe": make_tokenizer(tmp_path_factory.mktemp("bbpe")),
        "shipped": _shipped_tokenizer(),
    }


FAMILIES = ["metaspace", "llama2", "byte_bpe", "shipped"]


def split_ids(tok, prompt_text, continuation):
    """Prompt ids and the output ids that continue them, from one encoding of the whole text
    (so a SentencePiece tokenizer spells the continuation's spaces as it would in a stream)."""
    prompt = tok.encode(prompt_text, add_special_tokens=False)
    full = tok.encode(prompt_text + continuation, add_special_tokens=False)
    assert full[:len(prompt)] == prompt
    return prompt, full[len(prompt):]


def reference(tok, prompt_ids, output_ids, skip=True):
    return tok.decode(prompt_ids + output_ids, skip_special_tokens=skip)[
        len(tok.decode(prompt_ids, skip_special_tokens=skip)):]


def stream(tok, prompt_ids, output_ids, params=None, hidden_last=False, finish=True):
    """Feed the output ids one by one (then ``finish``, as the engine does at the end);
    returns the detokenizer and the text after each token."""
    d = IncrementalDetokenizer(tok, prompt_ids, params or SamplingParams())
    seen = []
    for i, t in enumerate(output_ids):
        d.update(t, hidden=hidden_last and i == len(output_ids) - 1)
        seen.append(d.text)
    if finish:
        d.finish()
        seen.append(d.text)
    return d, seen


# --- the families ---------------------------------------------------------------------------
def test_sentencepiece_keeps_the_continuations_leading_space(tokenizers_by_family):
    for name in ("metaspace", "llama2"):
        tok = tokenizers_by_family[name]
        prompt, out = split_ids(tok, "Once upon a time", " there was a fox")
        assert tok.decode(out) == "there was a fox", name  # decoded alone, the space is lost
        d, _ = stream(tok, prompt, out)
        assert d.text == " there was a fox", name
        assert d.text == reference(tok, prompt, out)


@pytest.mark.parametrize("family", FAMILIES)
def test_utf8_streaming_matches_transformers_and_never_shows_half_a_character(tokenizers_by_family, family):
    tok = tokenizers_by_family[family]
    text = UTF8_TEXT if family == "metaspace" else UTF8_TEXT + UNSEEN  # metaspace: no byte tokens
    prompt, out = split_ids(tok, "Once upon a time", " " + text)
    d, seen = stream(tok, prompt, out)
    assert d.text == reference(tok, prompt, out)
    assert d.text.strip() == text.strip()  # every character, the ZWJ family included
    assert all("\ufffd" not in s for s in seen)
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))  # text only grows
    if family != "metaspace":  # multi-byte characters are split over byte tokens there
        assert any(a == b for a, b in zip(seen, seen[1:])), "some token should have been held back"


@pytest.mark.parametrize("family", ["llama2", "byte_bpe", "shipped"])
def test_a_request_ending_mid_character_shows_no_partial_character(tokenizers_by_family, family):
    tok = tokenizers_by_family[family]
    prompt, out = split_ids(tok, "Once upon a time", " 🦊")
    cut = out[:-1]  # stops before the emoji's last byte token
    d, _ = stream(tok, prompt, cut)
    full = reference(tok, prompt, cut)
    assert full.endswith("\ufffd") and "\ufffd" not in d.text
    assert full.startswith(d.text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("family", FAMILIES)
def test_text_equals_decode_of_all_minus_decode_of_prompt(tokenizers_by_family, family, data):
    tok = tokenizers_by_family[family]
    words = st.sampled_from(["Once", "upon", "a", "time", "fox", "river", "你好", "👩\u200d👧", "café", "the", ".",
                             "🦊", "猫"])
    # the prompt ends in a plain word: a prompt ending mid-character has no well-defined
    # "decode(prompt + output) - decode(prompt)"
    prompt_text = " ".join(data.draw(st.lists(words, min_size=0, max_size=8)) + ["fox"])
    prompt = tok.encode(prompt_text)
    vocab = len(tok)
    output = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12))
    skip = data.draw(st.booleans())
    d, seen = stream(tok, prompt, output, SamplingParams(skip_special_tokens=skip))
    ref = reference(tok, prompt, output, skip)
    assert all(ref.startswith(s) for s in seen), (seen, ref)  # never shows text it later takes back
    assert d.text == ref.rstrip("\ufffd")  # all of it, but for an incomplete character at the end


# --- stop strings and stop tokens -----------------------------------------------------------
@pytest.mark.parametrize("family", ["metaspace", "byte_bpe", "shipped"])
def test_stop_string_split_across_tokens(tokenizers_by_family, family):
    tok = tokenizers_by_family[family]
    prompt, out = split_ids(tok, "Once upon a", " time there was a fox")
    for include, expected in ((False, " time the"), (True, " time there wa")):
        params = SamplingParams(stop=["zzz", "re wa"], include_stop_str_in_output=include)
        d = IncrementalDetokenizer(tok, prompt, params)
        hits = [d.update(t) for t in out]
        assert hits.count(True) == 1
        assert d.text == expected and d.stop_string == "re wa"
        # True exactly on the token that completed the stop string
        at = hits.index(True)
        assert "re wa" in reference(tok, prompt, out[:at + 1]) and "re wa" not in reference(tok, prompt, out[:at])
        assert d.stable_text == d.text


def test_earliest_stop_string_wins():
    assert find_stop("abcdef", ["de", "bc"]) == (1, "bc")
    assert find_stop("abcdef", ["b", "bcd"]) == (1, "bcd")
    assert find_stop("abc", ["x"]) == (-1, None)


def test_stable_text_holds_back_a_possible_stop_string(tokenizers_by_family):
    tok = tokenizers_by_family["byte_bpe"]
    prompt = tok.encode("Once upon a", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["the end"]))
    for t in tok.encode(" time the", add_special_tokens=False):
        d.update(t)
    assert d.text == " time the" and d.stable_text == " ti"


def test_stop_token_text_is_hidden_unless_included(tokenizers_by_family):
    tok = tokenizers_by_family["byte_bpe"]
    prompt, out = split_ids(tok, "Once upon a", " time there")
    fox = tok.encode(" a", add_special_tokens=False)
    assert len(fox) == 1
    d, _ = stream(tok, prompt, out + fox, SamplingParams(stop_token_ids=fox), hidden_last=True)
    assert d.text == " time there"
    d, _ = stream(tok, prompt, out + fox, SamplingParams(stop_token_ids=fox, include_stop_str_in_output=True),
                  hidden_last=True)
    assert d.text == " time there a"


def test_special_tokens_follow_skip_special_tokens(tokenizers_by_family):
    tok = tokenizers_by_family["shipped"]
    prompt = tok.encode("Once upon a time")
    out = tok.encode(" there", add_special_tokens=False)
    eos = tok.eos_token_id
    shown, _ = stream(tok, prompt, out + [eos], SamplingParams(skip_special_tokens=False))
    assert shown.text == " there" + tok.eos_token
    skipped, _ = stream(tok, prompt, out + [eos])
    assert skipped.text == " there"
    hidden, _ = stream(tok, prompt, out + [eos], SamplingParams(skip_special_tokens=False), hidden_last=True)
    assert hidden.text == " there"


def test_updates_after_a_stop_string_are_ignored(tokenizers_by_family):
    tok = tokenizers_by_family["byte_bpe"]
    d = IncrementalDetokenizer(tok, tok.encode("a"), SamplingParams(stop="fox"))
    for t in tok.encode(" fox and more", add_special_tokens=False):
        d.update(t)
    assert d.text == " " and d.stopped


def test_long_outputs_keep_a_bounded_window(tokenizers_by_family):
    tok = tokenizers_by_family["shipped"]
    prompt = tok.encode("Once upon a time")
    out = tok.encode(" " + " ".join(_CORPUS[:8]), add_special_tokens=False)
    d, _ = stream(tok, prompt, out)
    assert d.text == reference(tok, prompt, out)
    assert len(d._ids) < 64 + 2 * PROMPT_WINDOW + 8


# --- the decode function ----------------------------------------------------------------------
def test_fast_path_goes_to_the_backend_only_when_it_is_the_same_function(tokenizers_by_family):
    from transformers import PreTrainedTokenizerFast

    tok = tokenizers_by_family["shipped"]
    ids = tok.encode("Once upon a time " + UTF8_TEXT)
    fast = decoder_for(tok)
    assert fast(ids, True) == tok.decode(ids, skip_special_tokens=True)
    assert fast(ids, False) == tok.decode(ids, skip_special_tokens=False)
    assert fast.__code__.co_names == ("decode",) and "backend" in fast.__code__.co_freevars

    class Shouting(PreTrainedTokenizerFast):
        def decode(self, token_ids, skip_special_tokens=False, **kw):
            return super().decode(token_ids, skip_special_tokens=skip_special_tokens, **kw).upper()

    loud = Shouting(tokenizer_object=tok.backend_tokenizer, bos_token="<|bos|>", eos_token="<|eos|>")
    prompt = loud.encode("Once upon a")
    d, _ = stream(loud, prompt, loud.encode(" time", add_special_tokens=False))
    assert d.text == " TIME"

    tidy = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, clean_up_tokenization_spaces=True)
    assert "backend" not in decoder_for(tidy).__code__.co_freevars
    bare = tok.backend_tokenizer
    assert decoder_for(bare)(ids, True) == tok.decode(ids, skip_special_tokens=True)


# --- through the engine -------------------------------------------------------------------------
def test_engine_text_is_decode_of_prompt_and_output_minus_prompt(default_llm_factory):
    llm = default_llm_factory(str(DEFAULT_MODEL), block_size=8, num_kv_blocks=64)
    tok = llm.tokenizer
    prompts = ["Once upon a time", "小猫", "The robot found"]
    for params in (SamplingParams(max_tokens=24, temperature=0), SamplingParams(max_tokens=24, seed=3)):
        for out in llm.generate(prompts, params):
            assert out.text == reference(tok, out.prompt_token_ids, out.token_ids).rstrip("\ufffd")


def test_engine_hides_a_stop_tokens_text_unless_asked(tiny_llm):
    tok = tiny_llm.tokenizer
    base = dict(max_tokens=8, temperature=0, ignore_eos=True)
    free = tiny_llm.generate(["the fox"], SamplingParams(**base))[0]
    specials = set(tok.all_special_ids)
    prompt = free.prompt_token_ids
    visible = lambda n: reference(tok, prompt, free.token_ids[:n]).rstrip("\ufffd")  # noqa: E731
    at = next(i for i, t in enumerate(free.token_ids) if i > 0 and t not in specials
              and t not in free.token_ids[:i] and visible(i + 1) != visible(i))  # its text shows
    stop_id = free.token_ids[at]
    hidden = tiny_llm.generate(["the fox"], SamplingParams(stop_token_ids=[stop_id], **base))[0]
    assert hidden.token_ids == free.token_ids[:at + 1] and hidden.finish_reason == "eos"
    # (the random tiny model emits stray bytes: a trailing partial character is not shown)
    assert hidden.text == visible(at)
    shown = tiny_llm.generate(["the fox"], SamplingParams(stop_token_ids=[stop_id], include_stop_str_in_output=True,
                                                          **base))[0]
    assert shown.text == visible(at + 1) != hidden.text


def test_engine_stop_string_with_and_without_include(tiny_llm):
    base = dict(max_tokens=10, temperature=0, ignore_eos=True)
    free = tiny_llm.generate(["the fox"], SamplingParams(**base))[0]
    text = free.text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop and stop in text
    cut = tiny_llm.generate(["the fox"], SamplingParams(stop=stop, **base))[0]
    assert cut.text == text[:text.index(stop)] and cut.stop_reason.value == "STOP_STRING"
    kept = tiny_llm.generate(["the fox"], SamplingParams(stop=stop, include_stop_str_in_output=True, **base))[0]
    assert kept.text == text[:text.index(stop) + len(stop)]


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_stream_and_the_window_give_the_same_text(tokenizers_by_family, family):
    """A fast tokenizer without byte-fallback tokens is stepped by ``tokenizers``' ``DecodeStream``
    (the library's window); every other one by the hand-written window. Where the stream is used,
    it must give, token by token, the text the window gives (random ids: invalid UTF-8, special
    tokens, stop strings; prompts that end on a whole character, and ones that do not, where the
    stream is not used)."""
    import random

    tok = tokenizers_by_family[family]
    rng = random.Random(7)
    vocab = len(tok)
    used = 0
    for _ in range(120):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 7))]
        out = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        params = SamplingParams(skip_special_tokens=rng.random() < 0.5, stop=["e", "ab"] if rng.random() < 0.3 else None)
        library = IncrementalDetokenizer(tok, prompt, params)
        window = IncrementalDetokenizer(tok, prompt, params, decode=decoder_for(tok))
        assert window._stream is None
        used += library._stream is not None
        for t in out:
            assert library.update(t) == window.update(t)
            assert library.text == window.text
        library.finish(), window.finish()
        assert library.text == window.text
    if family in ("byte_bpe", "shipped"):  # byte-level BPE: the stream is the usual path
        assert used > 60
    if family == "llama2":  # byte-fallback tokens: always the window
        assert used == 0
