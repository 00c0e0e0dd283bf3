"""Compare a notebook's freshly computed outputs with the ones saved in it, as nbval does.

tests/test_notebooks_rerun*.py run each course notebook twice in one kernel; the first round's
outputs are checked here against the file, so nbval need not execute the notebooks a third
time. The rules are nbval's (``--nbval --nbval-sanitize-with tests/nbval_sanitize.cfg``):
a cell marked ``# NBVAL_IGNORE_OUTPUT`` (or tagged ``nbval-ignore-output``) is not compared,
``# NBVAL_SKIP`` cells are not compared either, streams of one name are joined (``\\r`` and
``\\b`` applied), the sanitize patterns are applied to every string, and metadata, execution
counts, widget model ids and PNG/JPEG pictures are not compared.
"""

from __future__ import annotations

import configparser
import copy
import re
from collections import defaultdict
from pathlib import Path

SANITIZE_CFG = Path(__file__).resolve().parent / "nbval_sanitize.cfg"
SKIP_KEYS = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
             "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}
_CR = re.compile(r"^.*\r(?=[^\n])", re.MULTILINE)
_BS = re.compile(r"[^\n]\x08")  # a character, then a backspace


def sanitize_patterns(path: Path = SANITIZE_CFG) -> list[tuple[re.Pattern, str]]:
    parser = configparser.ConfigParser()
    parser.read(path, encoding="utf-8")
    return [(re.compile(parser[s]["regex"]), parser[s]["replace"]) for s in parser.sections()]


def is_compared(cell) -> bool:
    if cell.get("cell_type") != "code":
        return False
    tags = set(cell.get("metadata", {}).get("tags", []))
    marks = ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP", "PYTEST_VALIDATE_IGNORE_OUTPUT")
    first_lines = cell.get("source", "")
    return not (tags & {"nbval-ignore-output", "nbval-skip"} or any(m in first_lines for m in marks))


def saved_outputs(nb) -> dict[int, list]:
    """The outputs the file holds for each compared cell, copied before a run clears them."""
    return {i: copy.deepcopy(c.get("outputs", [])) for i, c in enumerate(nb.cells) if is_compared(c)}


def _join_streams(outputs: list) -> list:
    joined, streams = [], {}
    for out in outputs:
        out = dict(out)
        if out.get("output_type") == "stream":
            if out["name"] in streams:
                streams[out["name"]]["text"] += out["text"]
                continue
            streams[out["name"]] = out
        joined.append(out)
    for out in streams.values():
        text = out["text"]
        while True:
            shorter = _BS.sub("", text)
            if len(shorter) == len(text):
                break
            text = shorter
        out["text"] = _CR.sub("", text)
    return [{"output_type": "stream", o["name"]: o["text"]} if o.get("output_type") == "stream" else o
            for o in joined]


def _flatten(outputs: list, patterns) -> dict[str, list]:
    """key (stream name, MIME type, ename …) -> the sanitised values in order."""
    flat = defaultdict(list)

    def clean(value):
        if isinstance(value, list):
            value = "".join(value)
        if isinstance(value, str):
            for regex, replace in patterns:
                value = regex.sub(replace, value)
        return value

    for out in _join_streams(outputs):
        for key, value in out.items():
            if key in SKIP_KEYS:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in SKIP_KEYS:
                        flat[mime].append(clean(data))
            else:
                flat[key].append(clean(value))
    return flat


def differences(saved: dict[int, list], nb, patterns=None) -> list[str]:
    """One line per compared cell whose new outputs differ from the saved ones."""
    patterns = sanitize_patterns() if patterns is None else patterns
    problems = []
    for index, reference in saved.items():
        old, new = _flatten(reference, patterns), _flatten(nb.cells[index].get("outputs", []), patterns)
        if old != new:
            key = next(k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
            source = nb.cells[index].source.strip().splitlines()
            problems.append(f"cell {index} ({source[0][:60] if source else ''!r}): output {key!r} differs: "
                            f"saved {old.get(key)!r:.300} but got {new.get(key)!r:.300}")
    return problems
