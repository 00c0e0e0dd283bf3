"""Incremental detokenisation over a short window of output tokens (the engine's text until
``minillm.detokenizer`` takes over): a word split over tokens, or a multi-byte character,
only appears once complete; a stop string cuts the text where it starts."""

from __future__ import annotations

from .stopping import find_stop_string


def _decoder(tokenizer):
    """``tokenizer.decode``, straight to the Rust ``tokenizers`` backend when that gives the
    same text (a plain fast tokenizer with no space clean-up): the transformers wrapper costs
    several times the decode itself."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # older transformers
        TokenizersBackend = None
    cls = type(tokenizer)
    plain = (TokenizersBackend is not None and isinstance(tokenizer, TokenizersBackend)
             and cls.decode is TokenizersBackend.decode and cls._decode is TokenizersBackend._decode
             and not tokenizer.clean_up_tokenization_spaces)
    if plain:
        backend = tokenizer.backend_tokenizer
        return lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)
    return lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)


class WindowDetokenizer:
    """Same interface as ``minillm.detokenizer.IncrementalDetokenizer``: ``update(token_id,
    hidden=...) -> bool`` (True when a stop string appeared) and ``.text``."""

    _decoders: dict = {}

    def __init__(self, tokenizer, prompt_token_ids, params):
        key = id(tokenizer)
        cached = self._decoders.get(key)
        if cached is None or cached[0] is not tokenizer:
            cached = self._decoders[key] = (tokenizer, _decoder(tokenizer))
        self._decode = cached[1]
        self.params = params
        self.ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0

    def update(self, token_id: int, *, hidden: bool = False) -> bool:
        self.ids.append(token_id)
        ids, skip = self.ids, self.params.skip_special_tokens
        prefix = self._decode(ids[self._prefix_offset:self._read_offset], skip)
        full = self._decode(ids[self._prefix_offset:], skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False
        old_len = len(self.text)
        self.text += full[len(prefix):]
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        stops = self.params.stop_strings
        if stops:
            longest = max(len(s) for s in stops)
            at = find_stop_string(self.text, stops, old_len - longest + 1)
            if at != -1:
                self.text = self.text[:at]
                return True
        return False
