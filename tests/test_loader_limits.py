"""Model files that claim absurd sizes, are cut short, or try to share a cache entry (issue 26):
each is refused with a ValueError naming the field and the limit before anything is allocated
for the claim, and the GGUF tokenizer cache is keyed by what the file holds, not its name."""

from __future__ import annotations

import os
import shutil
import struct

import pytest

from minillm import LLM
from minillm.models import gguf_header
from minillm.models.config import SIZE_LIMITS
from conftest import copy_of, edit_config

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed: pip install 'minillm[gguf]'")


# --- GGUF headers written by hand: only the numbers matter ----------------------------------
def _str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _kv_u32(key: bytes, value: int) -> bytes:
    return _str(key) + struct.pack("<II", 4, value)


def _header(tensors: int = 0, pairs: list[bytes] = (), infos: bytes = b"", count: int | None = None) -> bytes:
    body = b"".join(pairs)
    n = len(pairs) if count is None else count
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, n) + body + infos


def _tensor(name: bytes, dims: list[int], ttype: int = 0, offset: int = 0) -> bytes:
    return _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ttype, offset)


BAD_HEADERS = {
    "tensor_count": (_header(tensors=10**12), "tensor_count is 1000000000000, above the limit tensor_count"),
    "metadata_count": (_header(count=2**40), "metadata count is 1099511627776, above the limit metadata_count"),
    "string": (_header(pairs=[struct.pack("<Q", 2**60) + b"x"]),
               "metadata key 0 length is 1152921504606846976, above the limit string_bytes"),
    "array": (_header(pairs=[_str(b"a") + struct.pack("<IIQ", 9, 0, 2**40)]),
              "array a item count is 1099511627776, above the limit array_items"),
    "vocab": (_header(pairs=[_str(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, SIZE_LIMITS["vocab_size"] + 1)]),
              "tokenizer.ggml.tokens item count .the vocabulary. is 2097153, above the limit vocab_size"),
    "nesting": (_header(pairs=[_str(b"n") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 9, 1) +
                               struct.pack("<IQ", 0, 1)]), "n nesting is 3, above the limit array_depth"),
    "rank": (_header(tensors=1, infos=_tensor(b"t", [1] * 9)), "tensor 't' dimension count is 9, above the limit"),
    "dim": (_header(tensors=1, infos=_tensor(b"t", [2**50])), "tensor 't' dimension is 1125899906842624, above"),
    "type": (_header(tensors=1, infos=_tensor(b"t", [4], ttype=999)), "tensor 't' has unknown GGML type 999"),
    "data": (_header(tensors=1, infos=_tensor(b"t", [10**9])), "truncated GGUF file: tensor 't' ends at byte"),
    "cut": (_header(pairs=[_kv_u32(b"general.alignment", 32)])[:-2], "truncated GGUF file: the value of general"),
    "alignment": (_header(pairs=[_kv_u32(b"general.alignment", 3)]), "general.alignment must be a power of two"),
    "version": (b"GGUF" + struct.pack("<IQQ", 99, 0, 0), "GGUF version 99 is not supported"),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_absurd_or_cut_gguf_headers_are_refused_by_name(tmp_path, case):
    data, message = BAD_HEADERS[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=message):
        gguf_header.scan(path)
    with pytest.raises(ValueError, match=rf"{case}\.gguf: .*{message}"):
        LLM(str(path))  # the whole load path goes through the same walk first


def test_a_huge_layer_count_is_refused_before_any_allocation(tiny_llama, tmp_path, monkeypatch):
    """Issue 26: block_count=10**6 cost 63 s and 2.9 GB before its error; now it is the config
    check's error, before any tensor is read."""
    monkeypatch.setattr(gguf.GGUFWriter, "add_block_count", lambda self, n: self.add_uint32("llama.block_count", 10**6))
    from test_gguf import write_gguf

    path = write_gguf(tmp_path / "deep.gguf", tiny_llama[1])
    with pytest.raises(ValueError, match=r"deep\.gguf: num_hidden_layers is 1000000, above the limit 1024"):
        LLM(str(path))


def test_a_truncated_gguf_is_refused(tiny_llama, tmp_path):
    from test_gguf import write_gguf

    path = write_gguf(tmp_path / "whole.gguf", tiny_llama[1])
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"cut\.gguf: truncated GGUF file: tensor '.*' ends at byte"):
        LLM(str(cut))
    assert gguf_header.scan(path).tensor_count > 0  # the whole file passes


def test_damaged_gguf_files_give_value_errors_only(tiny_llama, tmp_path):
    """120 seeded damages of a good file (cut at a random byte, or 1-4 header bytes changed):
    each loads (a change the checks cannot see, e.g. in a float) or is a ValueError, never
    another exception, a crash or a huge allocation."""
    import random

    import torch

    from minillm.models import gguf as mg
    from minillm.models.loader import build_model, load_config
    from test_gguf import write_gguf

    data = write_gguf(tmp_path / "good.gguf", tiny_llama[1]).read_bytes()
    header_end = gguf_header.scan(tmp_path / "good.gguf").data_offset
    rng = random.Random(26)
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(120):
        damaged = bytearray(data[:rng.randrange(len(data))] if i % 3 == 0 else data)
        for _ in range(0 if i % 3 == 0 else rng.randint(1, 4)):
            damaged[rng.randrange(header_end)] = rng.randrange(256)
        path = tmp_path / f"damaged{i}.gguf"
        path.write_bytes(bytes(damaged))
        try:
            cfg = load_config(path)
            build_model(cfg, mg.read_gguf_tensors(path, cfg), torch.float32, torch.device("cpu"), 64, str(path))
            outcomes["loaded"] += 1
        except ValueError:
            outcomes["refused"] += 1
        path.unlink()
    assert outcomes["refused"] >= 80, outcomes  # most damage is seen; every cut is


def test_the_tokenizer_cache_is_keyed_by_content_not_name_size_or_time(tiny_llama, tmp_path, monkeypatch):
    """Issue 26: two different files with the same name, size and mtime shared one cached
    tokenizer and chat template. The key is now the header's SHA-256."""
    from minillm.models import gguf as mg
    from test_gguf import write_gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    paths = []
    for folder, template in (("a", "{{ 'A' }}"), ("b", "{{ 'B' }}")):
        (tmp_path / folder).mkdir()
        monkeypatch.setattr(gguf.GGUFWriter, "add_vocab_size",
                            lambda self, n, t=template: (self.add_uint32("llama.vocab_size", n),
                                                         self.add_chat_template(t)))
        paths.append(write_gguf(tmp_path / folder / "model.gguf", tiny_llama[1]))
    a, b = paths
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    assert (a.name, a.stat().st_size, a.stat().st_mtime_ns) == (b.name, b.stat().st_size, b.stat().st_mtime_ns)
    assert mg.tokenizer_cache_dir(a) != mg.tokenizer_cache_dir(b)
    same = tmp_path / "elsewhere.gguf"
    shutil.copy(a, same)  # the same content under another name shares the entry
    assert mg.tokenizer_cache_dir(same) == mg.tokenizer_cache_dir(a)
    assert mg.tokenizer_cache_dir(a).parent == tmp_path / "cache" / "minillm" / "gguf-tokenizers"


def test_a_tokenizer_cache_others_can_write_is_not_used(tmp_path, monkeypatch):
    from minillm.models import gguf as mg

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmp_path / "minillm" / "gguf-tokenizers"
    assert mg._private_cache_root() == root and (root.stat().st_mode & 0o777) == 0o700
    os.chmod(root, 0o775)  # made by an older minillm under umask 002: ours, so tightened
    assert mg._private_cache_root() == root and (root.stat().st_mode & 0o777) == 0o700
    entry = root / ("ab" * 32)
    entry.mkdir(mode=0o700)
    assert mg._private_entry(entry)
    os.chmod(entry, 0o755)  # others may enter it: its chat template is not trusted
    assert not mg._private_entry(entry)
    if os.geteuid() == 0:
        os.chmod(entry, 0o700)
        os.chown(entry, 65534, 65534)  # planted by another user
        assert not mg._private_entry(entry)
        os.chown(root, 65534, 65534)  # the whole folder someone else's
        assert mg._private_cache_root() is None
    os.symlink(tmp_path, tmp_path / "link")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere" / "minillm").mkdir(parents=True)
    os.symlink(tmp_path / "link", tmp_path / "elsewhere" / "minillm" / "gguf-tokenizers")
    assert mg._private_cache_root() is None  # a symlink in place of the folder


# --- Hugging Face folders -------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("num_hidden_layers", 10**6), ("vocab_size", 10**9), ("hidden_size", 2**20), ("intermediate_size", 2**30),
    ("num_attention_heads", 4096), ("head_dim", 4096), ("max_position_embeddings", 10**12),
])
def test_hf_config_sizes_beyond_the_limits_are_refused_by_name(tiny_llama, tmp_path, field, value):
    d = copy_of(tiny_llama, tmp_path)
    edit_config(d, **{field: value})
    if field == "num_attention_heads":
        edit_config(d, num_key_value_heads=value)
    with pytest.raises(ValueError, match=rf"config\.json: {field} is {value}, above the limit {SIZE_LIMITS[field]}"):
        LLM(str(d))
