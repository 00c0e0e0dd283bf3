"""Small helpers shared by the widgets: the default engine, token text, HTML bits, buttons."""

from __future__ import annotations

import html
from dataclasses import dataclass

DEFAULT_PROMPT = "Once upon a time"


def default_llm(**kwargs):
    """The shipped model, with a small KV pool of small blocks so a widget can draw it.

    ``block_size=4`` makes a request's block table grow every four tokens, which is easy to
    watch; ``num_kv_blocks=64`` is small enough to draw every block of the pool."""
    from ..llm import LLM

    opts = dict(block_size=4, num_kv_blocks=64)
    opts.update(kwargs)
    return LLM(**opts)


def _visible(text: str) -> str:
    """Whitespace made visible: a leading space shows as '␣', a newline as '↵'."""
    text = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def token_text(tokenizer, token_id: int) -> str:
    """One token as readable text: a leading space shows as '␣', a newline as '↵'; a token that
    is only part of a character (a byte-level piece of a Chinese character, say) shows its bytes
    as ‹E5 B0› rather than '�'."""
    text = tokenizer.decode([int(token_id)], skip_special_tokens=False)
    if "\ufffd" in text:
        raw = token_bytes(tokenizer, token_id)
        if raw is not None:
            return hex_label(raw)
    return _visible(text) or "∅"


def hex_label(raw: bytes) -> str:
    return "‹" + " ".join(f"{b:02X}" for b in raw) + "›"


_BYTE_LEVEL: dict | None = None


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte <-> printable character table (what a ByteLevel BPE vocabulary spells
    bytes with), inverted: character -> byte."""
    global _BYTE_LEVEL
    if _BYTE_LEVEL is None:
        keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
            + list(range(ord("®"), ord("ÿ") + 1))
        chars, n = {}, 0
        for b in range(256):
            if b in keep:
                chars[chr(b)] = b
            else:
                chars[chr(256 + n)] = b
                n += 1
        _BYTE_LEVEL = chars
    return _BYTE_LEVEL


def token_bytes(tokenizer, token_id: int) -> bytes | None:
    """The raw UTF-8 bytes a token stands for, or None when the tokenizer does not say.

    Byte-level BPE (GPT-2, Llama-3, the shipped model) spells each byte as one printable
    character; SentencePiece byte fallback spells it ``<0xE5>``; other tokens are their text."""
    try:
        piece = tokenizer.convert_ids_to_tokens(int(token_id))
    except Exception:  # noqa: BLE001 - a tokenizer without the method: no bytes to show
        return None
    if not isinstance(piece, str):
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and "ByteLevel" in repr(backend.decoder):
        table = _byte_level_table()
        if all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)
    return piece.replace("▁", " ").encode("utf-8")


@dataclass(frozen=True)
class TokenPiece:
    """One token as the stepper shows it.

    ``text`` is the text this token adds, as the detokenizer sees it: the characters it
    completes. A token that is only the first bytes of a character adds nothing yet
    (``text == ""``, ``partial``), the token that completes the character adds all of it; so
    the ``text`` of a request's tokens joins to its decoded text, with no '�' in between.
    ``label`` is the chip's caption: the visible text, or the bytes (‹E5 B0›) of a partial
    token, followed by the character it completes."""

    token_id: int
    text: str
    label: str
    partial: bool       # part of a character split over several tokens
    completes: str      # for a partial token: the character(s) its group spells ("" if none)
    invalid: bool = False  # its group holds bytes that are not UTF-8 (tokenizer.decode shows '�')


def _incomplete(text: str) -> bool:
    return text.endswith("\ufffd")


def token_pieces(tokenizer, token_ids, *, context=(), max_char_tokens: int = 8) -> list[TokenPiece]:
    """``token_ids`` cut into the text each token adds (see ``TokenPiece``).

    Tokens are grouped until the group decodes to whole characters (no trailing U+FFFD),
    decoded after a few ``context`` ids so a tokenizer that drops a leading space on its own
    (SentencePiece) still shows it. A group still incomplete at the end (a request stopped in
    the middle of a character) adds no text, as in the request's own detokenized text. A
    byte sequence that can never be a character (more than ``max_char_tokens`` tokens) is
    shown as the tokenizer decodes it."""
    ids = [int(t) for t in token_ids]
    ctx = [int(t) for t in context][-5:]

    def decode(xs):
        return tokenizer.decode(xs, skip_special_tokens=False)

    out: list[TokenPiece] = []
    start = 0  # first id of the group being built
    i = 0
    while i < len(ids):
        window = ctx + ids[max(0, start - 5):start]
        before = decode(window) if window else ""
        end = i + 1
        added = decode(window + ids[start:end])
        added = added[len(before):] if added.startswith(before) else decode(ids[start:end])
        if _incomplete(added) and end < len(ids) and end - start < max_char_tokens:
            i += 1
            continue
        group = ids[start:end]
        if _incomplete(added) and end == len(ids):   # stopped mid-character: nothing shown yet
            added = added.rstrip("\ufffd")
            whole = False
        else:
            whole = True
        if len(group) == 1 and whole and "\ufffd" not in added:
            out.append(TokenPiece(group[0], added, _visible(added) or "∅", False, ""))
        else:
            for k, t in enumerate(group):
                raw = token_bytes(tokenizer, t)
                label = hex_label(raw) if raw is not None else "‹…›"
                last = k == len(group) - 1
                text = added if last else ""
                if last and added:  # bytes that can never be a character stay as bytes, not '�'
                    label += _visible(added.replace("\ufffd", ""))
                out.append(TokenPiece(t, text, label, True, added.replace("\ufffd", "") if whole else "",
                                      "\ufffd" in added))
        start = i = end
    return out


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


def widget_bundle(widget, data: dict, plain: str, lang=None) -> dict:
    """``data`` (the widget's own display data) plus a static HTML snapshot and a readable line.

    A notebook opened without a running kernel (or not trusted yet) cannot draw the widget; it
    falls back to the next format in the bundle: the snapshot, or ``plain`` where HTML is not
    rendered. A running kernel still gets the live widget (it ranks first)."""
    from .i18n import FONT_STACK, phrase

    data = dict(data or {})
    note = f"<div style='font-size:12px;color:#64748b;margin:4px 0'>{esc(phrase('snap.note', lang))}</div>"
    data["text/html"] = f"<div style='font-family:{esc(FONT_STACK)}'>{note}{static_html(widget)}</div>"
    data["text/plain"] = plain
    return data


class ButtonMap(dict):
    """label -> Button, where a button also answers to its English label and its action name.

    Iterating (``keys``, ``values``, ``items``) shows each button once, under the label it
    shows; ``buttons["Prefill"]``, ``buttons["预填充"]`` and ``buttons["prefill"]`` are the
    same button, so a notebook's code works in both languages."""

    def __init__(self):
        super().__init__()
        self._alias: dict[str, str] = {}

    def add(self, button, label: str, *aliases: str) -> None:
        self[label] = button
        for a in aliases:
            if a != label:
                self._alias[a] = label

    def __getitem__(self, key):
        return super().__getitem__(self._alias.get(key, key))

    def __contains__(self, key):
        return super().__contains__(self._alias.get(key, key))

    def get(self, key, default=None):
        return self[key] if key in self else default


def language_notice(pieces, lang=None) -> str:
    """One line of HTML when some characters of the prompt are not in the tokenizer's
    vocabulary (they fell back to byte tokens), else "".

    A byte-level tokenizer accepts any text, but a character it never learned becomes two to
    four byte tokens the model has hardly seen in training, so what it generates next is
    noise. Say so instead of letting it look broken. ``pieces``: ``token_pieces`` of the prompt."""
    from .i18n import phrase

    chars = "".join(p.completes for p in pieces if p.partial and p.text)  # once per character group
    if not chars:
        return ""
    n_tokens = sum(1 for p in pieces if p.partial)
    sample = "".join(dict.fromkeys(chars))[:12]
    return ("<div style='color:#92400e;font-size:13px'>ℹ "
            + esc(phrase("notice.bytes", lang, chars=len(chars), n=n_tokens, sample=sample)) + "</div>")
