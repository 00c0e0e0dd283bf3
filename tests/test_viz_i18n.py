"""The course's views in English and Chinese: the language setting, the phrase tables, Chinese
token text in the stepper, and a CJK font for the figures."""

from __future__ import annotations

import io
import re
import string
import warnings
from pathlib import Path

import pytest

from minillm import SamplingParams
from minillm.viz import i18n

HAN = re.compile(r"[\u4e00-\u9fff]")
ZH_PROMPT = "从前有一只小狐狸，它"


@pytest.fixture(autouse=True)
def english_again():
    """Every test starts and ends with the course-wide default."""
    i18n.set_language("en")
    yield
    i18n.set_language("en")


@pytest.fixture
def llm(default_llm_factory):
    return default_llm_factory(block_size=4, num_kv_blocks=64)


def visible_text(html: str) -> str:
    import html as _html

    return _html.unescape(re.sub(r"<style>.*?</style>|<[^>]+>", " ", html, flags=re.S))


# ---------------------------------------------------------------------------------------------
# the setting and the tables
# ---------------------------------------------------------------------------------------------

def test_set_language_validates_and_is_the_default_for_every_view():
    from minillm.viz import get_language, set_language
    from minillm.viz.stepper import RequestStepperCore

    assert get_language() == "en"
    for bad in ("fr", "ZH", "", None, 1):
        with pytest.raises(ValueError, match=r"lang must be one of 'en', 'zh'"):
            set_language(bad)
    assert get_language() == "en"
    set_language("zh")
    assert get_language() == "zh" and i18n.resolve_lang(None) == "zh" and i18n.resolve_lang("en") == "en"
    with pytest.raises(ValueError, match="lang"):
        RequestStepperCore(llm=object(), lang="de")


def test_bad_lang_is_rejected_by_plots_diagram_and_events(tiny_llm):
    from minillm.viz import describe_event, diagram_html, plots

    tiny_llm.generate(["Once upon a time"], SamplingParams(max_tokens=3, temperature=0.0))
    with pytest.raises(ValueError, match="lang"):
        plots.plot_kv_timeline(plots.kv_timeline(tiny_llm.trace), lang="fr")
    with pytest.raises(ValueError, match="lang"):
        plots.CacheMonitor(tiny_llm, lang="english")
    with pytest.raises(ValueError, match="lang"):
        diagram_html("DECODE", lang="cn")
    with pytest.raises(ValueError, match="lang"):
        describe_event(tiny_llm.trace[0], lang="jp")


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


def test_every_phrase_has_its_twin_with_the_same_fields():
    en, zh = i18n.PHRASES["en"], i18n.PHRASES["zh"]
    assert set(i18n.PHRASES) == set(i18n.LANGUAGES)
    assert sorted(set(en) - set(zh)) == [], "English phrases without a Chinese twin"
    assert sorted(set(zh) - set(en)) == [], "Chinese phrases without an English twin"
    for key in en:
        assert en[key].strip() and zh[key].strip(), key
        assert _fields(en[key]) == _fields(zh[key]), f"{key}: the two languages fill in different fields"
    # the Chinese table is Chinese (a few phrases are names such as "Token" or "top-p (off)")
    chinese = [k for k in zh if HAN.search(zh[k])]
    assert len(chinese) >= 0.9 * len(zh)
    assert not any(HAN.search(v) for v in en.values())


def test_every_phrase_the_code_names_is_in_the_table():
    """Literal keys in the code (f-string keys such as f"btn.{action}" are covered by the views'
    tests below) exist, so no view can fail on a missing phrase."""
    root = Path(i18n.__file__).parent
    named = set()
    for path in root.glob("*.py"):
        named |= set(re.findall(r"""(?:phrase|L|T)\(\s*["']([a-z_0-9]+\.[A-Za-z_0-9.]+)["']""", path.read_text()))
    assert named, "no phrase keys found in the code"
    assert sorted(named - set(i18n.PHRASES["en"])) == []


def test_state_holds_follows_the_course_language():
    from minillm.viz import STATE_HOLDS
    from minillm.viz.diagram import state_holds

    assert "waiting queue" in STATE_HOLDS["WAITING"]
    i18n.set_language("zh")
    assert "等待队列" in STATE_HOLDS["WAITING"]
    assert state_holds("en")["RELEASED"].startswith("nothing")
    assert set(STATE_HOLDS) == {"NEW", "WAITING", "PREFILL", "DECODE", "PREEMPTED", "FINISHED", "RELEASED"}


# ---------------------------------------------------------------------------------------------
# the stepper
# ---------------------------------------------------------------------------------------------

def test_stepper_speaks_chinese_with_lang_zh_and_english_with_en(llm):
    pytest.importorskip("ipywidgets")
    from minillm.viz import RequestStepper

    zh = RequestStepper(llm, prompt="Once upon a time", lang="zh")
    assert [b.description for b in zh.buttons.values()] == ["分词", "预填充", "解码一步", "运行到结束", "取消", "释放",
                                                            "新请求"]
    assert zh.buttons["Prefill"] is zh.buttons["预填充"] is zh.buttons["prefill"]
    zh.buttons["分词"].click()
    zh.buttons["预填充"].click()
    assert zh.core.state.value == "DECODE"
    log = visible_text(zh.events_view.value)
    n_prompt = len(zh.core.req.prompt_token_ids)
    blocks = len(zh.core.req.block_table)
    assert f"预填充：一次前向算完 {n_prompt} 个提示 token，分配 {blocks} 个 KV 块，采样出第一个 token「" in log
    assert "现在处于 DECODE，持有：" in log
    assert "状态" in zh.status.value and "占用 KV 块" in zh.status.value
    assert "KV 缓存池" in zh.blocks.value and "下一个 token 的候选" in zh.cands.value
    assert "分词 + 入队" in zh.diagram.value
    for html in (zh.events_view.value, zh.blocks.value, zh.cands.value, zh.status.value):
        text = visible_text(html)
        for english in ("request ", "holds", "What ", "KV cache pool", "blocks in use", "sampled"):
            assert english not in text, (english, text[:300])
    assert "快照" in zh._repr_mimebundle_()["text/html"]

    en = RequestStepper(llm, prompt="Once upon a time", lang="en")
    assert en.buttons["Tokenize"].description == "Tokenize"
    en.buttons["Tokenize"].click()
    en.buttons["Prefill"].click()
    log = visible_text(en.events_view.value)
    assert "Prefill: one forward pass over" in log and "first token '" in log
    for html in (en.events_view.value, en.blocks.value, en.cands.value, en.status.value, en.tokens.value):
        text = visible_text(html)  # token text may be Chinese (a bilingual model): look for our words only
        for chinese in ("请求", "状态", "KV 块", "候选", "引擎", "采样出", "持有"):
            assert chinese not in text, (chinese, text[:300])
    assert not HAN.search(visible_text(en.blocks.value + en.status.value))


def test_the_course_setting_picks_the_stepper_language(llm):
    pytest.importorskip("ipywidgets")
    from minillm.viz import RequestStepper, set_language

    set_language("zh")
    assert RequestStepper(llm).buttons["tokenize"].description == "分词"
    assert RequestStepper(llm, lang="en").buttons["tokenize"].description == "Tokenize"


def test_describe_event_in_chinese(tiny_llm):
    from minillm.viz import describe_event

    out = tiny_llm.generate(["Once upon a time"], SamplingParams(max_tokens=2, temperature=0.0))[0]
    lines = [describe_event(e, tiny_llm.tokenizer, lang="zh") for e in tiny_llm.trace]
    rid = out.request_id
    assert f"请求 {rid}：NEW -> WAITING，分词得到" in "\n".join(lines)
    assert any(line.startswith("引擎第 1 步：1 个预填充 + 0 个解码") for line in lines)
    assert any("FINISHED -> RELEASED" in line and "个 KV 块回到池中" in line for line in lines)
    assert any("采样出输出 token #0" in line and "「" in line for line in lines)
    en = [describe_event(e, tiny_llm.tokenizer) for e in tiny_llm.trace]
    assert any("tokenized into" in line for line in en) and not any(HAN.search(line) for line in en)


def _check_chinese_tokens(core, prompt):
    tok = core.llm.tokenizer
    core.tokenize(prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    core.run_to_end()
    prompt_pieces, output_pieces = core.prompt_pieces(), core.output_pieces()
    for p in prompt_pieces:
        assert "\ufffd" not in p.label and "\ufffd" not in p.text, p
    for p in output_pieces:  # a random test model may sample bytes that never make a character
        assert "\ufffd" not in p.label, p
    # the text each token adds joins to the decoded text, characters and all
    assert "".join(p.text for p in prompt_pieces) == tok.decode(core.req.prompt_token_ids, skip_special_tokens=False)
    assert "".join(p.text for p in output_pieces) == core.req.text
    shown = "".join(p.label for p in prompt_pieces)
    for ch in prompt:
        assert ch in shown, ch
    # a character split over byte tokens: its pieces are marked, with their bytes
    for p in prompt_pieces:
        if p.partial:
            assert re.fullmatch(r"‹[0-9A-F]{2}( [0-9A-F]{2})*›.*", p.label), p.label
    from minillm.viz.stepper import tokens_html

    chips = tokens_html(core).split("margin-top:3px")[0]  # the chips, not the request's own text line
    assert "狐" in chips and not re.search(r">[^<]*\ufffd", chips)  # no '�' on a chip (a tooltip may name it)
    html = chips
    if any(p.partial for p in prompt_pieces):
        assert "一个汉字的一部分（UTF-8 字节）" in html


def test_chinese_prompt_shows_characters_on_the_shipped_tokenizer(llm):
    from minillm.viz.stepper import RequestStepperCore

    _check_chinese_tokens(RequestStepperCore(llm, lang="zh"), ZH_PROMPT)


def test_chinese_prompt_shows_characters_where_chinese_falls_to_bytes(tiny_llm):
    """The test model's tokenizer learned English only: every Chinese character is 3 byte tokens."""
    from minillm.viz.stepper import RequestStepperCore

    core = RequestStepperCore(tiny_llm, lang="zh")
    _check_chinese_tokens(core, ZH_PROMPT)
    partial = [p for p in core.prompt_pieces() if p.partial]
    assert len(partial) >= 2 * len(ZH_PROMPT)
    assert "".join(p.completes for p in partial if p.text) == ZH_PROMPT
    pytest.importorskip("ipywidgets")
    from minillm.viz.stepper import language_notice

    notice = language_notice(core.prompt_pieces(), "zh")
    assert f"{len(ZH_PROMPT)} 个字符" in notice and "字节 token" in notice
    assert language_notice(RequestStepperCore(tiny_llm).prompt_pieces(), "en") == ""


def test_a_request_cut_in_the_middle_of_a_character_shows_no_replacement_char(tiny_llama):
    from minillm.viz._common import token_pieces
    from conftest import make_tokenizer  # noqa: F401  (the same English-only byte-level tokenizer)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama[0]))
    ids = tok.encode("狐狸", add_special_tokens=False)
    assert len(ids) == 6
    cut = token_pieces(tok, ids[:4])  # 狐 and the first byte of 狸
    assert "".join(p.text for p in cut) == "狐"
    assert [p.partial for p in cut] == [True] * 4 and cut[-1].label == "‹E7›" and cut[-1].completes == ""
    assert token_pieces(tok, ids[:1])[0].label == "‹E7›"
    from minillm.viz import token_text

    assert token_text(tok, ids[0]) == "‹E7›"  # not '�'


def _byte_fallback_tokenizer():
    """A SentencePiece-style tokenizer (Llama-2 family): letters only, anything else as <0xNN> tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1}
    vocab.update({f"<0x{i:02X}>": i + 2 for i in range(256)})
    for ch in "▁" + string.ascii_letters + ".,":
        vocab[ch] = len(vocab)
    vocab["▁a"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "a")], byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def test_token_pieces_on_sentencepiece_byte_fallback():
    from minillm.viz._common import token_pieces

    tok = _byte_fallback_tokenizer()
    ids = tok.encode("a fox 狐狸 ran", add_special_tokens=False)
    assert "<0xE7>" in tok.convert_ids_to_tokens(ids)
    pieces = token_pieces(tok, ids)
    assert "".join(p.text for p in pieces) == tok.decode(ids) == "a fox 狐狸 ran"
    assert [p.label for p in pieces if p.partial] == ["‹E7›", "‹8B›", "‹90›狐", "‹E7›", "‹8B›", "‹B8›狸"]
    # decoded after its context, a piece keeps the space SentencePiece would drop at the start
    tail = token_pieces(tok, ids[5:], context=ids[:5])
    assert "".join(p.text for p in tail) == " 狐狸 ran"


# ---------------------------------------------------------------------------------------------
# diagram, plots, monitor, explorer
# ---------------------------------------------------------------------------------------------

def test_diagram_in_both_languages_with_a_chinese_font_stack():
    pytest.importorskip("graphviz")
    from minillm.viz import diagram_html

    zh = diagram_html("WAITING", ("NEW", "WAITING"), lang="zh")
    en = diagram_html("WAITING", ("NEW", "WAITING"), lang="en")
    if "minillm-diagram-fallback" in zh:
        pytest.skip("Graphviz's dot program is not installed")
    assert "分词 + 入队" in zh and "释放：" in zh and "WAITING" in zh
    assert "tokenize + enqueue" in en and not HAN.search(en)
    for svg in (zh, en):
        assert "Noto Sans CJK SC" in svg and "Microsoft YaHei" in svg
        assert 'font-family="Helvetica,sans-Serif"' not in svg


def _titles(fig) -> str:
    parts = []
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        legend = ax.get_legend()
        if legend is not None:
            parts += [t.get_text() for t in legend.get_texts()]
        parts += [t.get_text() for t in ax.get_yticklabels()]
    return " | ".join(parts)


def test_plots_label_in_the_language_asked(tiny_llm):
    from minillm.viz import plots

    tiny_llm.generate(["Once upon a time", "The robot"], SamplingParams(max_tokens=5, temperature=0.0))
    samples, grid = plots.kv_timeline(tiny_llm.trace), plots.state_grid(tiny_llm.trace)
    rows = plots.request_latencies(tiny_llm.trace)
    figs = {
        "kv": lambda lang: plots.plot_kv_timeline(samples, lang=lang),
        "states": lambda lang: plots.plot_state_timeline(grid, lang=lang),
        "steps": lambda lang: plots.plot_step_durations(plots.step_timings(tiny_llm.trace), lang=lang),
        "lat": lambda lang: plots.plot_ttft_tpot(rows, lang=lang),
        "times": lambda lang: plots.plot_token_times(tiny_llm.trace, lang=lang),
        "compare": lambda lang: plots.compare_timelines({"a": grid, "b": grid}, lang=lang),
    }
    for name, make in figs.items():
        zh, en = _titles(make("zh")), _titles(make("en"))
        assert HAN.search(zh), (name, zh)
        assert not HAN.search(en), (name, en)
    assert "引擎步" in _titles(figs["kv"]("zh")) and "engine step" in _titles(figs["kv"]("en"))
    i18n.set_language("zh")
    assert "请求状态随引擎步的变化" in _titles(plots.plot_state_timeline(grid))


def test_cache_monitor_in_chinese(tiny_llm):
    from minillm.viz import plots

    mon = plots.CacheMonitor(tiny_llm, lang="zh")
    assert "已用 0 / 64 个块" in mon.summary() and "每个 token" in mon.summary()
    assert "请按「添加请求」" in mon.note()
    pytest.importorskip("ipywidgets")
    assert [b.description for b in mon.widget.children[0].children] == ["添加请求", "单步", "走 10 步", "刷新"]


def test_sampling_explorer_in_chinese(default_llm_factory):
    pytest.importorskip("ipywidgets")
    from minillm.viz import SamplingExplorer

    llm = default_llm_factory(block_size=4, num_kv_blocks=16)
    ex = SamplingExplorer(llm, prompt=ZH_PROMPT, lang="zh", top_k=10)
    assert "上下文" in ex.context.value and "剩余 token" in ex.info.value and "引擎会用种子 0 采样出" in ex.info.value
    assert "\ufffd" not in ex.context.value and "狐" in ex.context.value
    assert ex.buttons["Append sampled token"].description == "追加采样的 token"
    assert ex.core.stages()[2].label == "top-k（k=10）"
    ex.buttons["Append sampled token"].click()
    assert len(ex.core.appended) == 1


# ---------------------------------------------------------------------------------------------
# fonts
# ---------------------------------------------------------------------------------------------

def _render(fig) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(io.BytesIO(), format="png", dpi=40)
    return [str(w.message) for w in caught]


def test_chinese_figures_render_without_missing_glyphs(tiny_llm):
    from minillm.viz import fonts, plots

    font = fonts.find_cjk_font()
    if font is None:
        pytest.skip("no CJK font installed (e.g. `apt install fonts-noto-cjk`): Chinese figures show boxes")
    tiny_llm.generate(["Once upon a time"], SamplingParams(max_tokens=4, temperature=0.0))
    fig = plots.plot_state_timeline(plots.state_grid(tiny_llm.trace), lang="zh", title="狐狸的请求")
    messages = _render(fig)
    assert not [m for m in messages if "missing from font" in m], messages
    # the same figure without the fallback does miss glyphs: the check can fail
    from matplotlib.figure import Figure

    bare = Figure()
    bare.subplots().set_title("狐狸的请求")
    assert [m for m in _render(bare) if "missing from font" in m]
    # axes made outside the font context (ax=...) get the fallback too
    outside = Figure()
    ax = outside.subplots()
    plots.plot_state_timeline(plots.state_grid(tiny_llm.trace), ax=ax, lang="zh")
    assert not [m for m in _render(outside) if "missing from font" in m]
    # English figures keep their usual font first
    with fonts.figure_fonts():
        import matplotlib

        assert matplotlib.rcParams["font.family"][-1] == font
        assert matplotlib.rcParams["font.family"][0] != font


def test_without_a_cjk_font_figures_still_render_and_say_what_to_install(monkeypatch, tiny_llm):
    from minillm.viz import fonts, plots

    monkeypatch.setattr(fonts, "find_cjk_font", lambda **_: None)
    monkeypatch.setattr(fonts, "_warned", False)
    tiny_llm.generate(["Once upon a time"], SamplingParams(max_tokens=3, temperature=0.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = plots.plot_kv_timeline(plots.kv_timeline(tiny_llm.trace), lang="zh")
        plots.plot_kv_timeline(plots.kv_timeline(tiny_llm.trace), lang="zh")
    ours = [str(w.message) for w in caught if "CJK font" in str(w.message)]
    assert len(ours) == 1 and "fonts-noto-cjk" in ours[0]
    _render(fig)  # no exception
