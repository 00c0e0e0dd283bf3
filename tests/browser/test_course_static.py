"""What a learner sees before running anything, at a laptop's width, and the CacheMonitor toy.

* A freshly opened copy of a committed notebook (untrusted, nothing run) shows pictures and
  snapshots: the lifecycle diagram as an image that fits the notebook's width, the widgets as
  their static HTML snapshot, and never a raw ``HTML(value='<div …')`` repr.
* The CacheMonitor of notebook 06 is a live toy: Step runs the engine, Step is greyed out with
  a note when nothing is left, Add a request brings it back.
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

RAW_REPR = re.compile(r"\b(HTML|VBox|HBox|Button|Image|RequestStepper|SamplingExplorer)\((value|children|description)=")
WIDTH = 1000


def _notebook_text(jlab) -> str:
    return jlab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea").all_inner_texts()


@pytest.mark.parametrize("path", ["notebooks/ch04/00_overview.ipynb", "notebooks/ch04/01_request_lifecycle.ipynb",
                                  "notebooks/zh/ch04/01_request_lifecycle.ipynb"])
def test_unexecuted_notebook_shows_the_diagram_fitting_and_no_raw_widget_repr(jlab, lab, path):
    from playwright.sync_api import expect

    page = jlab.page
    page.set_viewport_size({"width": WIDTH, "height": 1100})
    jlab.open(path)  # nothing is run: the outputs are those saved in the file

    outputs = "\n".join(_notebook_text(jlab))
    assert outputs.strip(), f"{path} has no saved outputs"
    raw = RAW_REPR.search(outputs)
    assert raw is None, f"a raw widget repr is showing in {path}: {outputs[max(0, raw.start() - 80):raw.end() + 80]}"

    cell = jlab.cell(jlab.cell_index("render_diagram("))
    picture = cell.locator(".jp-OutputArea-output img").first
    expect(picture).to_be_visible(timeout=60_000)
    picture.scroll_into_view_if_needed()
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=picture.element_handle(),
                           timeout=30_000)
    fit = page.evaluate("""(img) => {
        const out = img.closest('.jp-OutputArea-output');
        const panel = img.closest('.jp-NotebookPanel');
        const r = img.getBoundingClientRect(), o = out.getBoundingClientRect(), p = panel.getBoundingClientRect();
        const scrollers = [out, img.closest('.jp-OutputArea'), img.closest('.jp-Cell'), panel.querySelector('.jp-Notebook')]
            .filter(Boolean).map(e => [e.className, e.scrollWidth, e.clientWidth]);
        return {img: [r.left, r.right, r.width], out: [o.left, o.right], panel: [p.left, p.right],
                natural: img.naturalWidth, scrollers, pageScroll: [document.documentElement.scrollWidth, window.innerWidth]};
    }""", picture.element_handle())
    assert fit["natural"] > WIDTH, fit  # the diagram is wider than the window: it must have been scaled
    assert fit["img"][1] <= fit["out"][1] + 1 and fit["img"][1] <= fit["panel"][1] + 1, fit
    assert fit["img"][0] >= fit["out"][0] - 1, fit
    for name, scroll_width, client_width in fit["scrollers"]:
        assert scroll_width <= client_width + 1, f"horizontal scroll in {name}: {fit}"
    assert fit["pageScroll"][0] <= fit["pageScroll"][1], fit
    # the last states of the lifecycle are in the picture (the file's SVG/PNG hold every state)
    edition = "zh_" if "/zh/" in path else ""
    jlab.screenshot(f"static_{edition}{path.rsplit('/', 1)[-1].replace('.ipynb', '')}_diagram_{WIDTH}px.png", cell)
    if "01_" in path:  # the stepper's saved snapshot (English or Chinese) shows until its cell runs
        stepper = jlab.cell(jlab.cell_index("RequestStepper("))
        expect(stepper.locator(".jp-OutputArea-output")).to_contain_text(
            re.compile(r"RequestStepper|snapshot|快照", re.I), timeout=30_000)


def test_cache_monitor_add_request_and_step(jlab, lab):
    from playwright.sync_api import expect

    path = "notebooks/ch04/06_finish_and_release.ipynb"
    jlab.open(path)
    jlab.command("notebook:clear-all-cell-outputs")  # saved counts would hide the new run's
    jlab.wait_for(lambda s: all(c is None for c in s["counts"]), 30, "outputs to clear")
    jlab.run_cell(jlab.cell_index("from minillm.viz import plots"), timeout=300)
    monitor_i = jlab.cell_index("plots.CacheMonitor()")
    jlab.run_cell(monitor_i, timeout=300)

    monitor = jlab.cell(monitor_i).locator(".minillm-cache-monitor")
    expect(monitor).to_be_visible(timeout=60_000)
    monitor.scroll_into_view_if_needed()
    summary = monitor.locator("code").first

    def button(label):
        return monitor.get_by_role("button", name=label, exact=True)

    def step_number() -> int:
        m = re.search(r"after step (\d+)", summary.inner_text())
        assert m, summary.inner_text()
        return int(m.group(1))

    expect(summary).to_contain_text("after step 0", timeout=30_000)
    expect(monitor).to_contain_text("2 request(s) still to run")
    expect(button("Step")).to_be_enabled()
    button("Step").click()  # one engine step: both requests are prefilled
    expect(summary).to_contain_text("after step 1", timeout=60_000)
    assert not re.search(r"\b0 of 64 blocks", summary.inner_text())
    jlab.screenshot("ch04_06_cache_monitor_running.png", monitor)

    for _ in range(10):  # Step x10 until the 40-token requests are done
        if button("Step x10").is_disabled():
            break
        before = step_number()
        button("Step x10").click()
        # the HTML widget re-renders its content: poll through the locator, not an element handle
        expect(summary).not_to_contain_text(f"after step {before}:", timeout=60_000)
    expect(button("Step")).to_be_disabled(timeout=60_000)
    expect(button("Step x10")).to_be_disabled()
    expect(monitor).to_contain_text("Nothing left to run")
    expect(summary).to_contain_text(re.compile(r"\b0 of 64 blocks in use"))
    jlab.screenshot("ch04_06_cache_monitor_idle.png", monitor)

    done = step_number()
    button("Add a request").click()  # a new request: Step comes back
    expect(monitor).to_contain_text("1 request(s) still to run", timeout=60_000)
    expect(button("Step")).to_be_enabled()
    button("Step").click()
    expect(summary).to_contain_text(f"after step {done + 1}:", timeout=60_000)
    jlab.screenshot("ch04_06_cache_monitor_added.png", monitor)
    jlab.assert_no_widget_errors()
