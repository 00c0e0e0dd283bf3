"""minillm: a small, complete LLM inference engine, built to be looked inside.

    from minillm import LLM, SamplingParams
    llm = LLM()
    llm.generate(["Once upon a time"], SamplingParams(max_tokens=40, temperature=0.0))
"""

from .kv_cache import CacheStats
from .llm import LLM
from .params import SamplingParams
from .request import IllegalTransition, Request, RequestOutput, RequestState, StopReason
from .trace import Event

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "Request", "RequestOutput", "RequestState", "StopReason",
           "IllegalTransition", "Event", "CacheStats", "__version__"]
