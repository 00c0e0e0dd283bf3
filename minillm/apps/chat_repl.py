"""``minillm chat``: talk to a model in the terminal, the reply streamed token by token.

The loop uses the engine's public API only: the conversation so far is laid out by the
model's chat template (``chat.encode_conversation``), added with
``add_request(prompt_token_ids=...)`` and stepped with ``step()``, printing the new text after
each step. Ctrl-C during a reply cancels that request in the engine (its KV blocks are freed
at once) and drops the unanswered turn; Ctrl-D or ``/exit`` quits; ``/reset`` forgets the
conversation. When the conversation outgrows ``max_model_len`` the oldest turns are dropped.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, TextIO

from ..chat import encode_conversation, has_chat_template

HELP = "Type a message. /reset forgets the conversation, /exit or Ctrl-D quits, Ctrl-C stops a reply."
FALLBACK_NOTICE = ("note: this model has no chat template, so minillm's plain fallback is used "
                   "('role: content' lines, then 'assistant:'); a base model was never trained on it.")


def fit_conversation(tokenizer, messages: list[dict], max_len: int) -> tuple[list[dict], list[int]]:
    """Drop the oldest non-system turns until the prompt leaves room for at least one token."""
    messages = list(messages)
    while True:
        ids = encode_conversation(tokenizer, messages)
        if len(ids) < max_len:
            return messages, ids
        first = 1 if messages and messages[0]["role"] == "system" else 0
        if len(messages) - first <= 1:
            raise ValueError(f"this message alone is {len(ids)} tokens, more than max_model_len "
                             f"({max_len}) allows: shorten it")
        del messages[first]


def reply(llm, ids: list[int], params, out: TextIO) -> tuple[str, bool]:
    """Stream one reply; returns (text, finished). Ctrl-C cancels the request in the engine."""
    req = llm.add_request(prompt_token_ids=ids, params=params)
    shown = 0
    try:
        while req.is_live:
            llm.step()
            if len(req.text) > shown:
                out.write(req.text[shown:])
                out.flush()
                shown = len(req.text)
    except KeyboardInterrupt:
        if req.is_live:
            llm.cancel(req.request_id)
        out.write(" [stopped]\n")
        out.flush()
        return req.text, False
    if len(req.text) > shown:
        out.write(req.text[shown:])
    out.write("\n")
    out.flush()
    return req.text, True


def run_chat(llm, params, read_line: Callable[[str], str] = input, out: TextIO = sys.stdout,
             system: str | None = None) -> int:
    """The interactive loop over an existing engine (``read_line`` raises EOFError at the end)."""
    if not has_chat_template(llm.tokenizer):
        out.write(FALLBACK_NOTICE + "\n")
    out.write(HELP + "\n")
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    while True:
        try:
            line = read_line("you> ")
        except EOFError:
            out.write("\n")
            return 0
        except KeyboardInterrupt:
            out.write("\n(Ctrl-D or /exit quits)\n")
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            messages = list(start)
            out.write("(conversation forgotten)\n")
            continue
        try:
            messages, ids = fit_conversation(llm.tokenizer, messages + [{"role": "user", "content": line}],
                                             llm.max_model_len)
        except ValueError as exc:
            out.write(f"error: {exc}\n")
            continue
        out.write("assistant> ")
        out.flush()
        answer, finished = reply(llm, ids, params, out)
        if finished:
            messages.append({"role": "assistant", "content": answer})
        else:  # the turn had no complete answer: forget the question too
            messages.pop()
            out.write("(reply stopped; that turn was dropped)\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minillm chat", description="Chat with a model in the terminal.")
    parser.add_argument("--model", default=None, help="model folder or .gguf file (default: the shipped model)")
    parser.add_argument("--system", default=None, help="system message that starts the conversation")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="longest reply (default: the model's generation_config.json, else 256)")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)

    from .. import LLM, SamplingParams

    given = {k: v for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature),
                               ("top_p", args.top_p), ("top_k", args.top_k), ("seed", args.seed)) if v is not None}
    try:
        llm = LLM(args.model, device=args.device, dtype=args.dtype)
        defaults = dict(getattr(llm.model_config, "generation_defaults", {}) or {})
        defaults.setdefault("max_tokens", 256)
        params = SamplingParams(**{**defaults, **given})
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"minillm chat: error: {exc}", file=sys.stderr)
        return 2
    return run_chat(llm, params, system=args.system)
