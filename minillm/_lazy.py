"""A package's names imported on first use: one ``__getattr__``/``__dir__`` pair for every lazy table.

``import minillm``, ``minillm.apps.serve`` and ``minillm.viz`` stay cheap (no torch, fastapi or
ipywidgets until a name that needs them is asked for) by answering their public names from a
table, name -> the submodule that defines it (PEP 562). Written once here rather than per package.
"""

from __future__ import annotations

import importlib
import sys


def lazy_names(package: str, homes: dict[str, str]):
    """``(__getattr__, __dir__)`` for the package named ``package``: ``__getattr__(name)`` imports
    ``homes[name]`` (relative to the package) and returns its ``name``, as ``from .home import name``
    would (a submodule of that name when ``homes[name]`` is a package without such an attribute), and keeps it in the
    package so later look-ups skip the hook; an unknown name is an ``AttributeError``. ``__dir__``
    lists the package's names and the table's."""
    module = sys.modules[package]

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        source = importlib.import_module(f".{home}", package)
        if hasattr(source, name):
            value = getattr(source, name)
        elif hasattr(source, "__path__"):  # a package: its submodule
            value = importlib.import_module(f".{home}.{name}", package)
        else:
            raise AttributeError(f"module {source.__name__!r} has no attribute {name!r}")
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(homes))

    return __getattr__, __dir__
