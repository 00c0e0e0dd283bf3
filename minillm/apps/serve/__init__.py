"""``minillm serve``: the engine behind an OpenAI-compatible HTTP service.

A client of the engine's public API only (the engine core never imports this package):
``EngineLoop`` (one thread owns the engine), ``OpenAIServer`` (the routes), ``ServerMetrics``
(Prometheus), ``serve`` (the command line entry point). They are imported on first use, so
``minillm serve --help`` or a bad option answers before torch and fastapi are loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _lazy

#: each public name -> the module of this package that defines it
_HOMES = {"EngineLoop": "engine_loop", "Overloaded": "engine_loop", "ShuttingDown": "engine_loop",
          "OpenAIServer": "app", "ServerMetrics": "metrics", "serve": "server"}
__all__ = ["EngineLoop", "OpenAIServer", "Overloaded", "ServerMetrics", "ShuttingDown", "serve"]

if TYPE_CHECKING:
    from .app import OpenAIServer
    from .engine_loop import EngineLoop, Overloaded, ShuttingDown
    from .metrics import ServerMetrics
    from .server import serve

__getattr__, __dir__ = _lazy.lazy_names(__name__, _HOMES)
