"""The course in a real browser: run a notebook, press the widgets' buttons, read what they show.

Both tests open a notebook in JupyterLab (Chromium, headless), run it with Run All, then act as
a learner would: click, type, run a cell, and check the text that comes back. Screenshots are
saved to $MINILLM_ARTIFACTS (default /tmp/minillm-artifacts).
"""

from __future__ import annotations

import re
import shutil

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

LIFECYCLE = "notebooks/ch04/01_request_lifecycle.ipynb"
EXERCISES = "exercises/ch04_exercises.ipynb"


def _int(text: str) -> int:
    m = re.search(r"-?\d+", text or "")
    assert m, f"expected a number, got {text!r}"
    return int(m.group())


def test_request_stepper_in_lifecycle_notebook(jlab, lab):
    from playwright.sync_api import expect

    assert (lab.root / LIFECYCLE).is_file(), f"{LIFECYCLE} is missing from the repository"
    page = jlab.page
    jlab.open(LIFECYCLE)
    jlab.run_all(timeout=600)

    stepper = page.locator(".minillm-stepper").first
    expect(stepper).to_be_visible(timeout=60_000)
    stepper.scroll_into_view_if_needed()
    state = stepper.locator(".minillm-state")
    blocks = stepper.locator(".minillm-blocks")

    def button(label: str):
        return stepper.get_by_role("button", name=label, exact=True)

    def press(label: str):
        b = button(label)
        expect(b).to_be_enabled(timeout=30_000)
        b.click()

    # Start from a fresh request whatever the notebook did with this stepper before.
    if state.inner_text().strip() != "NEW":
        press("New request")
    expect(state).to_have_text("NEW", timeout=60_000)
    assert _int(blocks.inner_text()) == 0
    for label in ("Prefill", "Decode one step", "Cancel", "Release"):
        expect(button(label)).to_be_disabled()

    press("Tokenize")  # NEW -> WAITING: token ids, still no KV block
    expect(state).to_have_text("WAITING", timeout=60_000)
    assert _int(blocks.inner_text()) == 0, "a WAITING request must hold no KV block"

    press("Prefill")  # one engine step: blocks allocated, the prompt runs, the first token is sampled
    expect(state).to_have_text("DECODE", timeout=120_000)
    after_prefill = _int(blocks.inner_text())
    assert after_prefill >= 1, "after Prefill the request must hold KV blocks"
    jlab.screenshot("ch04_01_stepper_after_prefill.png", stepper)

    status = stepper.locator(".minillm-status")
    before = status.inner_text()
    press("Decode one step")  # one more engine step: one more token, the block count can only grow
    expect(status).not_to_have_text(before, timeout=120_000)
    expect(state).to_have_text(re.compile(r"^(DECODE|FINISHED)$"))
    after_decode = _int(blocks.inner_text())
    assert after_decode >= after_prefill, (after_prefill, after_decode)

    if state.inner_text().strip() == "DECODE":
        press("Cancel")  # cancel reaches the scheduler and the cache in the same call
        expect(status).to_contain_text("CANCELLED", timeout=60_000)
    else:  # max_tokens already reached: the request waits in FINISHED for Release
        press("Release")
    expect(state).to_have_text("RELEASED", timeout=60_000)
    expect(blocks).to_have_text(re.compile(r"^\s*0\s*$"), timeout=30_000)
    for label in ("Prefill", "Decode one step", "Cancel"):
        expect(button(label)).to_be_disabled()

    jlab.screenshot("ch04_01_request_stepper.png", stepper)
    jlab.screenshot("ch04_01_request_lifecycle_page.png")
    jlab.assert_no_widget_errors()


def test_diagram_editor_exercise(jlab, lab):
    from playwright.sync_api import expect

    from minillm.grading import check

    assert (lab.root / EXERCISES).is_file(), f"{EXERCISES} is missing from the repository"
    page = jlab.page
    jlab.open(EXERCISES)
    jlab.run_all(timeout=600)

    editor_cell = jlab.cell(jlab.cell_index("DiagramEditor(", "code"))
    editor = editor_cell.locator(".jp-OutputArea-output").filter(
        has=page.get_by_role("button", name="Add / update state"))
    expect(editor).to_have_count(1, timeout=60_000)
    editor.scroll_into_view_if_needed()

    answer = {
        "states": {"WAITING": "prompt token ids and sampling params; no KV block yet",
                   "PREFILL": "KV blocks for the prompt, a batch slot"},
        "transitions": [("WAITING", "PREFILL", "scheduled")],
    }
    name_box = editor.get_by_placeholder("state name, e.g. WAITING")
    holds_box = editor.get_by_placeholder(re.compile(r"^what it holds"))
    for name, holds in answer["states"].items():
        name_box.click()
        name_box.fill(name)
        holds_box.click()
        holds_box.fill(holds)
        holds_box.press("Tab")
        editor.get_by_role("button", name="Add / update state").click()
        expect(editor).to_contain_text(f"Added state {name}.", timeout=30_000)

    src, dst, label = answer["transitions"][0]
    editor.locator(".widget-dropdown:has(> label:text-is('from')) select").select_option(label=src)
    editor.locator(".widget-dropdown:has(> label:text-is('to')) select").select_option(label=dst)
    label_box = editor.get_by_placeholder(re.compile(r"^label, e\.g\."))
    label_box.click()
    label_box.fill(label)
    label_box.press("Tab")
    editor.get_by_role("button", name="Add transition").click()
    expect(editor).to_contain_text(f"Added {src} → {dst}", timeout=30_000)
    if shutil.which("dot"):  # with Graphviz the editor draws the diagram as SVG
        expect(editor.locator("svg").first).to_be_visible(timeout=30_000)

    # What the grader says about this very diagram, graded here in Python.
    expected = check("task1_diagram", answer)
    assert 0 < expected.score < expected.max_score, expected
    score = f"{expected.score:g} / {expected.max_score:g}"

    # The learner's path: the answer cell takes the editor, the check cell grades it.
    answer_i = jlab.cell_index("task1_diagram = editor")
    check_i = jlab.cell_index('check("task1_diagram")')
    jlab.run_cell(answer_i)
    jlab.run_cell(check_i)
    out = jlab.cell(check_i).locator(".jp-OutputArea")
    expect(out).to_contain_text("partly there", timeout=60_000)
    expect(out).to_contain_text(score)
    text = out.inner_text()
    for fb in expected.feedback:
        assert fb.text in text, f"feedback line missing from the check cell: {fb.text!r}\n---\n{text}"
    assert "path WAITING → PREFILL" in text
    assert re.search(r"no state for .*decode", text, re.I), text
    jlab.screenshot("ch04_exercise1_check_cell.png", jlab.cell(check_i))

    # The editor's own button gives the same verdict.
    editor.get_by_role("button", name="Check my diagram").click()
    expect(editor).to_contain_text(score, timeout=60_000)
    jlab.screenshot("ch04_exercise1_diagram_editor.png", editor)
    jlab.assert_no_widget_errors()
