"""Walk a GGUF file's header before anything else parses it: sizes within limits, nothing past
the end of the file, and a hash of the header.

The ``gguf`` package trusts the counts and lengths a file states: a file that claims a million
tensors, a string of 2**60 bytes or a dimension of 2**62 makes it (or the loader after it)
allocate for that claim before any error. This walk reads only the numbers, compares each with
:data:`GGUF_LIMITS` (and the vocabulary with ``SIZE_LIMITS``), and checks that every string,
array and tensor lies inside the file, so an absurd or truncated file is a ``ValueError``
naming the field and the limit, costing milliseconds.

The SHA-256 of the header (magic to the last tensor description: every metadata value, the
tokenizer and chat template included) names what was read from the file, which is what the
tokenizer cache is keyed by (not the path or the modification time).
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from .config import SIZE_LIMITS

MAGIC = b"GGUF"
VERSIONS = (2, 3)
#: The most the header may claim of each thing (far above any published model).
GGUF_LIMITS = {
    "tensor_count": 1 << 16,     # a 1024-layer model has ~15k tensors
    "metadata_count": 1 << 16,   # key-value pairs
    "string_bytes": 1 << 26,     # one string: 64 MiB (chat templates are a few KB)
    "array_items": 1 << 24,      # one array: 16M items (vocabularies and merges are < 1M)
    "array_depth": 2,            # an array of arrays at most
    "tensor_dims": 4,            # llama.cpp's GGML_MAX_DIMS
    "dim": 1 << 40,              # one dimension (its bytes must also fit in the file)
}
#: Arrays whose length is the vocabulary size.
VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
# value type id -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    sha256: str
    version: int
    tensor_count: int
    metadata_count: int
    data_offset: int


class _Cursor:
    """Reads little- or big-endian numbers from the mapped file, never past its end."""

    def __init__(self, buf, path: Path, order: str):
        self.buf, self.path, self.order, self.pos = buf, path, order, 0

    def take(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file: {what} ({n} bytes at offset {start}) runs past "
                             f"the end of the file ({len(self.buf)} bytes)")
        self.pos += n
        return start

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        return struct.unpack_from(self.order + fmt, self.buf, self.take(size, what))[0]

    def string(self, what: str) -> bytes:
        n = self.scalar("Q", f"the length of {what}")
        limited(self.path, f"{what} length", n, GGUF_LIMITS["string_bytes"], "string_bytes")
        start = self.take(n, what)
        return bytes(self.buf[start:start + n])

    def skip_string(self, what: str) -> None:
        n = self.scalar("Q", f"the length of {what}")
        limited(self.path, f"{what} length", n, GGUF_LIMITS["string_bytes"], "string_bytes")
        self.take(n, what)


def limited(path: Path, what: str, value: int, limit: int, name: str) -> int:
    if value > limit:
        raise ValueError(f"{path}: GGUF {what} is {value}, above the limit {name} <= {limit}")
    return value


def _value(cur: _Cursor, vtype: int, key: str, depth: int = 0):
    """Skip one value of type ``vtype`` (returning scalars, which the caller may need)."""
    if vtype in _SCALARS:
        return cur.scalar(_SCALARS[vtype], f"the value of {key}")
    if vtype == STRING:
        cur.skip_string(f"the string {key}")
        return None
    if vtype != ARRAY:
        raise ValueError(f"{cur.path}: GGUF metadata {key} has unknown value type {vtype}")
    limited(cur.path, f"{key} nesting", depth + 1, GGUF_LIMITS["array_depth"], "array_depth")
    item = cur.scalar("I", f"the item type of {key}")
    count = limited(cur.path, f"array {key} item count", cur.scalar("Q", f"the length of {key}"),
                    GGUF_LIMITS["array_items"], "array_items")
    if key in VOCAB_ARRAYS:
        limited(cur.path, f"array {key} item count (the vocabulary)", count, SIZE_LIMITS["vocab_size"], "vocab_size")
    if item in _SCALARS:
        cur.take(count * struct.calcsize(_SCALARS[item]), f"the array {key}")
    else:
        for _ in range(count):
            _value(cur, item, key, depth + 1)
    return None


def _tensor_infos(cur: _Cursor, count: int) -> list[tuple[str, int, int, int]]:
    """(name, element count, type, offset) of every tensor."""
    out = []
    for i in range(count):
        name = cur.string(f"tensor {i}'s name").decode("utf-8", "replace")
        n_dims = limited(cur.path, f"tensor {name!r} dimension count", cur.scalar("I", f"tensor {name!r}'s rank"),
                         GGUF_LIMITS["tensor_dims"], "tensor_dims")
        elements = 1
        for _ in range(n_dims):
            elements *= limited(cur.path, f"tensor {name!r} dimension", cur.scalar("Q", f"tensor {name!r}'s shape"),
                                GGUF_LIMITS["dim"], "dim")
        ttype = cur.scalar("I", f"tensor {name!r}'s type")
        offset = cur.scalar("Q", f"tensor {name!r}'s offset")
        out.append((name, elements, ttype, offset))
    return out


def _check_tensor_data(path: Path, infos, data_offset: int, file_size: int) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, elements, ttype, offset in infos:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise ValueError(f"{path}: tensor {name!r} has unknown GGML type {ttype}") from None
        if elements % block:
            raise ValueError(f"{path}: tensor {name!r} has {elements} elements, not a multiple of its type's "
                             f"block of {block}")
        end = data_offset + offset + elements // block * type_size
        if end > file_size:
            raise ValueError(f"{path}: truncated GGUF file: tensor {name!r} ends at byte {end}, past the end of "
                             f"the file ({file_size} bytes)")


def scan(path: Path) -> GGUFHeader:
    """Check ``path``'s header against the limits and the file's size; ``ValueError`` naming the
    field otherwise. Reads the numbers only (a few ms even for a large vocabulary)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise ValueError(f"{path}: truncated GGUF file ({size} bytes; the header alone is 24)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _scan(buf, Path(path), size)


def _scan(buf, path: Path, size: int) -> GGUFHeader:
    if bytes(buf[:4]) != MAGIC:
        raise ValueError(f"{path}: not a GGUF file (it does not start with {MAGIC!r})")
    order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
    cur = _Cursor(buf, path, order)
    cur.take(4, "the magic")
    version = cur.scalar("I", "the version")
    if version not in VERSIONS:
        raise ValueError(f"{path}: GGUF version {version} is not supported (supported: {VERSIONS})")
    tensors = limited(path, "tensor_count", cur.scalar("Q", "the tensor count"), GGUF_LIMITS["tensor_count"],
                      "tensor_count")
    pairs = limited(path, "metadata count", cur.scalar("Q", "the metadata count"), GGUF_LIMITS["metadata_count"],
                    "metadata_count")
    alignment = 32
    for i in range(pairs):
        key = cur.string(f"metadata key {i}").decode("utf-8", "replace")
        value = _value(cur, cur.scalar("I", f"the type of {key}"), key)
        if key == "general.alignment":
            if not isinstance(value, int) or value < 1 or value & (value - 1) or value > 1 << 20:
                raise ValueError(f"{path}: GGUF general.alignment must be a power of two <= {1 << 20}, got {value!r}")
            alignment = value
    infos = _tensor_infos(cur, tensors)
    header_end = cur.pos
    data_offset = -(-header_end // alignment) * alignment
    _check_tensor_data(path, infos, data_offset, size)
    sha = hashlib.sha256(buf[:header_end]).hexdigest()
    return GGUFHeader(sha256=sha, version=version, tensor_count=tensors, metadata_count=pairs,
                      data_offset=data_offset)
