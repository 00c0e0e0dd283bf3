"""The Chinese edition in a real browser: Chinese prose that renders, and the stepper with a Chinese prompt.

A Chinese learner opens ``notebooks/zh/`` (``minillm lab --lang zh``). These tests check what
they see: headings in Chinese drawn with a real CJK font (asked of Chromium itself through the
DevTools protocol: which platform fonts drew the text, so boxes of "tofu" cannot pass), and the
RequestStepper walking a Chinese prompt through the engine with its tokens shown as characters,
never as "�". Screenshots go to $MINILLM_ARTIFACTS (look at them: the test reads the fonts, a
person reads the page).

The stepper is found by the DOM classes it promises (``minillm-stepper``, ``minillm-state``,
``minillm-blocks``, ``minillm-btn-<action>``, ``mm-chip``), not by its button labels, which are
Chinese in this edition.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

ZH_START = "notebooks/zh/README.ipynb"
ZH_LIFECYCLE = "notebooks/zh/ch04/01_request_lifecycle.ipynb"
PROMPT = "从前有一只小狐狸，它"
HAN = re.compile(r"[\u4e00-\u9fff]")
# Font families that carry Chinese glyphs (Noto/Source Han, and the usual system ones).
CJK_FAMILY = re.compile(r"CJK|Source Han|Han Sans|Han Serif|WenQuanYi|PingFang|YaHei|SimHei|SimSun|"
                        r"Hiragino|Heiti|Droid Sans Fallback|AR PL|Ming|Song|Kai", re.I)
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
# What a chip shows instead of a space or a newline (minillm.viz._common.token_text).
VISIBLE = {"␣": " ", "↵": "\n"}


def _int(text: str) -> int:
    m = re.search(r"-?\d+", text or "")
    assert m, f"expected a number, got {text!r}"
    return int(m.group())


def _cjk_font_installed() -> bool | None:
    """True/False from fontconfig; None when ``fc-list`` is not there to ask."""
    if not shutil.which("fc-list"):
        return None
    out = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=60).stdout
    return bool(out.strip())


def _need_cjk_font() -> None:
    if _cjk_font_installed() is False:
        if os.geteuid() == 0 or os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("no CJK font (fc-list :lang=zh is empty): `bash scripts/setup.sh --with-browser` "
                        "installs fonts-noto-cjk", pytrace=False)
        pytest.skip("no CJK font installed: `sudo apt-get install fonts-noto-cjk` to check Chinese rendering")


def platform_fonts(page, locator) -> list[dict]:
    """The fonts Chromium drew ``locator``'s own text with: [{familyName, glyphCount, ...}]."""
    handle = locator.element_handle()
    page.evaluate("(el) => { document.querySelectorAll('[data-mm-font-probe]').forEach("
                  "e => e.removeAttribute('data-mm-font-probe')); el.setAttribute('data-mm-font-probe', '1'); }",
                  handle)
    cdp = page.context.new_cdp_session(page)
    try:
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": "[data-mm-font-probe]"})["nodeId"]
        assert node, "the probed element left the page"
        return cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    finally:
        cdp.detach()


def assert_drawn_with_cjk_font(page, locator, what: str) -> None:
    text = locator.inner_text()
    han = len(HAN.findall(text))
    assert han, f"{what} has no Chinese characters: {text!r}"
    fonts = platform_fonts(page, locator)
    cjk = [f for f in fonts if CJK_FAMILY.search(f.get("familyName", "") + " " + f.get("postScriptName", ""))]
    assert cjk, f"{what} ({text!r}) was drawn without a CJK font, so its characters show as boxes: {fonts}"
    assert sum(f["glyphCount"] for f in cjk) >= han, (what, text, fonts)


def chip_texts(locator) -> list[dict]:
    """Each token chip under ``locator``: its class list and its text without the id below it."""
    return locator.evaluate_all("""(chips) => chips.map(c => {
        const k = c.cloneNode(true); k.querySelectorAll('small').forEach(s => s.remove());
        return {cls: c.className, text: k.textContent}; })""")


def _visible_to_text(s: str) -> str:
    for shown, real in VISIBLE.items():
        s = s.replace(shown, real)
    return s


def test_chinese_start_page_renders_chinese(jlab, lab):
    """What ``minillm lab --lang zh`` opens: Chinese headings, in a Chinese font."""
    from playwright.sync_api import expect

    assert (lab.root / ZH_START).is_file(), f"{ZH_START} is missing from the repository"
    page = jlab.page
    jlab.open(ZH_START)
    headings = page.locator(f"{NOTEBOOK} .jp-MarkdownOutput :is(h1, h2, h3)")
    expect(headings.first).to_be_visible(timeout=60_000)
    chinese = [i for i, t in enumerate(headings.all_inner_texts()) if HAN.search(t)]
    assert chinese, f"no Chinese heading on {ZH_START}: {headings.all_inner_texts()}"
    jlab.screenshot("zh_start_page.png")
    _need_cjk_font()
    assert_drawn_with_cjk_font(page, headings.nth(chinese[0]), f"the first Chinese heading of {ZH_START}")


def test_request_stepper_with_a_chinese_prompt(jlab, lab):
    from playwright.sync_api import expect

    assert (lab.root / ZH_LIFECYCLE).is_file(), f"{ZH_LIFECYCLE} is missing from the repository"
    page = jlab.page
    jlab.open(ZH_LIFECYCLE)
    jlab.run_all(timeout=600)

    # The prose is Chinese: most headings carry Chinese characters, drawn with a CJK font.
    headings = page.locator(f"{NOTEBOOK} .jp-MarkdownOutput :is(h1, h2, h3)")
    texts = headings.all_inner_texts()
    chinese = [i for i, t in enumerate(texts) if HAN.search(t)]
    assert len(chinese) >= 2 and len(chinese) * 2 >= len(texts), f"headings of {ZH_LIFECYCLE}: {texts}"
    first = headings.nth(chinese[0])
    first.scroll_into_view_if_needed()
    jlab.screenshot("zh_ch04_01_top.png")
    font_ok = _cjk_font_installed() is not False
    if font_ok:
        assert_drawn_with_cjk_font(page, first, f"the heading {texts[chinese[0]]!r}")

    stepper = page.locator(".minillm-stepper").first
    expect(stepper).to_be_visible(timeout=60_000)
    stepper.scroll_into_view_if_needed()
    state = stepper.locator(".minillm-state")
    blocks = stepper.locator(".minillm-blocks")
    status = stepper.locator(".minillm-status")

    def button(action: str):
        b = stepper.locator(f".minillm-btn-{action}")
        expect(b).to_have_count(1)
        return b

    def press(action: str):
        b = button(action)
        expect(b).to_be_enabled(timeout=30_000)
        b.click()

    # The Chinese edition's stepper speaks Chinese (labels from the viz phrase table, not copied here).
    from minillm.viz.i18n import phrase

    for action, key in (("tokenize", "btn.tokenize"), ("prefill", "btn.prefill"), ("decode-one", "btn.decode_one"),
                        ("cancel", "btn.cancel"), ("release", "btn.release")):
        expect(button(action)).to_have_text(phrase(key, "zh"))

    # A fresh request whatever the notebook did with this stepper; only then is the prompt editable.
    if state.inner_text().strip() != "NEW":
        press("new")
    expect(state).to_have_text("NEW", timeout=60_000)
    prompt_box = stepper.locator("textarea").first  # the stepper's only text area: the prompt
    expect(prompt_box).to_be_enabled(timeout=30_000)
    prompt_box.click()
    prompt_box.fill(PROMPT)
    prompt_box.press("Tab")  # leave the box, so the widget sends its value to the kernel
    expect(prompt_box).to_have_value(PROMPT)

    press("tokenize")  # NEW -> WAITING: the prompt becomes token ids, still no KV block
    expect(state).to_have_text("WAITING", timeout=60_000)
    assert _int(blocks.inner_text()) == 0, "a WAITING request must hold no KV block"
    chips = stepper.locator(".mm-chip")
    expect(chips.first).to_be_visible(timeout=30_000)
    prompt_chips = [c for c in chip_texts(chips) if "mm-prompt" in c["cls"]]
    shown = "".join(_visible_to_text(c["text"]) for c in prompt_chips)
    assert shown == PROMPT, (f"the prompt's token chips should spell the prompt in characters: {shown!r} from "
                             f"{[c['text'] for c in prompt_chips]}")
    assert len(prompt_chips) <= len(PROMPT), (f"{len(PROMPT)} Chinese characters became {len(prompt_chips)} "
                                              f"tokens: {[c['text'] for c in prompt_chips]}")
    assert "\ufffd" not in stepper.inner_text()
    assert stepper.locator(".mm-chip.mm-prompt.mm-partial").count() == 0, "a prompt character was split into bytes"
    if font_ok:
        han_chip = stepper.locator(".mm-chip.mm-prompt").filter(has_text=HAN).first
        assert_drawn_with_cjk_font(page, han_chip, "a prompt token chip")

    press("prefill")  # one engine step: KV blocks allocated, the prompt runs, the first token is sampled
    expect(state).to_have_text("DECODE", timeout=120_000)
    after_prefill = _int(blocks.inner_text())
    assert after_prefill >= 1, "after Prefill the request must hold KV blocks"
    expect(stepper.locator(".mm-chip.mm-new")).to_have_count(1, timeout=30_000)  # the first output token

    before = status.inner_text()
    press("decode-one")  # one more engine step: one more token
    expect(status).not_to_have_text(before, timeout=120_000)
    # the widget redraws its panels one after the other: wait for the token panel, not just the status line
    expect(stepper.locator(".mm-chip.mm-out, .mm-chip.mm-new")).to_have_count(2, timeout=120_000)
    expect(state).to_have_text(re.compile(r"^(DECODE|FINISHED)$"))
    assert _int(blocks.inner_text()) >= after_prefill
    outputs = [c for c in chip_texts(chips) if "mm-out" in c["cls"] or "mm-new" in c["cls"]]
    assert len(outputs) == 2, f"Prefill and one decode step make two output tokens: {outputs}"
    text = stepper.inner_text()
    assert "\ufffd" not in text, "the stepper shows '�' somewhere:\n" + text
    jlab.screenshot("zh_ch04_01_stepper_chinese_prompt.png", stepper)

    # Leave nothing allocated: cancel (or release, if max_tokens was already reached).
    press("cancel" if state.inner_text().strip() == "DECODE" else "release")
    expect(state).to_have_text("RELEASED", timeout=60_000)
    expect(blocks).to_have_text(re.compile(r"^\s*0\s*$"), timeout=30_000)
    jlab.assert_no_widget_errors()
