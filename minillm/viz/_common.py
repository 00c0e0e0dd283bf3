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
