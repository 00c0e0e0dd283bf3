"""A repeated walkthrough cell and Kernel -> Interrupt read as a sentence in the learner's
language (minillm.viz.friendly_errors), and every other error keeps its traceback."""

from __future__ import annotations

import pytest

from minillm import LLM, IllegalTransition, SamplingParams
from minillm.viz import friendly_errors, set_language

IPython = pytest.importorskip("IPython")


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    assert friendly_errors.install(sh)
    sh.user_ns["llm"] = LLM(block_size=4, num_kv_blocks=16)
    sh.user_ns["SamplingParams"] = SamplingParams
    yield sh
    set_language("en")
    InteractiveShell.clear_instance()


def test_enqueue_twice_explains_the_edge(shell, capsys):
    shell.run_cell("req = llm.new_request('Once upon a time', SamplingParams(max_tokens=2))\nllm.enqueue(req)")
    capsys.readouterr()
    result = shell.run_cell("llm.enqueue(req)")
    assert isinstance(result.error_in_exec, IllegalTransition)  # still an error: Run All stops here
    out = capsys.readouterr().out
    assert "WAITING → WAITING" in out and "NEW → WAITING, once" in out and "run the cell that creates" in out
    assert "Traceback" not in out and "move_to" not in out


def test_in_chinese(shell, capsys):
    set_language("zh")
    shell.run_cell("req = llm.new_request('从前', SamplingParams(max_tokens=2))\nllm.enqueue(req)\nllm.enqueue(req)")
    out = capsys.readouterr().out
    assert "已经处在 WAITING" in out and "只能做一次" in out and "Traceback" not in out


def test_interrupt_is_one_sentence(shell, capsys):
    result = shell.run_cell("raise KeyboardInterrupt")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    out = capsys.readouterr().out
    assert "Interrupted" in out and "no block lost" in out and "Traceback" not in out


def test_other_errors_keep_their_traceback(shell, capsys):
    shell.run_cell("1 / 0")
    captured = capsys.readouterr()
    assert "ZeroDivisionError" in captured.out + captured.err and "Interrupted" not in captured.out


def test_explain_leaves_other_errors_alone():
    assert friendly_errors.explain(ValueError("x")) is None
    assert friendly_errors.explain(IllegalTransition("no edge")) is None  # raised without its edge
