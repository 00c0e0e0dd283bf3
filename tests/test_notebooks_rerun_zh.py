"""The Chinese edition (``notebooks/zh/``) survives Run All, then each cell twice, in one kernel: the same
check as ``test_notebooks_rerun.py``, in a file of its own so that pytest-xdist runs the two
editions on different workers."""

from __future__ import annotations

import pytest
from test_notebooks_rerun import ALL_NOTEBOOKS, ROOT, run_all_then_each_twice

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

ZH = ROOT / "notebooks" / "zh"
NOTEBOOKS = [p for p in ALL_NOTEBOOKS if p.is_relative_to(ZH)]


def test_there_are_chinese_notebooks():
    assert NOTEBOOKS, "no notebooks under notebooks/zh/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_run_all_then_each_cell_twice_in_one_kernel(path, monkeypatch):
    run_all_then_each_twice(path, monkeypatch)
