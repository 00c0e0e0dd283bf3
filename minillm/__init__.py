"""minillm: a small, complete LLM inference engine, built to be looked inside.

    from minillm import LLM, SamplingParams
    llm = LLM()
    llm.generate(["Once upon a time"], SamplingParams(max_tokens=40, temperature=0.0))

The names below are imported on first use, not with the package: ``minillm lab``, the course's
JupyterLab server and ``minillm --help`` import ``minillm.apps...`` and need no torch (importing
it costs about 3 CPU seconds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _lazy

__version__ = "0.1.0"
#: each public name -> the module that defines it
_HOMES = {"LLM": "llm", "SamplingParams": "params", "Request": "request", "RequestOutput": "request",
          "RequestState": "request", "StopReason": "request", "IllegalTransition": "request",
          "Event": "trace", "CacheStats": "kv_cache"}
__all__ = ["LLM", "SamplingParams", "Request", "RequestOutput", "RequestState", "StopReason",
           "IllegalTransition", "Event", "CacheStats", "__version__"]

if TYPE_CHECKING:
    from .kv_cache import CacheStats
    from .llm import LLM
    from .params import SamplingParams
    from .request import IllegalTransition, Request, RequestOutput, RequestState, StopReason
    from .trace import Event

__getattr__, __dir__ = _lazy.lazy_names(__name__, _HOMES)
