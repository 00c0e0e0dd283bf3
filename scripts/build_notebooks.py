#!/usr/bin/env python
"""Build the English and the Chinese course notebooks from one source per notebook.

Each notebook is written once, in ``course/<path>.md``, with its prose in both languages and its
code cells shared, and this script writes ``notebooks/<path>.ipynb`` (English) and
``notebooks/zh/<path>.ipynb`` (Chinese). The two editions therefore cannot drift apart: a code
change lands in both, and a paragraph without its other-language twin does not build.

    .venv/bin/python scripts/build_notebooks.py              # write the notebooks whose cells changed
    .venv/bin/python scripts/build_notebooks.py --execute    # ... and execute those, and any never executed
    .venv/bin/python scripts/build_notebooks.py --check      # exit 1 if a notebook is out of date or unexecuted
    .venv/bin/python scripts/build_notebooks.py --convert notebooks/ch04/01_x.ipynb   # start a source

The source format is Markdown with a marker line before each cell (an HTML comment, so the
source still reads well as Markdown)::

    <!-- md en -->        prose for the English notebook
    <!-- md zh -->        its Chinese twin: must follow an "md en" cell directly
    <!-- md -->           a Markdown cell shared by both (a table of numbers, a picture)
    <!-- code -->         a code cell shared by both
    <!-- code en -->      a code cell only in the English notebook ...
    <!-- code zh -->      ... only in the Chinese one (prompts, printed sentences, lang="zh")

A printed sentence in a shared code cell may be written ``say("English", "中文")``: the build
writes only the edition's own string into its notebook (a learner reads one language, with no
``say`` in sight). Both arguments must be string literals (f-strings included).

A notebook whose cells are unchanged is left alone, so its committed outputs stay; one whose
cells changed is rewritten without outputs and must be executed again (``--execute``).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "course"
LANGS = ("en", "zh")
MARKER = re.compile(r"^<!-- (md|code)(?: (en|zh))? -->$")
_HAN = re.compile(r"[\u4e00-\u9fff]")

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                 "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3"}


class SourceError(ValueError):
    """A course source that does not build; the message names the file and the line."""


@dataclass(frozen=True)
class Cell:
    kind: str          # "md" or "code"
    lang: str | None   # None: in both notebooks
    text: str
    line: int          # 1-based line of the marker, for error messages


def parse(path: Path) -> list[Cell]:
    """The cells of one source file, checked: every English paragraph has its Chinese twin."""
    lines = path.read_text(encoding="utf-8").splitlines()
    cells: list[Cell] = []
    head: tuple[str, str | None, int] | None = None
    body: list[str] = []

    def close():
        if head is None:
            if "".join(body).strip():
                raise SourceError(f"{path}:1: text before the first cell marker (start with '<!-- md en -->')")
            return
        text = "\n".join(body).strip("\n")
        if not text.strip():
            raise SourceError(f"{path}:{head[2]}: empty cell")
        cells.append(Cell(head[0], head[1], text, head[2]))

    for number, line in enumerate(lines, 1):
        m = MARKER.match(line.rstrip())
        if m:
            close()
            head, body = (m.group(1), m.group(2), number), []
        elif line.lstrip().startswith("<!-- md") or line.lstrip().startswith("<!-- code"):
            raise SourceError(f"{path}:{number}: malformed cell marker {line.strip()!r} "
                              "(expected '<!-- md|code [en|zh] -->' on a line of its own)")
        else:
            body.append(line)
    close()
    if not cells:
        raise SourceError(f"{path}: no cells")
    for i, c in enumerate(cells):
        if c.kind != "md" or c.lang is None:
            continue
        if c.lang == "en" and not (i + 1 < len(cells) and cells[i + 1].kind == "md" and cells[i + 1].lang == "zh"):
            raise SourceError(f"{path}:{c.line}: an 'md en' cell must be followed by its 'md zh' twin")
        if c.lang == "zh" and not (i > 0 and cells[i - 1].kind == "md" and cells[i - 1].lang == "en"):
            raise SourceError(f"{path}:{c.line}: an 'md zh' cell must directly follow its 'md en' twin")
        if c.lang == "zh" and not _HAN.search(c.text):
            raise SourceError(f"{path}:{c.line}: the 'md zh' cell has no Chinese text")
    return cells


def _say_calls(tree) -> list:
    import ast

    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "say"]


def _offsets(text: str) -> list[int]:
    starts, total = [], 0
    for line in text.splitlines(keepends=True):
        starts.append(total)
        total += len(line)
    return starts + [total]


def edition_code(text: str, lang: str, where: str = "<cell>") -> str:
    """A shared code cell with every ``say(en, zh)`` replaced by the ``lang`` argument's source."""
    import ast

    if "say(" not in text:
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise SourceError(f"{where}: the code cell does not parse ({e.msg}, line {e.lineno})") from None
    line_at = _offsets(text)
    inside_brackets = {id(child) for node in ast.walk(tree) if isinstance(node, (ast.Call, ast.Dict, ast.List, ast.Set))
                       for child in ast.iter_child_nodes(node)}
    edits = []
    for call in _say_calls(tree):
        if len(call.args) != 2 or call.keywords or not all(
                isinstance(a, (ast.Constant, ast.JoinedStr)) and not (isinstance(a, ast.Constant)
                                                                       and not isinstance(a.value, str))
                for a in call.args):
            raise SourceError(f"{where}: say(...) takes two string literals, English then Chinese "
                              f"(line {call.lineno} of the cell)")
        arg = call.args[LANGS.index(lang)]
        chosen = ast.get_source_segment(text, arg)
        if "\n" in chosen:  # strings joined over several lines: keep them joined (brackets) and aligned
            wrap = id(call) not in inside_brackets
            cut = 3 if wrap else 4  # "say(" becomes "(" or nothing
            head, *rest = chosen.split("\n")
            rest = [r[cut:] if r.startswith(" " * cut) else r for r in rest]
            chosen = "\n".join([("(" if wrap else "") + head, *rest]) + (")" if wrap else "")
        start = line_at[call.lineno - 1] + len(text.splitlines(keepends=True)[call.lineno - 1]
                                               .encode()[:call.col_offset].decode())
        end = line_at[call.end_lineno - 1] + len(text.splitlines(keepends=True)[call.end_lineno - 1]
                                                 .encode()[:call.end_col_offset].decode())
        edits.append((start, end, chosen))
    for start, end, chosen in sorted(edits, reverse=True):
        if any(s < end and start < e for s, e, _ in edits if (s, e) != (start, end) and s >= start):
            raise SourceError(f"{where}: say(...) inside say(...) is not supported")
        text = text[:start] + chosen + text[end:]
    return text


def cells_for(cells: list[Cell], lang: str, where: str = "<source>") -> list[tuple[str, str]]:
    """(cell_type, source) of the notebook in ``lang``; shared code keeps only this edition's strings."""
    return [("markdown", c.text) if c.kind == "md" else ("code", edition_code(c.text, lang, f"{where}:{c.line}"))
            for c in cells if c.lang in (None, lang)]


def target(source: Path, lang: str) -> Path:
    rel = source.relative_to(SOURCES).with_suffix(".ipynb")
    return ROOT / "notebooks" / rel if lang == "en" else ROOT / "notebooks" / lang / rel


def sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.md"))


def notebook(source: Path, lang: str, cells: list[Cell]):
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    nb = new_notebook()
    for i, (kind, text) in enumerate(cells_for(cells, lang, str(source))):
        cell = new_markdown_cell(text) if kind == "markdown" else new_code_cell(text)
        cell["id"] = f"c{i:02d}"
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = dict(LANGUAGE_INFO)
    nb.metadata["minillm"] = {"lang": lang, "source": source.relative_to(ROOT).as_posix(),
                              "generated": "edit the source and run scripts/build_notebooks.py"}
    nbformat.validate(nb)
    return nb


def up_to_date(path: Path, wanted) -> bool:
    """True if ``path`` has exactly the wanted cells (types and sources); outputs are not compared."""
    import nbformat

    if not path.is_file():
        return False
    have = nbformat.read(str(path), as_version=4)
    return ([(c.cell_type, c.source) for c in have.cells] == [(c.cell_type, c.source) for c in wanted.cells]
            and have.metadata.get("minillm") == wanted.metadata.get("minillm"))


def stale(only: list[str] | None = None) -> list[tuple[Path, object]]:
    """(target, fresh notebook) for every generated notebook whose cells differ from its source;
    ``only``: just the sources whose path contains one of these texts (others are not even parsed)."""
    out = []
    for src in sources():
        if only and not any(s in src.as_posix() for s in only):
            continue
        cells = parse(src)
        for lang in LANGS:
            nb = notebook(src, lang, cells)
            path = target(src, lang)
            if not up_to_date(path, nb):
                out.append((path, nb))
    return out


def unexecuted(only: list[str] | None = None) -> list[Path]:
    """Generated notebooks with a code cell that never ran (built earlier without ``--execute``)."""
    import nbformat

    out = []
    for src in sources():
        if only and not any(s in src.as_posix() for s in only):
            continue
        for lang in LANGS:
            path = target(src, lang)
            if path.is_file():
                nb = nbformat.read(str(path), as_version=4)
                if any(c.cell_type == "code" and c.source.strip() and not c.get("execution_count")
                       for c in nb.cells):
                    out.append(path)
    return out


def convert(path: Path) -> str:
    """A first source for an existing English notebook: its cells, prose marked 'md en' (the
    Chinese twins are still to be written, so it does not build until they are)."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    parts = []
    for c in nb.cells:
        marker = "<!-- md en -->" if c.cell_type == "markdown" else "<!-- code -->"
        parts.append(f"{marker}\n{c.source.strip(chr(10))}\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a notebook differs from its source")
    p.add_argument("--execute", action="store_true", help="execute the notebooks this run rewrote")
    p.add_argument("--only", action="append", default=[],
                   help="build only the sources whose path contains this text (repeatable)")
    p.add_argument("--convert", nargs="+", type=Path, metavar="NOTEBOOK",
                   help="print a first source for existing notebooks (into course/ with --write)")
    p.add_argument("--write", action="store_true", help="with --convert: write course/<path>.md")
    args = p.parse_args(argv)

    if args.convert:
        for nb_path in args.convert:
            text = convert(nb_path)
            if args.write:
                rel = nb_path.resolve().relative_to(ROOT / "notebooks").with_suffix(".md")
                out = SOURCES / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text, encoding="utf-8")
                print(f"wrote {out.relative_to(ROOT)}")
            else:
                sys.stdout.write(text)
        return 0

    try:
        todo = stale(args.only)
    except SourceError as e:
        print(f"build_notebooks: {e}", file=sys.stderr)
        return 1
    fresh = {path for path, _ in todo}
    not_run = [path for path in unexecuted(args.only) if path not in fresh]
    if args.check:
        for path, _ in todo:
            print(f"out of date: {path.relative_to(ROOT)} (run scripts/build_notebooks.py --execute)")
        for path in not_run:
            print(f"not executed: {path.relative_to(ROOT)} (run scripts/build_notebooks.py --execute)")
        return 1 if todo or not_run else 0
    import nbformat

    for path, nb in todo:
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(path))
        print(f"wrote {path.relative_to(ROOT)}")
    run = [path for path, _ in todo] + not_run
    if args.execute and run:
        sys.path.insert(0, str(ROOT / "scripts"))
        import run_notebooks

        return run_notebooks.main([str(path) for path in run])
    if not todo:
        print("build_notebooks: every notebook matches its source"
              + (f"; {len(not_run)} not executed yet (--execute)" if not_run else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
