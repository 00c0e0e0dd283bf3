"""Chat messages -> prompt token ids, the way the model was trained to read them.

A chat model expects its conversation laid out by its own *chat template* (a Jinja template
in ``tokenizer_config.json`` or a GGUF's metadata). Two traps this module avoids:

* the template usually writes the BOS token itself (the Llama-3 family does), so the text it
  renders must be encoded with ``add_special_tokens=False`` or the prompt starts with two BOS;
* a base model (like the shipped story model) has no template: then a plain, documented
  fallback is used (``role: content`` lines, then ``assistant:``), so the chat API and the
  server still work, while saying clearly that the model was never trained on it.
"""

from __future__ import annotations

from typing import Sequence

from .request import check_text

try:  # every error a Jinja template can raise: a refusal (raise_exception), a sandbox block, a syntax error
    from jinja2 import TemplateError
except ImportError:  # no jinja2: transformers cannot render a template either
    TemplateError = ()

# Used only when the tokenizer has no chat template of its own.
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
ROLES = ("system", "user", "assistant", "tool")


def validate_messages(messages) -> list[dict]:
    """A conversation is a non-empty list of {"role": ..., "content": str} dicts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")
        if m["role"] not in ROLES:
            raise ValueError(f"messages[{i}]['role'] must be one of {ROLES}, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}]['content'] must be a string, got {type(m['content']).__name__}")
        check_text(f"messages[{i}]['content']", m["content"])
        out.append({"role": m["role"], "content": m["content"]})
    return out


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_conversation(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """The conversation as the text the model reads (template applied, not tokenised).

    A template may refuse a conversation on purpose (``raise_exception("...")``, say for a
    system message it has no place for) or fail in its sandbox; either is the caller's
    ``ValueError``, carrying the template's own message."""
    messages = validate_messages(messages)
    template = None if has_chat_template(tokenizer) else FALLBACK_CHAT_TEMPLATE
    try:
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except TemplateError as exc:
        raise ValueError(f"messages: the model's chat template refused this conversation "
                         f"({type(exc).__name__}: {exc})") from None


def encode_conversation(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
    """Prompt token ids for a conversation, with exactly one BOS where the model wants one.

    The rendered text is encoded without special tokens (the template wrote those it wants);
    when the template wrote no BOS but the tokenizer normally adds one, it is added once.
    """
    text = render_conversation(tokenizer, messages, add_generation_prompt)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and (not ids or ids[0] != bos):
        with_special = tokenizer.encode("x", add_special_tokens=True)
        if with_special and with_special[0] == bos:
            ids.insert(0, bos)
    if not ids:
        raise ValueError("the conversation renders to no tokens")
    return ids
