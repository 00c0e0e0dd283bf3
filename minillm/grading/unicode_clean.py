"""Make a written answer read as it looks, before any grader matches a word in it.

A student can hide a "not" from a regular expression without hiding it from a reader:
``n\\u200bot`` (a zero-width space inside), ``nоt`` (a Cyrillic ``о``), ``ｎｏｔ`` (full-width
letters), a right-to-left override that reorders what is shown. The same tricks, made by
accident by an input method or a copy from a PDF, make a right answer fail. :func:`clean`
undoes them in one place, so every grader sees the text a person would read:

1. NFKC: full-width letters, digits and punctuation become their plain forms, ligatures split,
   the ideographic space becomes a space.
2. Invisible characters go: format characters (zero-width spaces and joiners, the word
   joiner, the byte-order mark, bidi controls, soft hyphens, tag characters) and variation
   selectors / the combining grapheme joiner.
3. Look-alikes are mapped: a Cyrillic or Greek letter that looks like a Latin one becomes that
   Latin letter when it stands in a word with a Latin letter in it, or in a word made only of
   look-alikes ("nоt", "КV"); a word in real Greek or Russian letters ("λ", "дом") is left alone.
4. Traditional Chinese characters are read as simplified ones (:mod:`hanzi`): 顯存佔用 is 显存占用.

:func:`tricks` says what was found, so a grader can lower its confidence in that answer.
"""

from __future__ import annotations

import re
import unicodedata

from .hanzi import simplified

# Cyrillic and Greek letters that a reader takes for Latin ones
_LOOKALIKES = {
    # Cyrillic lower
    "а": "a", "в": "b", "е": "e", "ё": "e", "һ": "h", "і": "i", "ї": "i", "ј": "j", "к": "k", "м": "m",
    "н": "h", "о": "o", "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "ԁ": "d", "ԛ": "q",
    "ԝ": "w", "ү": "y",
    # Cyrillic upper
    "А": "A", "В": "B", "Е": "E", "Ё": "E", "Н": "H", "І": "I", "Ї": "I", "Ј": "J", "К": "K", "М": "M",
    "О": "O", "Р": "P", "С": "C", "Т": "T", "У": "Y", "Х": "X", "Ѕ": "S", "Ԁ": "D", "Ԛ": "Q", "Ԝ": "W",
    "Ү": "Y",
    # Greek lower and upper
    "α": "a", "ο": "o", "ρ": "p", "ν": "v", "ι": "i", "κ": "k", "τ": "t", "υ": "u", "χ": "x", "ε": "e",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
}
_INVISIBLE_EXTRA = {"\u034f"}  # combining grapheme joiner (category Mn, shows nothing)
_WORD = re.compile(r"\w+", re.UNICODE)


def _invisible(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    cat = unicodedata.category(ch)
    if cat == "Cf" or ch in _INVISIBLE_EXTRA:
        return True
    code = ord(ch)
    return 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF  # variation selectors


def _is_latin(ch: str) -> bool:
    return ch.isascii() and ch.isalpha()


def _map_word(word: str) -> str:
    if not any(ch in _LOOKALIKES for ch in word):
        return word
    has_latin = any(_is_latin(ch) for ch in word)
    only_lookalikes = all(ch in _LOOKALIKES or ch.isdigit() or _is_latin(ch) for ch in word)
    if has_latin or only_lookalikes:
        latin = [ch for ch in word if _is_latin(ch)]
        upper = len(latin) >= 2 and all(ch.isupper() for ch in latin)  # "WаITING": a state name in capitals
        return "".join((_LOOKALIKES[ch].upper() if upper else _LOOKALIKES[ch]) if ch in _LOOKALIKES else ch
                       for ch in word)
    return word


def clean(text: str) -> str:
    """The text as a reader sees it (see the module's docstring); line breaks are kept."""
    text = unicodedata.normalize("NFKC", str(text))
    text = text.replace("\u2028", "\n").replace("\u2029", "\n")
    text = "".join(ch for ch in text if not _invisible(ch))
    text = _WORD.sub(lambda m: _map_word(m.group(0)), text)
    return simplified(unicodedata.normalize("NFKC", text))


def tricks(text: str) -> list[str]:
    """What :func:`clean` had to undo: 'invisible', 'lookalike', 'width' (empty: nothing)."""
    text = str(text)
    found = []
    if any(_invisible(ch) for ch in text):
        found.append("invisible")
    nfkc = unicodedata.normalize("NFKC", text)
    if any(_map_word(m.group(0)) != m.group(0) for m in _WORD.finditer(nfkc)):
        found.append("lookalike")
    if any(unicodedata.east_asian_width(ch) == "F" and ch.isascii() is False and unicodedata.normalize("NFKC", ch).isascii()
           and unicodedata.normalize("NFKC", ch).isalnum() for ch in text):
        found.append("width")
    return found
