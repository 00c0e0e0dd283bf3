"""Coding tasks checked against the engine itself, and task 3's byte count.

* ``code_top_p``: the student's ``my_top_p_filter(logits, top_p)`` against
  ``minillm.sampler.top_p_filter`` on random logits and edge cases;
* ``code_kv_bytes``: ``my_kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)``
  against ``minillm.kv_cache.kv_bytes_per_token`` on several real model shapes;
* ``code_stop_check``: ``my_check_stop(...)`` against the engine's stop semantics (EOS and
  stop token ids, then stop strings, then max_tokens, then a full context);
* ``task3_kv_bytes``: the KV bytes of three cache-pressure scenarios, computed with the
  student's own formula, against what the engine's ``cache_stats()`` reports when the
  scenario really runs.

Student functions run through :mod:`safecall` (a time limit, errors become feedback).
torch and the engine are imported only when one of these checks runs.
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass

from . import safecall
from .registry import CannotGrade, Marks, NotAttempted, register


def _not_attempted_if_stub(outcome: safecall.Outcome, name: str) -> None:
    if outcome.not_implemented:
        raise NotAttempted(f"{name} still raises NotImplementedError: write its body, then check again")


def _fraction_points(m: Marks, passed: int, total: int, points: float) -> None:
    """All cases -> all points; otherwise points in proportion, in half-point steps."""
    if passed == total:
        m.score += points
    else:
        m.score += int(2 * points * passed / total) / 2


# =============================================================================================
# Top-p (nucleus) filter
# =============================================================================================
@dataclass
class _TopPCase:
    name: str
    logits: object  # torch.Tensor
    top_p: float
    tie_tolerant: bool = False


def _safe_margin(logits, top_p) -> bool:
    """True when no row's cumulative probability sits within 1e-4 of top_p (float-fragile)."""
    import torch

    probs = logits.float().softmax(-1).sort(-1, descending=True).values
    cum = probs.cumsum(-1)
    return bool(((cum - top_p).abs() > 1e-4).all())


def top_p_cases() -> list[_TopPCase]:
    import torch

    g = torch.Generator().manual_seed(2024)
    cases = []

    def rand(shape, scale, p, name):
        for _ in range(50):  # draw until no row sits on a float-fragile boundary
            x = torch.randn(*shape, generator=g) * scale
            if _safe_margin(x, p):
                cases.append(_TopPCase(name, x, p))
                return
        raise RuntimeError("could not draw a top-p case away from the boundary")

    rand((10,), 2.0, 0.9, "10 random logits, top_p=0.9")
    rand((50,), 1.5, 0.5, "50 random logits, top_p=0.5")
    rand((4, 32), 3.0, 0.8, "a batch of 4 rows × 32, top_p=0.8")
    rand((3, 100), 0.5, 0.95, "flat-ish distribution, 3 rows × 100, top_p=0.95")
    cases.append(_TopPCase("top_p=1.0 keeps every token", torch.randn(16, generator=g), 1.0))
    cases.append(_TopPCase("tiny top_p keeps only the most likely token", torch.randn(16, generator=g), 1e-6))
    peaked = torch.zeros(12)
    peaked[7] = 20.0
    cases.append(_TopPCase("one dominant token (logit 20), top_p=0.9", peaked, 0.9))
    with_inf = torch.tensor([2.0, float("-inf"), 1.0, 0.5, float("-inf"), 3.0, -1.0])
    cases.append(_TopPCase("logits that already hold -inf, top_p=0.7", with_inf, 0.7))
    cases.append(_TopPCase("a vocabulary of one token", torch.tensor([0.3]), 0.5))
    cases.append(_TopPCase("two tied top tokens both needed, top_p=0.5",
                           torch.tensor([2.0, 2.0, 1.0, 1.0, 0.0]), 0.5))
    cases.append(_TopPCase("large logits (numerically unstable softmax if done by hand), top_p=0.6",
                           torch.tensor([1000.0, 999.0, 998.0, 990.0, 0.0]), 0.6))
    return cases


def _describe_keep(mask) -> str:
    if mask.dim() == 1:
        idx = [int(i) for i in mask.nonzero().flatten()[:8]]
        return f"{int(mask.sum())} token(s) {idx}{'…' if int(mask.sum()) > 8 else ''}"
    per_row = [int(n) for n in mask.reshape(-1, mask.shape[-1]).sum(-1)]
    return f"{sum(per_row)} tokens (per row: {per_row})"


@register("code_top_p", "Code · a top-p (nucleus) filter", "§4 sampling", 3, answer_name="my_top_p_filter",
          kind="code")
def grade_top_p(fn, m: Marks) -> None:
    try:
        import torch

        from minillm.sampler import top_p_filter
    except Exception as exc:
        raise CannotGrade(f"the engine's sampler could not be imported ({type(exc).__name__}: {exc})")
    if not callable(fn):
        m.wrong(f"my_top_p_filter should be a function, got {type(fn).__name__}")
        return
    cases = top_p_cases()
    passed, problems, in_place = 0, [], False
    for i, case in enumerate(cases):
        given = case.logits.clone()
        out = safecall.call(fn, given, case.top_p)
        if i == 0:
            _not_attempted_if_stub(out, "my_top_p_filter")
        ref = top_p_filter(case.logits.clone(), case.top_p)
        if out.timed_out:
            problems.append(f"{case.name}: {out.error}; stopped here")
            break
        if not out.ok:
            problems.append(f"{case.name}: your function raised {out.error}")
            continue
        y = out.value
        if not isinstance(y, torch.Tensor):
            problems.append(f"{case.name}: return a tensor of filtered logits, got {type(y).__name__}")
            continue
        if y.shape != ref.shape:
            problems.append(f"{case.name}: the result has shape {list(y.shape)}, expected {list(ref.shape)} "
                            f"(same as the logits)")
            continue
        if y.dtype == torch.bool:
            problems.append(f"{case.name}: you return a mask; return the logits with removed entries set to -inf")
            continue
        kept_ref = ~torch.isneginf(ref)
        kept = ~torch.isneginf(y.float())
        yf = y.float()
        if (yf >= 0).all() and (yf <= 1).all() and torch.allclose(yf.sum(-1), torch.ones(()), atol=1e-3) \
                and not torch.allclose(yf, case.logits.float()):
            problems.append(f"{case.name}: you return probabilities; return the logits, with the removed "
                            f"entries set to -inf (the kept entries stay unchanged)")
            continue
        if not torch.equal(kept, kept_ref):
            problems.append(f"{case.name}: you keep {_describe_keep(kept)}, the engine keeps {_describe_keep(kept_ref)}")
            continue
        if not torch.allclose(y.float()[kept], case.logits.float()[kept_ref], atol=1e-5, rtol=1e-5):
            problems.append(f"{case.name}: the kept entries changed; leave kept logits as they are (no softmax, "
                            f"no renormalising) and set only the removed ones to -inf")
            continue
        passed += 1
        in_place = in_place or not torch.equal(given, case.logits)
    _fraction_points(m, passed, len(cases), 3)
    if in_place:
        m.info("your function changes the input tensor in place; the engine's filters return a new tensor")
    if passed == len(cases):
        m.ok(f"all {len(cases)} cases match minillm.sampler.top_p_filter (random rows, batches, top_p=1, "
             f"tiny top_p, -inf entries, one-token vocabulary, ties, huge logits)")
    else:
        m.missing(f"{passed} of {len(cases)} cases match minillm.sampler.top_p_filter")
        for p in problems[:4]:
            m.wrong(p)
        if any("keep" in p for p in problems):
            m.info("rule: sort by probability, keep the smallest prefix whose probability adds up to at least "
                   "top_p — a token is kept when the mass ranked above it is still below top_p")


# =============================================================================================
# KV bytes per token
# =============================================================================================
KV_CONFIGS = [
    # (name, num_layers, num_kv_heads, head_dim, dtype_bytes)
    ("Llama-2-7B, fp16 (MHA: 32 KV heads)", 32, 32, 128, 2),
    ("Llama-3-8B, bf16 (GQA: 8 KV heads)", 32, 8, 128, 2),
    ("Qwen2.5-0.5B, bf16 (2 KV heads)", 24, 2, 64, 2),
    ("Qwen3-0.6B, bf16", 28, 8, 128, 2),
    ("a tiny model in fp32", 2, 2, 32, 4),
    ("Llama-3-8B with an int8 KV cache", 32, 8, 128, 1),
]


_SHIPPED: list = []


def shipped_config() -> tuple | None:
    """The shipped model's shape (read once: ``minillm grade`` reads it before student code runs)."""
    if not _SHIPPED:
        _SHIPPED.append(_read_shipped_config())
    return _SHIPPED[0]


def _read_shipped_config() -> tuple | None:
    try:
        from minillm.models.loader import load_config, resolve_model_dir

        cfg = load_config(resolve_model_dir(None))
        return ("the shipped model, fp32 on CPU", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4)
    except Exception:
        return None


@register("code_kv_bytes", "Code · KV bytes per token", "§3 KV cache", 2, answer_name="my_kv_bytes_per_token",
          kind="code")
def grade_kv_bytes(fn, m: Marks) -> None:
    try:
        from minillm.kv_cache import kv_bytes_per_token
    except Exception as exc:
        raise CannotGrade(f"the engine's kv_cache module could not be imported ({type(exc).__name__}: {exc})")
    if not callable(fn):
        m.wrong(f"my_kv_bytes_per_token should be a function, got {type(fn).__name__}")
        return
    configs = list(KV_CONFIGS)
    shipped = shipped_config()
    if shipped:
        configs.insert(0, shipped)
    passed, problems, hints = 0, [], set()
    for i, (name, layers, heads, dim, nbytes) in enumerate(configs):
        out = safecall.call(fn, layers, heads, dim, nbytes)
        if i == 0:
            _not_attempted_if_stub(out, "my_kv_bytes_per_token")
        if out.timed_out:
            problems.append(f"{name}: {out.error}; stopped here")
            break
        if not out.ok:
            problems.append(f"{name}: your function raised {out.error}")
            continue
        ref = kv_bytes_per_token(layers, heads, dim, nbytes)
        y = out.value
        if isinstance(y, bool) or not isinstance(y, (int, float)) and not hasattr(y, "__index__"):
            problems.append(f"{name}: return a number of bytes (an int), got {type(y).__name__}")
            continue
        if float(y) == ref:
            passed += 1
            if not isinstance(y, int):
                hints.add("return an int: a byte count is a whole number")
            continue
        problems.append(f"{name} (layers={layers}, kv_heads={heads}, head_dim={dim}, dtype_bytes={nbytes}): "
                        f"you get {y:,}, the engine {ref:,}")
        ratio = float(y) / ref if ref else 0
        if abs(ratio - 0.5) < 1e-9:
            hints.add("you are off by a factor 2: every token stores a key AND a value")
        elif abs(ratio * nbytes - 1) < 1e-9:
            hints.add("you count elements, not bytes: multiply by dtype_bytes")
        elif abs(ratio * layers - 1) < 1e-9 or abs(ratio * layers - 0.5) < 1e-9:
            hints.add("every layer has its own K and V: multiply by num_layers")
        elif abs(ratio * heads - 1) < 1e-9:
            hints.add("each KV head stores its own head_dim numbers: multiply by num_kv_heads")
    _fraction_points(m, passed, len(configs), 2)
    if passed == len(configs):
        m.ok(f"all {len(configs)} model shapes match minillm.kv_cache.kv_bytes_per_token")
        per = kv_bytes_per_token(32, 8, 128, 2)
        m.info(f"for scale: Llama-3-8B needs {per:,} bytes per token, so one 8,192-token context holds "
               f"{per * 8192 / 2**30:.0f} GiB of KV cache")
    else:
        m.missing(f"{passed} of {len(configs)} model shapes match minillm.kv_cache.kv_bytes_per_token")
        for p in problems[:3]:
            m.wrong(p)
    for h in sorted(hints):
        m.info(h)


# =============================================================================================
# Stop conditions
# =============================================================================================
@dataclass
class _StopCase:
    name: str
    token_id: int
    output_ids: list
    text: str
    params: dict
    prompt_len: int
    max_model_len: int = 256
    eos_token_id: int = 2


def stop_cases() -> list[_StopCase]:
    C = _StopCase
    return [
        C("an ordinary token", 17, [5, 9, 17], "Once upon a", dict(max_tokens=16), 4),
        C("the model's EOS token", 2, [5, 9, 2], "Once upon", dict(max_tokens=16), 4),
        C("EOS with ignore_eos=True", 2, [5, 9, 2], "Once upon", dict(max_tokens=16, ignore_eos=True), 4),
        C("a token from stop_token_ids", 42, [5, 42], "Once", dict(max_tokens=16, stop_token_ids=[42, 43]), 4),
        C("a stop_token_id with ignore_eos=True (ignore_eos only skips the model's EOS)", 43, [5, 43], "Once",
          dict(max_tokens=16, stop_token_ids=[42, 43], ignore_eos=True), 4),
        C("a stop string in the text", 11, [5, 9, 11], "Once upon a time. The end", dict(max_tokens=16, stop=["The end"]), 4),
        C("one of several stop strings", 11, [5, 9, 11], "She said: bye!", dict(max_tokens=16, stop=["STOP", "bye"]), 4),
        C("stop given as one string (use params.stop_strings)", 11, [5, 11], "a quiet meadow",
          dict(max_tokens=16, stop="the end"), 4),
        C("no stop strings configured", 11, [5, 11], "the end", dict(max_tokens=16), 4),
        C("max_tokens reached", 17, [5, 9, 17, 8, 17], "a b c d e", dict(max_tokens=5), 4),
        C("one token before max_tokens", 17, [5, 9, 17, 17], "a b c d", dict(max_tokens=5), 4),
        C("EOS and max_tokens at once (EOS comes first)", 2, [5, 9, 17, 8, 2], "a b c d", dict(max_tokens=5), 4),
        C("stop string and max_tokens at once (the stop string comes first)", 11, [5, 9, 11], "x The end",
          dict(max_tokens=3, stop=["The end"]), 4),
        C("the context is full", 17, [5, 9, 17], "a b c", dict(max_tokens=100), 29, 32),
        C("max_tokens and a full context at once (max_tokens comes first)", 17, [5, 9, 17], "a b c",
          dict(max_tokens=3), 29, 32),
        C("EOS at a full context (EOS comes first)", 2, [5, 9, 2], "a b", dict(max_tokens=100), 29, 32),
    ]


def expected_stop(case: _StopCase, params):
    """The engine's semantics: EOS / stop token -> stop string -> max_tokens -> context full."""
    from minillm import StopReason

    if (case.token_id == case.eos_token_id and not params.ignore_eos) or case.token_id in params.stop_token_ids:
        return StopReason.EOS
    if any(s in case.text for s in params.stop_strings):
        return StopReason.STOP_STRING
    if len(case.output_ids) >= params.max_tokens:
        return StopReason.MAX_TOKENS
    if case.prompt_len + len(case.output_ids) >= case.max_model_len:
        return StopReason.CONTEXT_FULL
    return None


def _as_reason(value):
    """(StopReason or None, a note) from what the student returned; raises TypeError if unusable."""
    from minillm import StopReason

    if value is None or isinstance(value, StopReason):
        return value, None
    if isinstance(value, str):
        key = value.strip().upper().replace(" ", "_")
        if key.startswith("STOPREASON."):
            key = key.split(".", 1)[1]
        if key in StopReason.__members__:
            return StopReason[key], "return StopReason members (StopReason.EOS), not strings"
    raise TypeError(f"return a StopReason or None, got {value!r}")


@register("code_stop_check", "Code · the stop-condition check", "§6 finish and release", 3,
          answer_name="my_check_stop", kind="code")
def grade_stop(fn, m: Marks) -> None:
    try:
        from minillm import SamplingParams
    except Exception as exc:
        raise CannotGrade(f"the engine could not be imported ({type(exc).__name__}: {exc})")
    if not callable(fn):
        m.wrong(f"my_check_stop should be a function, got {type(fn).__name__}")
        return
    cases = stop_cases()
    passed, problems, notes = 0, [], set()
    for i, case in enumerate(cases):
        params = SamplingParams(**case.params)
        out = safecall.call(fn, case.token_id, list(case.output_ids), case.text, params, case.eos_token_id,
                            case.prompt_len, case.max_model_len)
        if i == 0:
            _not_attempted_if_stub(out, "my_check_stop")
        if out.timed_out:
            problems.append(f"{case.name}: {out.error}; stopped here")
            break
        if not out.ok:
            problems.append(f"{case.name}: your function raised {out.error}")
            continue
        try:
            got, note = _as_reason(out.value)
        except TypeError as exc:
            problems.append(f"{case.name}: {exc}")
            continue
        if note:
            notes.add(note)
        want = expected_stop(case, params)
        if got == want:
            passed += 1
        else:
            fmt = lambda r: "None (keep going)" if r is None else f"StopReason.{r.name}"  # noqa: E731
            problems.append(f"{case.name}: expected {fmt(want)}, got {fmt(got)}")
    _fraction_points(m, passed, len(cases), 3)
    if passed == len(cases):
        m.ok(f"all {len(cases)} cases agree with the engine's stop semantics, including the order "
             f"EOS → stop string → max_tokens → context full")
    else:
        m.missing(f"{passed} of {len(cases)} cases agree with the engine's stop semantics")
        for p in problems[:4]:
            m.wrong(p)
    for n in sorted(notes):
        m.info(n)


# =============================================================================================
# Task 3, part b: the KV bytes of three scenarios, measured by the engine
# =============================================================================================
@dataclass(frozen=True)
class Scenario:
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    why: str

    def as_kwargs(self) -> dict:
        return {"num_requests": self.num_requests, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens}


PRESSURE_SCENARIOS: dict[str, Scenario] = {
    "long_context": Scenario(1, 120, 4, "one request with a long prompt"),
    "high_concurrency": Scenario(10, 12, 6, "ten short requests running at once"),
    "long_output": Scenario(1, 8, 64, "one short prompt that generates a long answer"),
}


def show_scenarios() -> None:
    """Print the three scenarios (what the engine will run for ``task3_kv_bytes``)."""
    print(f"{'scenario':<18}{'requests':>9}{'prompt tokens':>15}{'output tokens':>15}   what it models")
    for name, s in PRESSURE_SCENARIOS.items():
        print(f"{name:<18}{s.num_requests:>9}{s.prompt_tokens:>15}{s.output_tokens:>15}   {s.why}")


_ENGINE = None
_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # engine -> {Scenario: Measured}


def engine():
    """The engine the byte-count check runs its scenarios on: the shipped model, created once,
    with a KV budget just large enough for the scenarios (block size and bytes per token are
    the defaults, so ``used_bytes`` is what ``LLM()`` would report)."""
    global _ENGINE
    if _ENGINE is None:
        from minillm import LLM

        need = max(s.num_requests * (s.prompt_tokens + s.output_tokens) for s in PRESSURE_SCENARIOS.values())
        _ENGINE = LLM(kv_cache_tokens=2 * need)
    return _ENGINE


@dataclass
class Measured:
    used_bytes: int  # what cache_stats() reports: whole blocks
    token_bytes: int  # every prompt and output token x bytes_per_token
    written_bytes: int  # the tokens whose K and V were written (the last sampled token is not yet)
    bytes_per_token: int
    block_size: int


def run_scenario(llm, s: Scenario, seed: int = 0) -> Measured:
    """Run ``s`` to the end with ``auto_release=False`` and read the cache before releasing."""
    from minillm import SamplingParams, StopReason

    if llm.has_unfinished() or any(r.block_table for r in llm.requests.values()):
        raise CannotGrade("the grading engine is busy with other requests")
    if s.prompt_tokens + s.output_tokens > llm.max_model_len:
        raise CannotGrade(f"the model's context ({llm.max_model_len} tokens) is too short for this scenario")
    rng = random.Random(seed)
    vocab = llm.model_config.vocab_size
    reqs = []
    for _ in range(s.num_requests):  # distinct random prompts: no prefix is shared between them
        ids = [rng.randrange(vocab) for _ in range(s.prompt_tokens)]
        params = SamplingParams(max_tokens=s.output_tokens, temperature=0.0, ignore_eos=True)
        reqs.append(llm.add_request(prompt_token_ids=ids, params=params, auto_release=False))
    try:
        for _ in range(100_000):
            if not llm.has_unfinished():
                break
            llm.step()
        stats = llm.cache_stats()
        if any(r.num_preemptions for r in reqs) or any(r.stop_reason != StopReason.MAX_TOKENS for r in reqs):
            raise CannotGrade("the scenario did not run cleanly (preempted or stopped early)")
        tokens = sum(r.num_tokens for r in reqs)
        bpt = stats.bytes_per_token
        return Measured(stats.used_bytes, tokens * bpt, (tokens - len(reqs)) * bpt, bpt, stats.block_size)
    finally:
        for r in reqs:
            if r.state.value == "FINISHED":
                llm.release(r.request_id)


def measure(llm, s: Scenario) -> Measured:
    """``run_scenario``, once per engine and scenario (the engine is deterministic)."""
    done = _MEASURED.setdefault(llm, {})
    if s not in done:
        done[s] = run_scenario(llm, s)
    return done[s]


def _student_numbers(answer) -> dict:
    if isinstance(answer, dict):
        return {"kind": "dict", "values": answer}
    if callable(answer):
        return {"kind": "function", "fn": answer}
    raise TypeError(f"task3_kv_bytes should be your function scenario_kv_bytes(num_requests, prompt_tokens, "
                    f"output_tokens) or a dict {{scenario name: bytes}}, got {type(answer).__name__}")


@register("task3_kv_bytes", "Task 3 · KV bytes of each scenario, checked by the engine", "§3 KV cache", 3,
          kind="engine")
def grade_task3_bytes(answer, m: Marks) -> None:
    try:
        given = _student_numbers(answer)
    except TypeError as exc:
        m.wrong(str(exc))
        return
    values: dict = {}
    for i, (name, s) in enumerate(PRESSURE_SCENARIOS.items()):
        if given["kind"] == "function":
            out = safecall.call(given["fn"], **s.as_kwargs())
            if i == 0:
                _not_attempted_if_stub(out, "scenario_kv_bytes")
            values[name] = out.value if out.ok else out
        else:
            values[name] = given["values"].get(name)
    if given["kind"] == "dict" and all(v is None or v is Ellipsis for v in values.values()):
        raise NotAttempted("task3_kv_bytes has no numbers yet")
    try:
        llm = engine()
    except Exception as exc:
        raise CannotGrade(f"the engine could not be loaded to run the scenarios ({type(exc).__name__}: {exc})")
    for name, s in PRESSURE_SCENARIOS.items():
        v = values[name]
        if isinstance(v, safecall.Outcome):
            m.wrong(f"{name}: your function raised {v.error}")
            continue
        if v is None:
            m.missing(f"{name}: no number given")
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            m.wrong(f"{name}: expected a number of bytes, got {type(v).__name__}")
            continue
        got = measure(llm, s)
        if v == got.used_bytes:
            m.ok(f"{name}: {int(v):,} bytes — exactly what cache_stats().used_bytes reports "
                 f"(whole blocks of {got.block_size} tokens)", 1)
        elif v in (got.token_bytes, got.written_bytes):
            m.ok(f"{name}: {int(v):,} bytes is right per token; the engine reports {got.used_bytes:,} because it "
                 f"hands out whole blocks of {got.block_size} tokens", 1)
        else:
            m.wrong(f"{name}: you get {v:,} bytes, the engine reports {got.used_bytes:,} "
                    f"({got.bytes_per_token:,} bytes per token, blocks of {got.block_size} tokens)")
            ratio = v / got.token_bytes if got.token_bytes else 0
            if abs(ratio - 0.5) < 0.02:
                m.info("off by a factor 2: count both K and V")
            elif s.num_requests > 1 and abs(ratio * s.num_requests - 1) < 0.05:
                m.info(f"this is one request's worth: {s.num_requests} requests each hold their own cache")
            elif abs(ratio * 4 - 1) < 0.05:
                m.info("the engine runs in fp32 on the CPU: 4 bytes per number")
            continue
        waste = 1 - got.token_bytes / got.used_bytes if got.used_bytes else 0
        if waste > 0.3:
            m.info(f"{name}: {waste:.0%} of the reserved blocks' room is empty — each of the {s.num_requests} short "
                   f"requests leaves its last block partly unused (chapter 05: paged attention and block size)")


# =============================================================================================
# The long chat (chapter scenario 1): KV bytes at turn k, full history or the last N turns
# =============================================================================================
@dataclass(frozen=True)
class ChatCase:
    name: str
    turn: int
    system_tokens: int
    user_tokens: int
    reply_tokens: int
    keep_last: int | None


def chat_cases() -> list[ChatCase]:
    C = ChatCase
    return [
        C("turn 1 (no history yet)", 1, 40, 20, 30, None),
        C("turn 2, full history", 2, 40, 20, 30, None),
        C("turn 10, full history", 10, 40, 20, 30, None),
        C("turn 25, a long system prompt", 25, 400, 15, 60, None),
        C("turn 10, keep the last 3 turns", 10, 40, 20, 30, 3),
        C("turn 2, keep the last 3 turns (fewer turns than N so far)", 2, 40, 20, 30, 3),
        C("turn 8, keep the last 0 turns (only the new message)", 8, 40, 20, 30, 0),
        C("turn 30, keep the last 5 turns", 30, 100, 25, 80, 5),
    ]


def expected_chat_tokens(c: ChatCase) -> int:
    """Tokens of the one request that turn ``c.turn`` sends, once its reply is generated: the system
    prompt, the earlier turns it re-sends (all of them, or the last ``keep_last``), the new user
    message and the reply."""
    earlier = c.turn - 1 if c.keep_last is None else min(c.turn - 1, c.keep_last)
    return c.system_tokens + earlier * (c.user_tokens + c.reply_tokens) + c.user_tokens + c.reply_tokens


@register("code_chat_kv", "Code · the long chat: KV bytes at turn k", "§3 scenario 1 (long chat)", 2,
          answer_name="chat_kv_bytes", kind="code")
def grade_chat_kv(fn, m: Marks) -> None:
    try:
        from minillm.kv_cache import kv_bytes_per_token
    except Exception as exc:
        raise CannotGrade(f"the engine's kv_cache module could not be imported ({type(exc).__name__}: {exc})")
    if not callable(fn):
        m.wrong(f"chat_kv_bytes should be a function, got {type(fn).__name__}")
        return
    shipped = shipped_config()
    bpt = kv_bytes_per_token(*shipped[1:]) if shipped else kv_bytes_per_token(4, 4, 32, 4)
    passed, problems, hints = 0, [], set()
    cases = chat_cases()
    for i, c in enumerate(cases):
        out = safecall.call(fn, c.turn, c.system_tokens, c.user_tokens, c.reply_tokens, bpt, c.keep_last)
        if i == 0:
            _not_attempted_if_stub(out, "chat_kv_bytes")
        if out.timed_out:
            problems.append(f"{c.name}: {out.error}; stopped here")
            break
        if not out.ok:
            problems.append(f"{c.name}: your function raised {out.error}")
            continue
        y, want = out.value, expected_chat_tokens(c) * bpt
        if isinstance(y, bool) or type(y) not in (int, float):
            problems.append(f"{c.name}: return a number of bytes (an int), got {type(y).__name__}")
            continue
        if y == want:
            passed += 1
            continue
        problems.append(f"{c.name}: you get {y:,.0f} bytes, the request holds {want:,}")
        tokens = y / bpt
        earlier = c.turn - 1 if c.keep_last is None else min(c.turn - 1, c.keep_last)
        if tokens == want / bpt - c.reply_tokens:
            hints.add("count the reply too: its tokens' K and V are in the cache by the end of the turn")
        elif tokens == want / bpt - c.system_tokens:
            hints.add("every turn re-sends the system prompt: it is part of each request")
        elif c.keep_last is not None and tokens == c.system_tokens + c.keep_last * (c.user_tokens + c.reply_tokens) \
                + c.user_tokens + c.reply_tokens:
            hints.add("with keep_last=N, early turns have fewer than N earlier turns to keep")
        elif earlier and tokens == c.system_tokens + c.turn * (c.user_tokens + c.reply_tokens) + c.user_tokens \
                + c.reply_tokens:
            hints.add("at turn k there are k - 1 earlier turns, not k")
    _fraction_points(m, passed, len(cases), 2)
    if passed == len(cases):
        m.ok(f"all {len(cases)} cases agree: at turn k one request holds the system prompt, the re-sent history, the "
             f"new message and its reply, {bpt:,} bytes per token on the shipped model")
    else:
        m.missing(f"{passed} of {len(cases)} cases agree")
        for p in problems[:3]:
            m.wrong(p)
    for h in sorted(hints):
        m.info(h)
