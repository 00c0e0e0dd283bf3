"""The loader trusts nothing in a model folder: each tampered folder gets a ValueError (or
FileNotFoundError) naming the file and the field or tensor, and nothing outside the folder
is ever read. Every folder here is a tampered copy of the tiny Llama fixture."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minillm import LLM
from minillm.models import load_config, load_model, resolve_model_dir
from minillm.models.config import ModelConfig, generation_defaults
from minillm.models.llama import ROTARY_TABLE_LIMIT, RotaryEmbedding
from conftest import copy_of, edit_config

IDS = [5, 17, 42, 99, 3, 250]


def logits_of(folder: Path) -> torch.Tensor:
    return LLM(str(folder), block_size=4, num_kv_blocks=16).model.full_logits(IDS)


# --- which files are read -------------------------------------------------------------------
def test_stale_extra_safetensors_file_is_not_loaded(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    tensors = load_file(d / "model.safetensors")
    stale = {k: torch.zeros_like(v) for k, v in tensors.items()}
    save_file(stale, d / "zz-old-model.safetensors")  # sorts after model.safetensors
    ref = tiny_llama[1](torch.tensor([IDS])).logits[0]
    assert (logits_of(d) - ref).abs().max().item() < 1e-4


def test_a_lone_other_safetensors_name_is_refused(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    (d / "model.safetensors").rename(d / "weights.safetensors")
    with pytest.raises(FileNotFoundError, match=r"weights\.safetensors.*model\.safetensors"):
        LLM(str(d))


def _shard(folder: Path, extra_in_second: list[str] = (), weight_map_override: dict | None = None):
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    first, second = names[: len(names) // 2], names[len(names) // 2:]
    save_file({k: tensors[k] for k in first}, folder / "model-00001-of-00002.safetensors")
    save_file({k: tensors[k] for k in second + list(extra_in_second)},
              folder / "model-00002-of-00002.safetensors")
    (folder / "model.safetensors").unlink()
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in second})
    weight_map.update(weight_map_override or {})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return first


def test_sharded_checkpoint_loads_the_same_weights(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    _shard(d)
    ref = tiny_llama[1](torch.tensor([IDS])).logits[0]
    assert (logits_of(d) - ref).abs().max().item() < 1e-4


def test_a_tensor_in_two_shards_is_an_error(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    tensors = load_file(d / "model.safetensors")
    names = sorted(tensors)
    dup = names[0]  # lands in the first shard; put it in the second too
    _shard(d, extra_in_second=[dup])
    with pytest.raises(ValueError, match=rf"{dup.replace('.', '[.]')}.*00001-of-00002.*00002-of-00002"):
        LLM(str(d))


@pytest.mark.parametrize("shard_name,message", [
    ("../outside.safetensors", "relative path inside"),
    ("/etc/passwd", "relative path inside"),
    ("sub/../../outside.safetensors", "relative path inside"),
])
def test_index_may_not_point_outside_the_folder(tiny_llama, tmp_path, shard_name, message):
    d = copy_of(tiny_llama, tmp_path)
    first = _shard(d, weight_map_override={})
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"][first[0]] = shard_name
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(d / "model-00001-of-00002.safetensors", tmp_path / "outside.safetensors")
    with pytest.raises(ValueError, match=rf"model\.safetensors\.index\.json.*{message}"):
        LLM(str(d))


def test_symlink_escaping_the_folder_is_refused(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    (d / "model.safetensors").rename(outside)
    (d / "model.safetensors").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the model folder"):
        LLM(str(d))


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json"])
def test_other_files_may_not_link_outside_either(tiny_llama, tmp_path, name):
    d = copy_of(tiny_llama, tmp_path)
    outside = tmp_path / f"elsewhere-{name}"
    (d / name).rename(outside)
    (d / name).symlink_to(outside)
    with pytest.raises(ValueError, match=rf"{name.replace('.', '[.]')}.*outside the model folder"):
        LLM(str(d))


def test_symlink_inside_the_folder_and_hub_cache_layout_load(tiny_llama, tmp_path):
    """A Hugging Face hub cache snapshot links each file to ../../blobs/<hash>: allowed."""
    repo = tmp_path / "models--x--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in Path(tiny_llama[0]).iterdir():
        shutil.copy(f, blobs / f.name)
        (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    ref = tiny_llama[1](torch.tensor([IDS])).logits[0]
    assert (logits_of(snap) - ref).abs().max().item() < 1e-4


def test_index_without_weight_map_is_named(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weights": []}))
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json.*weight_map"):
        LLM(str(d))


# --- broken files ---------------------------------------------------------------------------
def test_truncated_safetensors_names_the_file(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
        LLM(str(d))


def test_garbage_safetensors_names_the_file(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    (d / "model.safetensors").write_bytes(b"\x00" * 5)
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
        LLM(str(d))


@pytest.mark.parametrize("text,message", [
    ("{not json", "config.json: not valid JSON"),
    ("[1, 2, 3]", "config.json: must be a JSON object, got a list"),
    ('"a string"', "config.json: must be a JSON object, got a str"),
])
def test_config_that_is_not_an_object(tiny_llama, tmp_path, text, message):
    d = copy_of(tiny_llama, tmp_path)
    (d / "config.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        LLM(str(d))


@pytest.mark.parametrize("changes,message", [
    ({"rope_theta": "x", "rope_parameters": None}, "rope_theta must be a finite number > 0, got 'x'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": float("nan")}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "factor"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer"),
    ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be a positive integer, got True"),
    ({"hidden_size": 64.5}, "hidden_size must be a positive integer"),
    ({"vocab_size": "320"}, "vocab_size must be a positive integer"),
    ({"intermediate_size": -1}, "intermediate_size"),
    ({"head_dim": 15}, "head_dim must be even"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings must be true or false"),
    ({"eos_token_id": 10**6}, r"eos_token_id must be a token id in \[0, 320\)"),
    ({"eos_token_id": [1, "two"]}, "eos_token_id"),
    ({"architectures": "LlamaForCausalLM", "rope_scaling": [1]}, "rope_scaling must be an object"),
])
def test_bad_config_values_name_file_and_field(tiny_llama, tmp_path, changes, message):
    d = copy_of(tiny_llama, tmp_path)
    edit_config(d, **changes)
    with pytest.raises(ValueError, match=rf"config\.json: .*{message}"):
        LLM(str(d))


def test_hidden_size_not_divisible_by_heads_without_head_dim():
    cfg = dict(architectures=["LlamaForCausalLM"], vocab_size=10, hidden_size=30, intermediate_size=8,
               num_hidden_layers=1, num_attention_heads=4)
    with pytest.raises(ValueError, match=r"hidden_size \(30\) must be a multiple of num_attention_heads"):
        ModelConfig.from_dict(cfg)
    assert ModelConfig.from_dict({**cfg, "head_dim": 8}).head_dim == 8


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_name_the_tensor(tiny_llama, tmp_path, bad):
    d = copy_of(tiny_llama, tmp_path)
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.1.self_attn.k_proj.weight"][3, 7] = bad
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'model\.layers\.1\.self_attn\.k_proj\.weight' "
                                         r"holds 1 NaN or infinite values"):
        LLM(str(d))


def test_integer_weights_are_refused(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    tensors = load_file(d / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int32)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*floating-point"):
        LLM(str(d))


def test_tokenizer_that_emits_ids_beyond_vocab_is_refused(tiny_llama, tmp_path):
    from transformers import AutoTokenizer

    d = copy_of(tiny_llama, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(d))
    tok.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    assert tok.encode("<|extra|>", add_special_tokens=False) == [320]
    tok.save_pretrained(d)
    with pytest.raises(ValueError, match=r"can emit token id 320 \('<\|extra\|>'\).*vocab_size is 320"):
        LLM(str(d))


def test_bad_model_argument_type():
    with pytest.raises(ValueError, match="model must be a path"):
        LLM(123)


# --- huge position counts -------------------------------------------------------------------
def test_rotary_without_table_gives_the_tables_values(tiny_llama):
    cfg = load_config(Path(tiny_llama[0]))
    table = RotaryEmbedding(cfg, ROTARY_TABLE_LIMIT)
    lazy = RotaryEmbedding(cfg, 10**7)
    assert table.cos is not None and lazy.cos is None
    pos = torch.tensor([0, 1, 77, ROTARY_TABLE_LIMIT - 1])
    for a, b in zip(table(pos, torch.float32), lazy(pos, torch.float32)):
        assert torch.allclose(a, b, atol=1e-6)
    far = lazy(torch.tensor([9_999_999]), torch.float32)[0]
    assert far.shape == (1, 1, cfg.head_dim) and torch.isfinite(far).all()


def test_huge_max_position_embeddings_loads_in_little_memory(tiny_llama, tmp_path):
    """max_position_embeddings=10**7 in a 0.5 MB folder: the rotary tables alone would be
    2.4 GB; the load (config, tokenizer, weights, engine with a small KV pool) stays < 200 MB."""
    d = copy_of(tiny_llama, tmp_path)
    edit_config(d, max_position_embeddings=10**7)
    script = textwrap.dedent(f"""
        import resource, torch
        from minillm import LLM
        torch.tensor([1.0]) @ torch.tensor([1.0])   # warm torch up before the first reading
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        llm = LLM({str(d)!r}, block_size=4, num_kv_blocks=16)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert llm.max_model_len == 10**7, llm.max_model_len
        # nor does loading import what it has no use for (each ~1.5 CPU-s per kernel or server)
        import sys
        extra = {{"torch._dynamo", "transformers.models.llama.configuration_llama"}} & set(sys.modules)
        assert not extra, f"loading a model imported {{extra}}"
        print((after - before) // 1024)
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    grew_mb = int(out.stdout.strip().splitlines()[-1])
    assert grew_mb < 200, f"loading grew RSS by {grew_mb} MB"


def test_far_positions_still_match_the_table(tiny_llama, tmp_path):
    """The same model with tables (256 positions) and without (10**7): identical logits."""
    d = copy_of(tiny_llama, tmp_path)
    edit_config(d, max_position_embeddings=10**7)
    near = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=16).model.full_logits(IDS * 20)
    far = load_model(resolve_model_dir(d), load_config(d), torch.float32, torch.device("cpu"), 10**7)
    assert far.rotary.cos is None
    assert (far.full_logits(IDS * 20) - near).abs().max().item() < 1e-5


def test_weights_are_cast_without_a_float32_copy(tiny_llama):
    """Built and cast on meta: the loaded parameters are in the asked dtype and nothing is left
    on meta; rotary tables stay float32."""
    d = Path(tiny_llama[0])
    m = load_model(d, load_config(d), torch.bfloat16, torch.device("cpu"), 64)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert not any(t.is_meta for t in list(m.parameters()) + list(m.buffers()))
    assert m.rotary.cos.dtype == torch.float32


@pytest.mark.parametrize("model_type, generic", [("llama", True), ("qwen3", True), ("qwen2", False)])
def test_the_loaders_tokenizer_is_the_one_autotokenizer_builds(tiny_llama, tmp_path, model_type, generic):
    """The loader builds transformers' generic fast tokenizer itself where AutoTokenizer would pick
    it (its AutoConfig imports cost ~2 CPU-s a process): the same class, ids, special tokens and
    chat template. A Qwen2 folder (a type AutoTokenizer maps to a tokenizer of its own) is left to
    AutoTokenizer. If a transformers release changes its choice, this fails."""
    from transformers import AutoTokenizer

    from minillm.models.loader import _generic_tokenizer_class, load_tokenizer

    d = tmp_path / model_type
    d.mkdir()
    for f in Path(tiny_llama[0]).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, d / f.name)
    (d / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 336}))
    assert (_generic_tokenizer_class(d) is not None) is generic
    ours, auto = load_tokenizer(d, 336), AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    assert type(ours) is type(auto)
    for text in ("Once upon a time", "从前有一只小狐狸，它", "<s>a fox</s> ran\n"):
        assert ours(text) == auto(text) and ours.decode(ours(text)["input_ids"]) == auto.decode(auto(text)["input_ids"])
    assert ours.special_tokens_map == auto.special_tokens_map and ours.chat_template == auto.chat_template


def test_the_shipped_models_tokenizer_is_the_one_autotokenizer_builds():
    from transformers import AutoTokenizer

    from minillm.models.loader import DEFAULT_MODEL_DIR, _generic_tokenizer_class, load_tokenizer

    assert _generic_tokenizer_class(DEFAULT_MODEL_DIR) is not None
    ours, auto = load_tokenizer(DEFAULT_MODEL_DIR), AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_DIR))
    assert type(ours) is type(auto) and ours.get_vocab() == auto.get_vocab()
    for text in ("Once upon a time", "从前有一只小狐狸，它", "<|bos|>Tom<|endoftext|>"):
        assert ours(text) == auto(text)
    assert ours.special_tokens_map == auto.special_tokens_map and ours.chat_template == auto.chat_template


def test_a_model_built_off_the_meta_device_is_initialised(tiny_llama):
    """Only the loader's meta build skips the embedding's init and the rotary tables; a model made on
    a real device (scripts/train_default_model.py) has both."""
    from minillm.models.llama import LlamaForCausalLM

    m = LlamaForCausalLM(load_config(Path(tiny_llama[0])), 64)
    assert 0.5 < m.model.embed_tokens.weight.std().item() < 2  # nn.Embedding's N(0, 1)
    assert m.rotary.cos.shape[0] == 64 and torch.isfinite(m.rotary.sin).all()


# --- generation_config.json -----------------------------------------------------------------
def test_generation_config_eos_list_stops_greedy_decoding(tiny_llama, tmp_path):
    from minillm import SamplingParams
    from minillm.request import StopReason

    PROMPT = [100, 200, 300]  # greedy output varies for a while on this random model
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=False)
    base = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64)
    req = base.add_request(prompt_token_ids=PROMPT, params=SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    while base.has_unfinished():
        base.step()
    tokens = req.output_token_ids
    # the last token to appear for the first time (not EOS=1): listed as an extra EOS
    k = max(i for i in range(len(tokens)) if tokens[i] not in tokens[:i] and tokens[i] != 1)
    assert k >= 1, tokens
    d = copy_of(tiny_llama, tmp_path)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, tokens[k]], "temperature": 0.7,
                                                          "top_p": 0.8, "top_k": 20, "max_new_tokens": 77,
                                                          "repetition_penalty": 1.05, "do_sample": True}))
    llm = LLM(str(d), block_size=4, num_kv_blocks=64)
    assert tokens[k] in llm.eos_token_ids and 1 in llm.eos_token_ids
    assert llm.model_config.generation_defaults == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                                     "max_tokens": 77, "repetition_penalty": 1.05}
    d = llm.default_sampling_params(top_k=5)
    assert (d.temperature, d.top_p, d.top_k, d.max_tokens, d.repetition_penalty) == (0.7, 0.8, 5, 77, 1.05)
    out = llm.add_request(prompt_token_ids=PROMPT, params=params)
    while llm.has_unfinished():
        llm.step()
    assert out.output_token_ids == tokens[:k + 1]
    assert out.stop_reason == StopReason.EOS


@pytest.mark.parametrize("gen,message", [
    ({"temperature": "hot"}, "temperature"), ({"top_k": 2.5}, "top_k"), ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"top_p": float("nan")}, "top_p"), ({"repetition_penalty": True}, "repetition_penalty"),
])
def test_bad_generation_config_values_are_named(gen, message):
    with pytest.raises(ValueError, match=rf"generation_config\.json: {message}"):
        generation_defaults(gen)


def test_bad_generation_config_file_is_named(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    (d / "generation_config.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"generation_config\.json: must be a JSON object"):
        LLM(str(d))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 5000}))
    with pytest.raises(ValueError, match=r"generation_config\.json: eos_token_id must be a token id"):
        LLM(str(d))


def test_generation_defaults_keep_only_given_values():
    assert generation_defaults({"do_sample": False, "max_new_tokens": 256, "bos_token_id": 0}) == {"max_tokens": 256}
    assert generation_defaults({}) == {}
