"""Values that cross between the grader and the sandboxed kernel, as plain JSON data.

Nothing the kernel sends back is ever unpickled or executed: a value is rebuilt from a tagged
JSON form, and only from *exact* types (``type(x) is int``, never a subclass whose ``__eq__``
always says yes). Anything else arrives as a :class:`Foreign` placeholder that carries only
its type's name, so a grader's ``isinstance`` check fails and its feedback can say what came
back.
"""

from __future__ import annotations

import base64
import math

MAX_DEPTH = 20
MAX_ITEMS = 100_000
MAX_STR = 200_000


class Foreign:
    """A value of a type the wire does not carry (a function, a custom object, a subclass)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


def _foreign_class(name: str) -> type:
    safe = "".join(c for c in str(name)[:60] if c.isalnum() or c == "_") or "object"
    return type(safe, (Foreign,), {})


class WireError(ValueError):
    """Malformed data from the kernel."""


def encode(value, depth: int = 0):
    """A JSON-ready form of ``value`` (runs in the kernel, or in the grader for arguments)."""
    if depth > MAX_DEPTH:
        return {"t": "other", "type": "deeply nested value"}
    t = type(value)
    if value is None:
        return {"t": "none"}
    if t is bool:
        return {"t": "bool", "v": value}
    if t is int:
        return {"t": "int", "v": str(value)}
    if t is float:
        return {"t": "float", "v": repr(value)}
    if t is str:
        return {"t": "str", "v": value[:MAX_STR]}
    if t in (list, tuple):
        return {"t": t.__name__, "v": [encode(v, depth + 1) for v in list(value)[:MAX_ITEMS]]}
    if t is dict:
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)]
                                   for k, v in list(value.items())[:MAX_ITEMS]]}
    mod = getattr(t, "__module__", "")
    if mod.startswith("torch") and t.__name__ == "Tensor":
        import torch

        if type(value) is torch.Tensor and value.layout == torch.strided and not value.is_complex():
            x = value.detach().to("cpu").contiguous()
            if x.dtype == torch.bfloat16:
                raw = x.view(torch.int16).numpy().tobytes()
            else:
                raw = x.numpy().tobytes()
            return {"t": "tensor", "dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape),
                    "data": base64.b64encode(raw).decode("ascii")}
    if mod.startswith("minillm") and t.__name__ in ("StopReason", "SamplingParams"):
        from minillm import SamplingParams, StopReason  # exact types: a look-alike class runs no code here

        if t is StopReason:
            return {"t": "stop_reason", "v": value.name}
        if t is SamplingParams:
            return {"t": "sampling_params", "v": encode(_params_kwargs(value), depth + 1)}
    return {"t": "other", "type": t.__name__}


def _params_kwargs(p) -> dict:
    from dataclasses import fields

    return {f.name: getattr(p, f.name) for f in fields(p) if f.init}


def decode(data, depth: int = 0):
    """Rebuild a value from :func:`encode`'s form; raises :class:`WireError` on bad data."""
    if depth > MAX_DEPTH + 1 or not isinstance(data, dict):
        raise WireError("malformed value")
    tag = data.get("t")
    v = data.get("v")
    if tag == "none":
        return None
    if tag == "bool" and type(v) is bool:
        return v
    if tag == "int" and type(v) is str and len(v) < 5000:
        try:
            return int(v)
        except ValueError:
            raise WireError("malformed int") from None
    if tag == "float" and type(v) is str and len(v) < 64:
        try:
            return float(v)
        except ValueError:
            raise WireError("malformed float") from None
    if tag == "str" and type(v) is str:
        return v
    if tag in ("list", "tuple") and type(v) is list:
        items = [decode(x, depth + 1) for x in v[:MAX_ITEMS]]
        return items if tag == "list" else tuple(items)
    if tag == "dict" and type(v) is list:
        out = {}
        for pair in v[:MAX_ITEMS]:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("malformed dict")
            key = decode(pair[0], depth + 1)
            if type(key) not in (str, int, float, bool, tuple) and key is not None:
                raise WireError("unhashable dict key")
            out[key] = decode(pair[1], depth + 1)
        return out
    if tag == "tensor":
        return _tensor(data)
    if tag == "stop_reason" and type(v) is str:
        from minillm import StopReason

        if v in StopReason.__members__:
            return StopReason[v]
        raise WireError("unknown StopReason")
    if tag == "sampling_params":
        from minillm import SamplingParams

        return SamplingParams(**decode(v, depth + 1))
    if tag == "other":
        return _foreign_class(data.get("type", "object"))(str(data.get("type", "object")))
    raise WireError(f"unknown value tag {str(tag)[:20]!r}")


_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


def _tensor(data: dict):
    import numpy as np
    import torch

    dtype, shape, raw = data.get("dtype"), data.get("shape"), data.get("data")
    if dtype not in _DTYPES or type(shape) is not list or type(raw) is not str:
        raise WireError("malformed tensor")
    if not all(type(s) is int and 0 <= s < 10**8 for s in shape) or len(shape) > 8:
        raise WireError("malformed tensor shape")
    try:
        buf = base64.b64decode(raw.encode("ascii"), validate=True)
    except Exception:
        raise WireError("malformed tensor data") from None
    n = math.prod(shape)
    np_dtype = np.int16 if dtype == "bfloat16" else np.dtype(dtype if dtype != "bool" else "bool")
    if n * np.dtype(np_dtype).itemsize != len(buf):
        raise WireError("tensor data does not match its shape")
    arr = np.frombuffer(buf, dtype=np_dtype).copy().reshape(shape)
    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t
