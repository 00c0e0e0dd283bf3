"""Token ids -> output text, one token at a time, for one request.

Decoding each new token on its own gives the wrong text for most tokenizers: a byte-level
BPE token may hold half of a multi-byte character, and SentencePiece-style decoders
(Llama-2, Mistral, TinyLlama) strip the leading space of the *first* token they decode, so
"Once upon a time" + "▁there" would come out as "timethere". The fix, vLLM's incremental
detokenisation idea: decode a short sliding window of ids twice per token, the part already
shown (``ids[prefix:read]``) and the whole window (``ids[prefix:]``), and show only what the
second adds. The window starts primed with the last ``PROMPT_WINDOW`` prompt tokens, so the
first output token is decoded in context, and the output text equals
``tokenizer.decode(prompt + output)`` minus ``tokenizer.decode(prompt)`` for every family
(for a prompt that ends on a whole character: otherwise that difference is not defined).

Rules, with vLLM's meanings:

- A window that decodes to something ending in U+FFFD (an incomplete UTF-8 sequence) is
  held back until a later token completes it: the text never shows half a character.
  **Partial UTF-8 at the very end:** a request that stops mid-character (max_tokens reached
  after the first byte of an emoji) never shows that character; ``tokenizer.decode`` of the
  same ids would end in U+FFFD instead. A byte sequence that can never be completed shows as
  U+FFFD once a later token follows it, exactly as ``tokenizer.decode`` shows it.
- Byte-fallback tokens (``<0xE4>``, SentencePiece's way to spell a character not in the
  vocabulary, Llama-2 style): ``tokenizer.decode`` turns a whole run of them into U+FFFD as
  soon as one byte of the run is invalid, so an earlier byte of the run may still change.
  Such a run is held back until a token that is not a byte token follows it (or ``finish``).
- ``finish()`` is for the end of a request: it shows what is still held back, except an
  incomplete character at the very end.
- Stop strings are searched in the output text (also across token boundaries). On a match
  the text is cut where the earliest stop string starts, or just after it with
  ``include_stop_str_in_output``; ``update`` returns True and later updates are ignored.
- ``hidden=True`` marks a stop token (the model's EOS or one of ``stop_token_ids``): its text
  is left out unless ``include_stop_str_in_output`` (special tokens are also left out by
  ``skip_special_tokens``, as ``tokenizer.decode`` does).

Decoding goes straight to the Rust ``tokenizers`` backend when that is the same function as
``tokenizer.decode`` (a plain fast tokenizer without space clean-up): the transformers
wrapper costs several times the decode itself. Any other tokenizer is called through its
own ``decode``. For such a fast tokenizer without byte-fallback tokens the two decodes per
token run inside the library: ``tokenizers.decoders.DecodeStream`` (what vLLM v1 uses) keeps
the same window with the same rule, and ``update`` only adds what it returns; the window above
stays the fallback for every other tokenizer, and the lesson (``finish`` always uses it, on
the same offsets).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

from .params import SamplingParams

#: Prompt tokens the window starts with (vLLM uses 5): enough context for any decoder's
#: treatment of the first token and for a word split over a few tokens.
PROMPT_WINDOW = 5
#: Ids before the window are dropped from memory once this many have accumulated.
_TRIM_AT = 64

Decode = Callable[[list[int], bool], str]


def decoder_for(tokenizer) -> Decode:
    """``decode(ids, skip_special_tokens)`` for ``tokenizer``, through the Rust backend when
    that gives exactly ``tokenizer.decode``'s text."""
    try:
        import tokenizers
        if isinstance(tokenizer, tokenizers.Tokenizer):  # a bare Rust tokenizer
            return lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)
    except ImportError:  # pragma: no cover - transformers depends on tokenizers
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and _decodes_like_backend(tokenizer):
        return lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)
    return lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)


def byte_fallback_ids(tokenizer) -> tuple[frozenset[int], frozenset[int]]:
    """(ids of the ``<0xNN>`` byte tokens, ids of special tokens) when the tokenizer's decoder
    joins byte tokens with ByteFallback (Llama-2, Mistral, TinyLlama legacy files); two empty
    sets otherwise. Special tokens matter because a skipped one does not end a byte run."""
    try:
        import tokenizers
    except ImportError:  # pragma: no cover
        return frozenset(), frozenset()
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not isinstance(backend, tokenizers.Tokenizer) or "ByteFallback" not in repr(backend.decoder):
        return frozenset(), frozenset()
    byte_ids = frozenset(i for t, i in backend.get_vocab().items()
                         if len(t) == 6 and t.startswith("<0x") and t.endswith(">"))
    special = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)
    return byte_ids, special


_INFO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tokenizer_info(tokenizer) -> tuple[Decode, tuple[frozenset[int], frozenset[int]], object]:
    """(decode, (byte-fallback ids, special ids), the Rust tokenizer ``DecodeStream`` can step
    with or None), computed once per tokenizer object."""
    try:
        info = _INFO.get(tokenizer)
    except TypeError:  # not weak-referenceable / hashable: compute every time
        return _compute_info(tokenizer)
    if info is None:
        info = _INFO[tokenizer] = _compute_info(tokenizer)
    return info


def _compute_info(tokenizer):
    byte_ids = byte_fallback_ids(tokenizer)
    stream_with = None
    try:
        import tokenizers
        from tokenizers.decoders import DecodeStream  # noqa: F401 - tokenizers >= 0.21
    except ImportError:  # pragma: no cover
        tokenizers = None
    if tokenizers is not None and not byte_ids[0]:  # byte-fallback runs: the window's own rule
        if isinstance(tokenizer, tokenizers.Tokenizer):
            stream_with = tokenizer
        elif getattr(tokenizer, "backend_tokenizer", None) is not None and _decodes_like_backend(tokenizer):
            stream_with = tokenizer.backend_tokenizer
    return decoder_for(tokenizer), byte_ids, stream_with


def _decodes_like_backend(tokenizer) -> bool:
    """True for a fast tokenizer whose class keeps the library's decode and which does no
    space clean-up: its ``decode`` is then the backend's decode and nothing else."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:  # pragma: no cover
        return False
    cls = type(tokenizer)
    base = PreTrainedTokenizerFast
    return (isinstance(tokenizer, base) and cls.decode is base.decode
            and getattr(cls, "_decode", None) is getattr(base, "_decode", None)
            and not getattr(tokenizer, "clean_up_tokenization_spaces", True))


def find_stop(text: str, stops: Sequence[str], search_from: int = 0) -> tuple[int, str | None]:
    """(index, stop string) of the earliest stop string in ``text`` starting at or after
    ``search_from`` (the longer one on a tie), or (-1, None)."""
    best, found = -1, None
    for s in stops:
        i = text.find(s, max(0, search_from))
        if i != -1 and (best == -1 or i < best or (i == best and len(s) > len(found))):
            best, found = i, s
    return best, found


class IncrementalDetokenizer:
    """The output text of one request, built as its tokens arrive.

    ``update(token_id, hidden=False) -> bool`` adds one sampled token and returns True when
    a stop string appeared (the text is then already cut); ``finish()`` at the end of the
    request shows what is still held back; ``text`` is the output text so
    far; ``stop_string`` the stop string that matched, if any. ``stable_text`` is the part of
    ``text`` that can no longer be cut by a stop string still being spelled out (what a
    stream can show without ever taking text back).
    """

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams,
                 decode: Decode | None = None):
        own_decode, (byte_ids, special_ids), stream_with = _tokenizer_info(tokenizer)
        self._decode = decode if decode is not None else own_decode
        # tokens that continue (or, skipped, do not end) a byte-fallback run
        self._run_ids = byte_ids | special_ids if params.skip_special_tokens else byte_ids
        self._skip = params.skip_special_tokens
        self._include_stop = params.include_stop_str_in_output
        self._stops = params._stop_list
        self._hold = 0  # a stop string still being spelled out may take back this many characters
        for stop in self._stops:
            self._hold = max(self._hold, len(stop) - 1)
        self._ids: list[int] = list(prompt_token_ids[-PROMPT_WINDOW:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""
        self.stop_string: str | None = None
        # the library's window (``DecodeStream``) when it decodes exactly as ``self._decode`` would
        self._stream, self._stream_with, self._held = None, None, False
        # (not after a prompt that ends inside a character, where the library shows that
        # character's bytes from the prompt and the window does not: keep one behaviour)
        if decode is None and stream_with is not None and not self._decode(self._ids, self._skip).endswith("\ufffd"):
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(ids=list(self._ids), skip_special_tokens=self._skip)
            self._stream_with = stream_with

    @property
    def stopped(self) -> bool:
        """True once a stop string was found (further updates are ignored)."""
        return self.stop_string is not None

    @property
    def stable_text(self) -> str:
        if self.stop_string is not None or not self._stops or self._hold == 0:
            return self.text
        return self.text[:max(0, len(self.text) - self._hold)]

    def update(self, token_id: int, *, hidden: bool = False) -> bool:
        """Add one output token. ``hidden``: it is a stop token (EOS / stop_token_ids) whose
        text is shown only with ``include_stop_str_in_output``. Returns True when a stop
        string appeared in the text with this token."""
        if self.stop_string is not None or (hidden and not self._include_stop):
            return False
        self._ids.append(token_id)
        if self._stream is not None:  # the library's two decodes, the window's offsets kept alike
            piece = self._stream.step(self._stream_with, token_id)
            self._held = piece is None  # something may be held back (or nothing was new)
            return False if piece is None else self._show(piece)
        if token_id in self._run_ids:
            return False  # a byte-fallback run may still turn into U+FFFD: wait for its end
        return self._advance(final=False)

    def finish(self) -> bool:
        """The request ended: add the text still held back (a byte-fallback run), leaving out
        an incomplete character at the very end. Returns True if a stop string appeared."""
        if self.stop_string is not None or (self._stream is not None and not self._held):
            return False  # (the stream's last step showed everything: the window would add nothing)
        return self._advance(final=True)

    def _advance(self, final: bool) -> bool:
        ids = self._ids
        prefix = self._decode(ids[self._prefix_offset:self._read_offset], self._skip)
        full = self._decode(ids[self._prefix_offset:], self._skip)
        if final:
            full = full.rstrip("\ufffd")
        elif full.endswith("\ufffd"):
            return False  # half a character: wait for the next token
        if len(full) <= len(prefix):
            return False  # nothing new yet
        return self._show(full[len(prefix):])

    def _show(self, piece: str) -> bool:
        """Add ``piece`` to the text, move the window on, look for a stop string."""
        ids = self._ids
        old_len = len(self.text)
        self.text += piece
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        if self._prefix_offset >= _TRIM_AT:
            del ids[:self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        if not self._stops:
            return False
        at, stop = find_stop(self.text, self._stops, old_len - self._hold)
        if stop is None:
            return False
        self.text = self.text[:at + len(stop)] if self._include_stop else self.text[:at]
        self.stop_string = stop
        return True
