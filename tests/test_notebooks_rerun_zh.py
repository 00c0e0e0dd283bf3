"""The Chinese edition (``notebooks/zh/``): Run All with its saved outputs compared, then the cells
of its own twice, in one kernel; in a file of its own so that pytest-xdist runs the two editions on
different workers.

Both editions are built from one source per notebook (``scripts/build_notebooks.py``): a shared
code cell is one program, written once, whose printed sentences and plot titles are
``say("English", "中文")`` — the build keeps one string in each notebook. The English edition's
test (``test_notebooks_rerun.py``) runs every such program again after the whole notebook and
twice in a row; running it a third and fourth time here, with other sentences, would re-check the
same code. So here every cell runs once (Run All, outputs compared with the saved ones: the
Chinese prompts, token counts and plots all run), and the re-run rounds run again only the cells
that are this edition's own: ``<!-- code zh -->`` cells (prompts, ``set_language("zh")``) and
any shared cell whose two editions differ in more than their string literals (an f-string of
other expressions), or that no longer matches its source. A zh notebook with no source (the
exercises: ``scripts/build_exercises.py``) re-runs every cell.
"""

from __future__ import annotations

import ast

import nbformat
import pytest
from test_course_sources import build as builder
from test_notebooks_rerun import ALL_NOTEBOOKS, NOTEBOOKS as EN_NOTEBOOKS, ROOT, run_all_then_each_twice

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

ZH = ROOT / "notebooks" / "zh"
NOTEBOOKS = [p for p in ALL_NOTEBOOKS if p.is_relative_to(ZH)]


def program(source: str) -> str:
    """The cell's code with the text of its string literals blanked (f-string expressions and
    format specs kept): two cells with the same program differ only in what they print or draw."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    specs = [n.format_spec for n in ast.walk(tree) if isinstance(n, ast.FormattedValue) and n.format_spec]
    in_specs = {id(part) for spec in specs for part in ast.walk(spec)}
    for node in ast.walk(tree):
        if id(node) in in_specs:
            continue
        if isinstance(node, ast.JoinedStr):  # keep its expressions, in order
            node.values = [v for v in node.values if isinstance(v, ast.FormattedValue)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def cells_to_rerun(nb, build) -> set[int] | None:
    """Indices of the zh notebook's code cells the re-run rounds run (None: all of them)."""
    source = nb.metadata.get("minillm", {}).get("source")
    if not source or not (ROOT / source).is_file():
        return None
    cells = [c for c in build.parse(ROOT / source) if c.lang in (None, "zh")]
    if len(cells) != len(nb.cells):
        return None
    again = set()
    for index, (cell, written) in enumerate(zip(cells, nb.cells)):
        if cell.kind != "code":
            continue
        zh, en = build.edition_code(cell.text, "zh"), build.edition_code(cell.text, "en")
        if cell.lang == "zh" or written.source != zh or program(zh) != program(en):
            again.add(index)
    return again


@pytest.fixture(scope="module")
def build():
    return builder


def test_there_are_chinese_notebooks():
    assert NOTEBOOKS, "no notebooks under notebooks/zh/"


def test_every_english_notebook_has_a_chinese_twin():
    assert {ROOT / "notebooks" / p.relative_to(ZH) for p in NOTEBOOKS} >= set(EN_NOTEBOOKS)


def test_program_ignores_only_the_text_of_string_literals():
    assert program('print(f"{n:>4d} tokens", "x")') == program('print(f"{n:>4d} 个 token", "y")')
    assert program('print(f"{n:>4d}")') != program('print(f"{n:4d}")')  # a format spec is code
    assert program('print(f"{n}")') != program('print(f"{m}")')
    assert program("x = 1") != program("x = 2")


def test_the_cells_of_the_chinese_edition_are_re_run(build):
    """Its own cells, a shared cell that differs in more than text, a cell its source no longer
    has; not the shared programs (the English test re-runs them)."""
    rerun = {}
    for path in NOTEBOOKS:
        nb = nbformat.read(str(path), as_version=4)
        rerun[path.relative_to(ZH).as_posix()] = cells_to_rerun(nb, build)
        again = rerun[path.relative_to(ZH).as_posix()]
        if again is not None:
            lang_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "set_language" in c.source]
            assert lang_cells and set(lang_cells) <= again, path
            assert len(again) < sum(c.cell_type == "code" for c in nb.cells), path
    assert rerun["ch04/ch04_exercises.ipynb"] is None
    nb = nbformat.read(str(ZH / "ch04" / "00_overview.ipynb"), as_version=4)
    shared = min(i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                 and i not in rerun["ch04/00_overview.ipynb"])
    nb.cells[shared].source += "\n# edited after the build"
    assert shared in cells_to_rerun(nb, build)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_run_all_then_each_cell_twice_in_one_kernel(path, monkeypatch, build):
    again = cells_to_rerun(nbformat.read(str(path), as_version=4), build)
    run_all_then_each_twice(path, monkeypatch, again=again)
