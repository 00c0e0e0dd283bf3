"""The saved-output check that tests/test_notebooks_rerun*.py run in place of nbval: it must
catch what nbval caught and let through what nbval let through."""

from __future__ import annotations

import copy

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output
from notebook_outputs import differences, saved_outputs


def notebook(*cells):
    return new_notebook(cells=list(cells))


def stream(text, name="stdout"):
    return new_output("stream", name=name, text=text)


def result(text, **extra):
    return new_output("execute_result", data={"text/plain": text, **extra}, execution_count=1)


def rerun(nb, **outputs_by_index):
    fresh = copy.deepcopy(nb)
    for index, outputs in outputs_by_index.items():
        fresh.cells[int(index[1:])].outputs = outputs
    return fresh


def test_equal_outputs_pass_and_a_changed_line_fails():
    nb = notebook(new_code_cell("print(1)", outputs=[stream("1\n")]), new_code_cell("2", outputs=[result("2")]))
    saved = saved_outputs(nb)
    assert differences(saved, rerun(nb)) == []
    problems = differences(saved, rerun(nb, c1=[result("3")]))
    assert len(problems) == 1 and "cell 1" in problems[0] and "text/plain" in problems[0]


def test_missing_and_extra_outputs_fail():
    nb = notebook(new_code_cell("print(1)", outputs=[stream("1\n")]))
    saved = saved_outputs(nb)
    assert differences(saved, rerun(nb, c0=[]))
    assert differences(saved, rerun(nb, c0=[stream("1\n"), stream("oops\n", name="stderr")]))


def test_ignored_cells_timings_streams_and_pictures_are_not_compared():
    nb = notebook(new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(time.time())", outputs=[stream("17.2\n")]),
                  new_code_cell("x", outputs=[stream("took 12.5 ms at 0x7f00ab\n")]),
                  new_code_cell("y", outputs=[stream("a"), stream("b\n"), stream("x\x08\rdone\n")]),
                  new_code_cell("plot()", outputs=[new_output("display_data", data={"image/png": "AAAA",
                                                                                     "text/plain": "<Figure>"})]))
    nb.cells[1].metadata["tags"] = []
    saved = saved_outputs(nb)
    fresh = rerun(nb, c0=[stream("99\n")], c1=[stream("took 3 ms at 0xdeadbeef\n")], c2=[stream("ab\ndone\n")],
                  c3=[new_output("display_data", data={"image/png": "BBBB", "text/plain": "<Figure>"})])
    assert differences(saved, fresh) == []


def test_a_tagged_cell_is_not_compared_and_a_read_notebook_round_trips(tmp_path):
    cell = new_code_cell("import random; random.random()", outputs=[result("0.1")])
    cell.metadata["tags"] = ["nbval-ignore-output"]
    nb = notebook(cell, new_code_cell("print('中文')", outputs=[stream("中文\n")]))
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, str(path))
    read = nbformat.read(str(path), as_version=4)
    saved = saved_outputs(read)
    assert list(saved) == [1]
    assert differences(saved, rerun(read, c0=[result("0.9")])) == []
    assert differences(saved, rerun(read, c1=[stream("英文\n")]))
