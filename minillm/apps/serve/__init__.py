"""``minillm serve``: the engine behind an OpenAI-compatible HTTP service.

A client of the engine's public API only (the engine core never imports this package):
``EngineLoop`` (one thread owns the engine), ``OpenAIServer`` (the routes), ``ServerMetrics``
(Prometheus), ``serve`` (the command line entry point).
"""

from .app import OpenAIServer
from .engine_loop import EngineLoop, Overloaded, ShuttingDown
from .metrics import ServerMetrics
from .server import serve

__all__ = ["EngineLoop", "OpenAIServer", "Overloaded", "ServerMetrics", "ShuttingDown", "serve"]
