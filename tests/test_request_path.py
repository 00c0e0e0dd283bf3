"""The reference path stays one a reader can hold (issue #24): one short request, traced from
``add_request`` to release by ``scripts/request_path.py``, runs at most 60 minillm functions in
at most 9 files, none of them the fast layer's or an app's; the default path is the fast one."""

from __future__ import annotations

from conftest import load_script


def test_the_reference_path_is_small_and_plain():
    script = load_script("request_path")
    ref = script.trace_one_request(script.CONFIGS["reference"])
    assert ref["functions"] <= 60 and ref["files"] <= 9, (ref["functions"], ref["files"], ref["by_file"])
    for path in ref["by_file"]:
        assert not path.startswith(("minillm/fast/", "minillm/apps/", "minillm/viz/", "minillm/grading/")), path
    fast = script.trace_one_request(script.CONFIGS["default"])
    assert any(path.startswith("minillm/fast/") for path in fast["by_file"]), fast["by_file"]
