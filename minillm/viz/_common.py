"""Small helpers shared by the widgets: the default engine, token text, HTML bits."""

from __future__ import annotations

import html

DEFAULT_PROMPT = "Once upon a time"


def default_llm(**kwargs):
    """The shipped model, with a small KV pool of small blocks so a widget can draw it.

    ``block_size=4`` makes a request's block table grow every four tokens, which is easy to
    watch; ``num_kv_blocks=64`` is small enough to draw every block of the pool."""
    from ..llm import LLM

    opts = dict(block_size=4, num_kv_blocks=64)
    opts.update(kwargs)
    return LLM(**opts)


def token_text(tokenizer, token_id: int) -> str:
    """One token as readable text: a leading space shows as '␣', a newline as '↵'."""
    text = tokenizer.decode([int(token_id)], skip_special_tokens=False)
    text = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
    text = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)
    return text or "∅"


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def fmt_ms(seconds) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f} ms"


def fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 ** 2:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 ** 2:.2f} MiB"


def static_html(widget) -> str:
    """A still picture of a widget tree as plain HTML: HTML widgets give their HTML, images an
    inline PNG, buttons a (disabled) button, boxes their children in a row or a column.

    Saved next to the live widget in a notebook file, it is what GitHub, nbviewer and a
    notebook that has not been run yet show, instead of the widget's raw ``repr``."""
    import base64

    import ipywidgets as w

    if isinstance(widget, w.Box):
        direction = "row" if isinstance(widget, w.HBox) else "column"
        inner = "".join(static_html(c) for c in widget.children)
        return f"<div style='display:flex;flex-direction:{direction};flex-wrap:wrap;gap:6px'>{inner}</div>"
    if isinstance(widget, w.HTML):
        return f"<div>{widget.value}</div>"
    if isinstance(widget, w.Image):
        if not widget.value:
            return ""
        data = base64.b64encode(bytes(widget.value)).decode()
        return f"<img style='max-width:100%' src='data:image/{widget.format};base64,{data}'/>"
    if isinstance(widget, w.Button):
        return f"<button disabled style='font-size:13px;margin:2px'>{esc(widget.description)}</button>"
    if isinstance(widget, w.Output):
        return ""
    desc = getattr(widget, "description", "") or ""
    value = getattr(widget, "value", "")
    if isinstance(value, (str, int, float, bool)):
        return f"<div style='font-size:13px'>{esc(desc)} {esc(value)}</div>"
    return ""


def widget_bundle(widget, data: dict, plain: str) -> dict:
    """``data`` (the widget's own display data) plus a static HTML snapshot and a readable line.

    A notebook opened without a running kernel (or not trusted yet) cannot draw the widget; it
    falls back to the next format in the bundle: the snapshot, or ``plain`` where HTML is not
    rendered. A running kernel still gets the live widget (it ranks first)."""
    data = dict(data or {})
    note = ("<div style='font-size:12px;color:#64748b;margin:4px 0'>A snapshot: run the cell to use "
            "the buttons.</div>")
    data["text/html"] = note + static_html(widget)
    data["text/plain"] = plain
    return data
