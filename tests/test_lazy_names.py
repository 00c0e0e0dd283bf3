"""The packages' lazy names (``minillm._lazy.lazy_names``, used by ``minillm``, ``minillm.apps.serve``,
``minillm.viz`` and ``minillm.grading``): importing a package imports none of its heavy
dependencies, a name is imported on first use and kept, and the clean room of ``minillm grade``
(which disables every engine function) still answers an import statement."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "ipywidgets", "matplotlib")


def _run(script: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_importing_the_packages_imports_nothing_heavy():
    """``minillm --help``, ``minillm serve --help`` and the lab import these packages and need no
    torch (about 3 CPU seconds), fastapi or ipywidgets."""
    out = _run(f"""
        import sys
        import minillm, minillm.apps.serve, minillm.viz, minillm.grading
        print(sorted(set({HEAVY!r}) & set(sys.modules)))
        print("SamplingParams" in dir(minillm) and "SamplingParams" not in vars(minillm))
    """)
    assert out.split("\n")[:2] == ["[]", "True"], out


def test_a_name_is_imported_on_first_use_and_kept():
    import minillm
    import minillm.apps.serve as serve
    import minillm.grading
    from minillm import _lazy

    getattr_, dir_ = _lazy.lazy_names("minillm", {"Demo": "params", "SamplingParams": "params"})
    assert "Demo" in dir_() and "LLM" in dir(minillm) and "EngineLoop" in dir(serve)
    with pytest.raises(AttributeError, match="module 'minillm.params' has no attribute 'Demo'"):
        getattr_("Demo")  # in the table, not in its module
    with pytest.raises(AttributeError, match="module 'minillm' has no attribute 'NoSuchName'"):
        minillm.NoSuchName  # noqa: B018
    from minillm.params import SamplingParams

    assert minillm.SamplingParams is SamplingParams and vars(minillm)["SamplingParams"] is SamplingParams
    from minillm.grading import build_it  # a submodule named by the table, as ``from .ch04 import build_it``

    assert build_it.__name__ == "minillm.grading.ch04.build_it"


def test_the_clean_room_still_answers_an_import_statement():
    """``engine_guard.disable_engine`` swaps every package function's code for one that raises,
    except the lazy hooks an import statement asks (a module's ``__getattr__`` before they were
    written once in ``_lazy.py``): ``from minillm import SamplingParams`` in a graded function
    must still work there, and an engine function must not."""
    out = _run("""
        import minillm
        from minillm import sampler
        from minillm.grading.engine_guard import disable_engine
        assert disable_engine() > 0
        from minillm import SamplingParams       # the hook runs: not yet kept in the package
        print(SamplingParams(max_tokens=3).max_tokens, sorted(dir(minillm))[:1])
        try:
            sampler.top_p_filter(None, 0.5)
        except RuntimeError as exc:
            print("blocked:", "write it yourself" in str(exc))
    """)
    assert out.split("\n")[:2] == ["3 ['CacheStats']", "blocked: True"], out
