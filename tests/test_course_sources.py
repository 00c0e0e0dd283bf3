"""The English and Chinese notebooks come from one source each and cannot drift apart.

``course/<path>.md`` holds a notebook's prose in both languages and its code once;
``scripts/build_notebooks.py`` writes ``notebooks/<path>.ipynb`` and ``notebooks/zh/<path>.ipynb``.
These tests hold the committed notebooks to their sources and the sources to the format."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
HAN = re.compile(r"[\u4e00-\u9fff]")


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "scripts" / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_notebooks"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


build = _builder()
SOURCES = build.sources()
IDS = [str(p.relative_to(build.SOURCES)) for p in SOURCES]


def test_every_chapter_notebook_has_a_source():
    have = {p.relative_to(ROOT / "notebooks").with_suffix(".md") for p in (ROOT / "notebooks").rglob("*.ipynb")
            if "zh" not in p.relative_to(ROOT / "notebooks").parts[:1] and ".ipynb_checkpoints" not in p.parts}
    assert have <= {p.relative_to(build.SOURCES) for p in SOURCES}, "an English notebook without a course/ source"
    assert len([p for p in SOURCES if p.parent.name == "ch04"]) >= 7


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_committed_notebooks_match_their_source(source):
    """Both editions hold exactly the cells the source gives (outputs are nbval's business)."""
    cells = build.parse(source)
    for lang in build.LANGS:
        path = build.target(source, lang)
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run scripts/build_notebooks.py --execute"
        wanted = build.notebook(source, lang, cells)
        assert build.up_to_date(path, wanted), (
            f"{path.relative_to(ROOT)} differs from {source.relative_to(ROOT)}: run scripts/build_notebooks.py --execute")


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_editions_share_their_code(source):
    """Most code is shared, so the two editions run the same engine code; Chinese prose is Chinese."""
    cells = build.parse(source)
    for lang in build.LANGS:
        code = [c for c in cells if c.kind == "code" and c.lang in (None, lang)
                and not (c.lang and "set_language(" in c.text and c.text.count("\n") < 3)]  # the zh switch
        shared = [c for c in code if c.lang is None]
        if len(code) >= 4:
            assert len(shared) >= 0.6 * len(code), (
                f"{source.name}: only {len(shared)} of the {lang} edition's {len(code)} code cells are shared")
    zh = build.cells_for(cells, "zh")
    en = build.cells_for(cells, "en")
    zh_prose = "".join(t for k, t in zh if k == "markdown")
    en_prose = "".join(t for k, t in en if k == "markdown")
    plain = re.sub(r"```.*?```|`[^`]*`|\]\([^)]*\)|<[^>]+>|\s", "", zh_prose, flags=re.S)
    assert len(HAN.findall(plain)) >= 0.2 * len(plain), f"{source.name}: the Chinese prose is mostly not Chinese"
    assert len(HAN.findall(zh_prose)) > 2 * len(HAN.findall(en_prose))


def test_chinese_notebooks_switch_the_widgets_to_chinese():
    for source in SOURCES:
        cells = build.cells_for(build.parse(source), "zh")
        code = "\n".join(t for k, t in cells if k == "code")
        if "minillm" in code and ("viz" in code or "Stepper" in code or "plot_" in code):
            assert re.search(r"set_language\(\s*['\"]zh['\"]\s*\)|lang\s*=\s*['\"]zh['\"]", code), source.name


def test_the_format_is_checked(tmp_path, monkeypatch):
    """A paragraph without its twin, a stray marker and Chinese prose without Chinese do not build."""
    bad = {
        "<!-- md en -->\nHello\n\n<!-- code -->\nx = 1\n": "twin",
        "<!-- md zh -->\n你好\n": "follow",
        "<!-- md en -->\nHello\n<!-- md zh -->\nHello again\n": "no Chinese",
        "<!-- md en -->\nHello\n<!-- md zh -->\n你好\n<!-- code fr -->\nx = 1\n": "malformed",
        "text first\n<!-- code -->\nx = 1\n": "before the first",
    }
    for text, why in bad.items():
        path = tmp_path / "x.md"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(build.SourceError, match=why):
            build.parse(path)
    path = tmp_path / "ok.md"
    path.write_text("<!-- md en -->\nHello\n<!-- md zh -->\n你好\n<!-- code -->\nx = 1\n<!-- code zh -->\n"
                    "from minillm.viz import set_language\n", encoding="utf-8")
    cells = build.parse(path)
    assert build.cells_for(cells, "en") == [("markdown", "Hello"), ("code", "x = 1")]
    assert build.cells_for(cells, "zh") == [("markdown", "你好"), ("code", "x = 1"),
                                            ("code", "from minillm.viz import set_language")]


def test_a_stale_notebook_is_reported(tmp_path, monkeypatch):
    src = tmp_path / "course" / "ch04" / "x.md"
    src.parent.mkdir(parents=True)
    src.write_text("<!-- md en -->\nHello\n<!-- md zh -->\n你好\n<!-- code -->\nx = 1\n", encoding="utf-8")
    monkeypatch.setattr(build, "ROOT", tmp_path)
    monkeypatch.setattr(build, "SOURCES", tmp_path / "course")
    assert build.main([]) == 0
    assert (tmp_path / "notebooks" / "ch04" / "x.ipynb").is_file()
    assert (tmp_path / "notebooks" / "zh" / "ch04" / "x.ipynb").is_file()
    assert build.main(["--check"]) == 1  # built but never executed: --check says so
    for lang_dir in ("", "zh/"):
        path = tmp_path / "notebooks" / f"{lang_dir}ch04" / "x.ipynb"
        nb = nbformat.read(str(path), as_version=4)
        nb.cells[-1].execution_count = 1  # as if executed
        nbformat.write(nb, str(path))
    assert build.main(["--check"]) == 0
    src.write_text(src.read_text(encoding="utf-8").replace("x = 1", "x = 2"), encoding="utf-8")
    assert build.main(["--check"]) == 1
    nb = nbformat.read(str(tmp_path / "notebooks" / "zh" / "ch04" / "x.ipynb"), as_version=4)
    assert nb.metadata["minillm"]["lang"] == "zh"


def test_say_is_written_as_each_editions_own_string():
    """A shared code cell's say("English", "中文") becomes the edition's literal: no say() and no
    sentence of the other language in a notebook; strings joined over lines stay valid Python."""
    src = ('x = say("a", "甲")\n'
           'print(say(f"n={1}: "\n'
           '          f"more", f"中 {2}"))\n'
           'y = say("b"\n'
           '        "c", "乙")\n'
           'd = {say("k", "键"): 1}\n')
    en, zh = build.edition_code(src, "en"), build.edition_code(src, "zh")
    assert "say(" not in en + zh and not HAN.search(en) and "a" not in zh.replace("lang", "")
    assert en.splitlines()[1:3] == ['print(f"n={1}: "', '      f"more")']
    ns_en, ns_zh = {}, {}
    exec(compile(en, "en", "exec"), ns_en)
    exec(compile(zh, "zh", "exec"), ns_zh)
    assert (ns_en["x"], ns_en["y"], ns_en["d"]) == ("a", "bc", {"k": 1})
    assert (ns_zh["x"], ns_zh["y"], ns_zh["d"]) == ("甲", "乙", {"键": 1})
    with pytest.raises(build.SourceError, match="two string literals"):
        build.edition_code('say(name, "名")', "en")
    for source in SOURCES:  # no notebook shows say() to a learner
        for lang in build.LANGS:
            code = [t for k, t in build.cells_for(build.parse(source), lang) if k == "code"]
            assert not any(re.search(r"\bsay\(", t) for t in code), f"{source.name} ({lang}) still calls say()"
