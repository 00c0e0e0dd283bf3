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

Student functions run through :mod:`safecall` (a time limit, errors become feedback), with the
engine's own answer to the task unavailable (:mod:`engine_guard`). The random cases, and task 3's
hidden scenarios, are drawn fresh from :func:`run_seed` (recorded in ``minillm grade``'s report;
``MINILLM_GRADE_SEED`` repeats a run), so answers looked up from earlier output fail.
torch and the engine are imported only when one of these checks runs.
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass

from .. import safecall
from ..cases import CaseRun, engine_piece, run_seed
from ..engine_guard import ALLOW, WHOLE_ENGINE
from ..messages import msg
from ..registry import CannotGrade, Marks, NotAttempted, register


#: answer name -> the engine functions ("module:function") that must not answer it; ``WHOLE_ENGINE``:
#: no function of the package runs during the call either (the fast path, the graders' references)
FORBIDDEN = {
    "my_top_p_filter": ("minillm.sampler:top_p_filter", WHOLE_ENGINE),
    "my_kv_bytes_per_token": ("minillm.kv_cache:kv_bytes_per_token", "minillm.engine_args:kv_bytes_per_token",
                              WHOLE_ENGINE),
    "my_check_stop": ("minillm.scheduler:check_stop", WHOLE_ENGINE),
    "chat_kv_bytes": ("minillm.kv_cache:kv_bytes_per_token", "minillm.engine_args:kv_bytes_per_token", WHOLE_ENGINE),
    "scenario_kv_bytes": ("minillm.kv_cache:kv_bytes_per_token", WHOLE_ENGINE, ALLOW + "minillm.llm.LLM.cache_stats",
                          ALLOW + "minillm.kv_cache.CacheStats"),  # reading the block size is fine
    "max_requests": ("minillm.viz.kv_capacity:capacity", WHOLE_ENGINE),
}

# =============================================================================================
# Top-p (nucleus) filter
# =============================================================================================
@dataclass
class _TopPCase:
    name: str
    logits: object  # torch.Tensor
    top_p: float
    tie_tolerant: bool = False
    zh: str = ""  # the name in Chinese

    def label(self, lang: str | None = None) -> str:
        from ...i18n import resolve

        return self.zh if resolve(lang) == "zh" and self.zh else self.name


def _safe_margin(logits, top_p) -> bool:
    """True when no row's cumulative probability sits within 1e-4 of top_p (float-fragile)."""

    probs = logits.float().softmax(-1).sort(-1, descending=True).values
    cum = probs.cumsum(-1)
    return bool(((cum - top_p).abs() > 1e-4).all())


def top_p_cases(seed: int | None = None) -> list[_TopPCase]:
    """Random cases drawn from ``seed`` (default: :func:`run_seed`), fixed edge cases, and numerically
    hostile ones (logits near ±1000 where a hand-written softmax overflows, an all-masked row)."""
    import torch

    g = torch.Generator().manual_seed(run_seed() if seed is None else seed)
    cases = []

    def rand(shape, scale, p, name, zh):
        for _ in range(50):  # draw until no row sits on a float-fragile boundary
            x = torch.randn(*shape, generator=g) * scale
            if _safe_margin(x, p):
                cases.append(_TopPCase(name, x, p, zh=zh))
                return
        raise RuntimeError("could not draw a top-p case away from the boundary")

    rand((10,), 2.0, 0.9, "10 random logits, top_p=0.9", "10 个随机 logits，top_p=0.9")
    rand((50,), 1.5, 0.5, "50 random logits, top_p=0.5", "50 个随机 logits，top_p=0.5")
    rand((4, 32), 3.0, 0.8, "a batch of 4 rows × 32, top_p=0.8", "一批 4 行 × 32，top_p=0.8")
    rand((3, 100), 0.5, 0.95, "flat-ish distribution, 3 rows × 100, top_p=0.95", "较平的分布，3 行 × 100，top_p=0.95")
    _hostile(cases, g, rand)
    C = _TopPCase
    cases.append(C("top_p=1.0 keeps every token", torch.randn(16, generator=g), 1.0, zh="top_p=1.0 保留所有 token"))
    cases.append(C("tiny top_p keeps only the most likely token", torch.randn(16, generator=g), 1e-6,
                   zh="极小的 top_p 只保留概率最大的 token"))
    peaked = torch.zeros(12)
    peaked[7] = 20.0
    cases.append(C("one dominant token (logit 20), top_p=0.9", peaked, 0.9, zh="一个占主导的 token（logit 20），top_p=0.9"))
    with_inf = torch.tensor([2.0, float("-inf"), 1.0, 0.5, float("-inf"), 3.0, -1.0])
    cases.append(C("logits that already hold -inf, top_p=0.7", with_inf, 0.7, zh="logits 里已经有 -inf，top_p=0.7"))
    cases.append(C("a vocabulary of one token", torch.tensor([0.3]), 0.5, zh="只有一个 token 的词表"))
    cases.append(C("two tied top tokens both needed, top_p=0.5", torch.tensor([2.0, 2.0, 1.0, 1.0, 0.0]), 0.5,
                   zh="两个并列第一的 token 都要保留，top_p=0.5"))
    cases.append(C("large logits (numerically unstable softmax if done by hand), top_p=0.6",
                   torch.tensor([1000.0, 999.0, 998.0, 990.0, 0.0]), 0.6,
                   zh="很大的 logits（手写 softmax 会数值溢出），top_p=0.6"))
    return cases


def _hostile(cases: list, g, rand) -> None:
    """Cases a shortcut gets wrong: logits shifted to ±1000 (exp overflows or underflows unless the
    maximum is subtracted first) that keep several tokens, and a batch with a row that is all -inf."""
    import torch

    for shift, zh in ((1000.0, "很大"), (-1000.0, "很小")):
        for _ in range(50):
            x = torch.randn(8, generator=g) * 1.5
            if _safe_margin(x + shift, 0.85) and int((~torch.isneginf(_ref_top_p(x, 0.85))).sum()) >= 3:
                cases.append(_TopPCase(f"logits near {shift:+.0f} that keep several tokens, top_p=0.85",
                                       x + shift, 0.85, zh=f"接近 {shift:+.0f} 的{zh} logits，要保留好几个 token，top_p=0.85"))
                break
    for _ in range(50):
        rows = torch.randn(3, 12, generator=g) * 2.0
        rows[1] = float("-inf")
        if not _safe_margin(rows[[0, 2]], 0.7):
            continue
        cases.append(_TopPCase("a batch whose middle row is all -inf (it stays all -inf), top_p=0.7", rows, 0.7,
                               zh="一批中间一行全是 -inf（它应保持全 -inf），top_p=0.7"))
        break


def _ref_top_p(x, p):
    from minillm.sampler import top_p_filter

    return top_p_filter(x.clone(), p)


def _describe_keep(mask) -> str:
    if mask.dim() == 1:
        idx = [int(i) for i in mask.nonzero().flatten()[:8]]
        return msg("top_p.keep_row", n=int(mask.sum()), ids=f"{idx}{'…' if int(mask.sum()) > 8 else ''}")
    per_row = [int(n) for n in mask.reshape(-1, mask.shape[-1]).sum(-1)]
    return msg("top_p.keep_rows", n=sum(per_row), rows=per_row)


def _top_p_problem(m: Marks, name: str, y, ref, logits) -> tuple[str, str] | None:
    """What is wrong with ``y``, the learner's filtered logits, against the engine's ``ref``:
    (message key, feedback line), or None when it is right."""
    import torch

    if not isinstance(y, torch.Tensor):
        return "top_p.not_tensor", m.t("top_p.not_tensor", case=name, type=type(y).__name__)
    if y.shape != ref.shape:
        return "top_p.shape", m.t("top_p.shape", case=name, got=list(y.shape), want=list(ref.shape))
    if y.dtype == torch.bool:
        return "top_p.mask", m.t("top_p.mask", case=name)
    kept_ref = ~torch.isneginf(ref)
    yf = y.float()
    kept = ~torch.isneginf(yf)
    if (yf >= 0).all() and (yf <= 1).all() and torch.allclose(yf.sum(-1), torch.ones(()), atol=1e-3) \
            and not torch.allclose(yf, logits.float()):
        return "top_p.probs", m.t("top_p.probs", case=name)
    if not torch.equal(kept, kept_ref):
        return "top_p.keep", m.t("top_p.keep", case=name, got=_describe_keep(kept), want=_describe_keep(kept_ref))
    if not torch.allclose(yf[kept], logits.float()[kept_ref], atol=1e-5, rtol=1e-5):
        return "top_p.changed", m.t("top_p.changed", case=name)
    return None


def _load_top_p():
    import torch  # noqa: F401

    from minillm.sampler import top_p_filter

    return top_p_filter


@register("code_top_p", "Code · a top-p (nucleus) filter", "§4 sampling", 3, answer_name="my_top_p_filter",
          kind="code", title_zh="编程 · top-p（nucleus）过滤")
def grade_top_p(fn, m: Marks) -> None:
    top_p_filter = engine_piece(m, fn, "my_top_p_filter", "minillm.sampler", _load_top_p)
    if top_p_filter is None:
        return
    import torch

    run = CaseRun(fn, top_p_cases(), lambda case: (case.logits.clone(), case.top_p), name="my_top_p_filter",
                  label=lambda case: case.label(m.lang), forbid=FORBIDDEN["my_top_p_filter"])
    in_place, keep_wrong = False, False
    for case, name, (given, _), y in run:
        ref = top_p_filter(case.logits.clone(), case.top_p)
        problem = _top_p_problem(m, name, y, ref, case.logits)
        if problem:
            key, text = problem
            run.fail(text)
            keep_wrong = keep_wrong or key == "top_p.keep"
            continue
        run.passed()
        in_place = in_place or not torch.equal(given, case.logits)
    if in_place:
        m.info(m.t("top_p.in_place"))
    if not run.report(m, 3, m.t("top_p.all", n=run.total), m.t("top_p.some", passed=run.passes, n=run.total), 4) \
            and keep_wrong:
        m.info(m.t("top_p.rule"))


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
_SHIPPED_NAME = "the shipped model, fp32 on CPU"
KV_CONFIG_ZH = {  # the same names, in Chinese
    "Llama-2-7B, fp16 (MHA: 32 KV heads)": "Llama-2-7B，fp16（MHA：32 个 KV 头）",
    "Llama-3-8B, bf16 (GQA: 8 KV heads)": "Llama-3-8B，bf16（GQA：8 个 KV 头）",
    "Qwen2.5-0.5B, bf16 (2 KV heads)": "Qwen2.5-0.5B，bf16（2 个 KV 头）",
    "Qwen3-0.6B, bf16": "Qwen3-0.6B，bf16",
    "a tiny model in fp32": "一个 fp32 的小模型",
    "Llama-3-8B with an int8 KV cache": "Llama-3-8B，KV 缓存用 int8",
    _SHIPPED_NAME: "随附的模型，CPU 上 fp32",
}


_SHIPPED: list = []


def fresh_kv_configs(seed: int | None = None, n: int = 2) -> list[tuple]:
    """``n`` model shapes drawn from the run's seed (never printed before grading), each
    ``(name, layers, kv_heads, head_dim, dtype_bytes, name in Chinese)``."""
    rng = random.Random((run_seed() if seed is None else seed) ^ 0xC0DE)
    out = []
    for _ in range(n):
        shape = (rng.randint(2, 96), rng.choice((1, 2, 4, 8, 16, 40)), rng.choice((48, 64, 80, 96, 128, 256)),
                 rng.choice((1, 2, 4)))
        out.append((f"a shape drawn for this run: {shape[0]} layers, {shape[1]} KV heads, head_dim {shape[2]}, "
                    f"{shape[3]} byte(s)", *shape,
                    f"本次随机抽取的形状：{shape[0]} 层，{shape[1]} 个 KV 头，head_dim {shape[2]}，{shape[3]} 字节"))
    return out


def shipped_config() -> tuple | None:
    """The shipped model's shape (read once: ``minillm grade`` reads it before student code runs)."""
    if not _SHIPPED:
        _SHIPPED.append(_read_shipped_config())
    return _SHIPPED[0]


def _read_shipped_config() -> tuple | None:
    try:
        from minillm.models.loader import load_config, resolve_model_dir

        cfg = load_config(resolve_model_dir(None))
        return (_SHIPPED_NAME, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4)
    except Exception:
        return None


def _load_kv_bytes():
    from minillm.kv_cache import kv_bytes_per_token

    return kv_bytes_per_token


@register("code_kv_bytes", "Code · KV bytes per token", "§3 KV cache", 2, answer_name="my_kv_bytes_per_token",
          kind="code", title_zh="编程 · 每个 token 的 KV 字节数")
def grade_kv_bytes(fn, m: Marks) -> None:
    kv_bytes_per_token = engine_piece(m, fn, "my_kv_bytes_per_token", "minillm.kv_cache", _load_kv_bytes)
    if kv_bytes_per_token is None:
        return
    configs = list(KV_CONFIGS) + fresh_kv_configs()
    shipped = shipped_config()
    if shipped:
        configs.insert(0, shipped)
    hints = set()

    def label(config) -> str:
        if m.lang != "zh":
            return config[0]
        return config[5] if len(config) > 5 else KV_CONFIG_ZH.get(config[0], config[0])

    run = CaseRun(fn, configs, lambda config: config[1:5], name="my_kv_bytes_per_token", label=label,
                  forbid=FORBIDDEN["my_kv_bytes_per_token"], fresh=lambda config: len(config) > 5)
    for _, name, (layers, heads, dim, nbytes), y in run:
        ref = kv_bytes_per_token(layers, heads, dim, nbytes)
        if isinstance(y, bool) or not isinstance(y, (int, float)) and not hasattr(y, "__index__"):
            run.fail(m.t("code.not_number", case=name, type=type(y).__name__))
            continue
        if float(y) == ref:
            run.passed()
            if not isinstance(y, int):
                hints.add("kv.int")
            continue
        run.fail(m.t("kv.mismatch", case=name, layers=layers, heads=heads, dim=dim, nbytes=nbytes, got=y, want=ref))
        ratio = float(y) / ref if ref else 0
        if abs(ratio - 0.5) < 1e-9:
            hints.add("kv.factor2")
        elif abs(ratio * nbytes - 1) < 1e-9:
            hints.add("kv.elements")
        elif abs(ratio * layers - 1) < 1e-9 or abs(ratio * layers - 0.5) < 1e-9:
            hints.add("kv.layers")
        elif abs(ratio * heads - 1) < 1e-9:
            hints.add("kv.heads")
    if run.report(m, 2, m.t("kv.all", n=run.total), m.t("kv.some", passed=run.passes, n=run.total)):
        per = kv_bytes_per_token(32, 8, 128, 2)
        m.info(m.t("kv.scale", per=per, gib=per * 8192 / 2**30))
    for h in sorted(m.t(k) for k in hints):
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
    zh: str = ""  # the name in Chinese

    def label(self, lang: str | None = None) -> str:
        from ...i18n import resolve

        return self.zh if resolve(lang) == "zh" and self.zh else self.name


def stop_cases() -> list[_StopCase]:
    def C(name, zh, *args):
        return _StopCase(name, *args, zh=zh)

    return [
        C("an ordinary token", "一个普通 token", 17, [5, 9, 17], "Once upon a", dict(max_tokens=16), 4),
        C("the model's EOS token", "模型的 EOS token", 2, [5, 9, 2], "Once upon", dict(max_tokens=16), 4),
        C("EOS with ignore_eos=True", "ignore_eos=True 时的 EOS", 2, [5, 9, 2], "Once upon",
          dict(max_tokens=16, ignore_eos=True), 4),
        C("a token from stop_token_ids", "stop_token_ids 里的 token", 42, [5, 42], "Once",
          dict(max_tokens=16, stop_token_ids=[42, 43]), 4),
        C("a stop_token_id with ignore_eos=True (ignore_eos only skips the model's EOS)",
          "ignore_eos=True 时的 stop_token_id（ignore_eos 只跳过模型的 EOS）", 43, [5, 43], "Once",
          dict(max_tokens=16, stop_token_ids=[42, 43], ignore_eos=True), 4),
        C("a stop string in the text", "文本中出现停止字符串", 11, [5, 9, 11], "Once upon a time. The end",
          dict(max_tokens=16, stop=["The end"]), 4),
        C("one of several stop strings", "多个停止字符串之一", 11, [5, 9, 11], "She said: bye!",
          dict(max_tokens=16, stop=["STOP", "bye"]), 4),
        C("stop given as one string (use params.stop_strings)", "stop 只给了一个字符串（请用 params.stop_strings）",
          11, [5, 11], "a quiet meadow", dict(max_tokens=16, stop="the end"), 4),
        C("no stop strings configured", "没有配置停止字符串", 11, [5, 11], "the end", dict(max_tokens=16), 4),
        C("max_tokens reached", "达到 max_tokens", 17, [5, 9, 17, 8, 17], "a b c d e", dict(max_tokens=5), 4),
        C("one token before max_tokens", "离 max_tokens 还差一个 token", 17, [5, 9, 17, 17], "a b c d",
          dict(max_tokens=5), 4),
        C("EOS and max_tokens at once (EOS comes first)", "EOS 与 max_tokens 同时满足（EOS 优先）", 2,
          [5, 9, 17, 8, 2], "a b c d", dict(max_tokens=5), 4),
        C("stop string and max_tokens at once (the stop string comes first)",
          "停止字符串与 max_tokens 同时满足（停止字符串优先）", 11, [5, 9, 11], "x The end",
          dict(max_tokens=3, stop=["The end"]), 4),
        C("the context is full", "上下文已满", 17, [5, 9, 17], "a b c", dict(max_tokens=100), 29, 32),
        C("max_tokens and a full context at once (max_tokens comes first)",
          "max_tokens 与上下文已满同时满足（max_tokens 优先）", 17, [5, 9, 17], "a b c", dict(max_tokens=3), 29, 32),
        C("EOS at a full context (EOS comes first)", "上下文已满时遇到 EOS（EOS 优先）", 2, [5, 9, 2], "a b",
          dict(max_tokens=100), 29, 32),
    ]


def fresh_stop_cases(seed: int | None = None, n: int = 4) -> list[_StopCase]:
    """``n`` stop cases drawn from the run's seed (never printed before grading): the checks meet
    in random combinations (EOS or a stop id, ignore_eos, a stop string, max_tokens, a full context)."""
    rng = random.Random((run_seed() if seed is None else seed) ^ 0x5709)
    out = []
    for i in range(n):
        stop_ids = rng.sample(range(3, 60), rng.randint(0, 2))
        token = rng.choice([2, *stop_ids, rng.randint(60, 99)])
        outputs = [rng.randint(3, 99) for _ in range(rng.randint(0, 8))] + [token]
        words = ["the", "end", "bye", "stop", "now", "then"]
        text = " ".join(rng.choice(words) for _ in range(len(outputs)))
        stop = rng.sample(["the end", "bye", "STOP", "then now"], rng.randint(0, 2))
        params = dict(max_tokens=max(1, len(outputs) + rng.randint(-1, 2)), stop=stop, stop_token_ids=stop_ids,
                      ignore_eos=rng.random() < 0.4)
        prompt = rng.randint(1, 40)
        out.append(_StopCase(f"a case drawn for this run (#{i + 1}: token {token}, {len(outputs)} output tokens, "
                             f"{params})", token, outputs, text, params, prompt,
                             max_model_len=prompt + len(outputs) + rng.randint(0, 2),
                             zh=f"本次随机抽取的用例（#{i + 1}：token {token}，{len(outputs)} 个输出 token，{params}）"))
    return out


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
            return StopReason[key], msg("stop.strings")
    raise TypeError(msg("stop.bad_return", value=value))


def _load_params():
    from minillm import SamplingParams

    return SamplingParams


@register("code_stop_check", "Code · the stop-condition check", "§6 finish and release", 3,
          answer_name="my_check_stop", kind="code", title_zh="编程 · 停止条件检查")
def grade_stop(fn, m: Marks) -> None:
    SamplingParams = engine_piece(m, fn, "my_check_stop", "minillm.SamplingParams", _load_params)
    if SamplingParams is None:
        return
    notes = set()
    fresh = fresh_stop_cases()
    run = CaseRun(fn, stop_cases() + fresh, lambda case: (case.token_id, list(case.output_ids), case.text,
                                                          SamplingParams(**case.params), case.eos_token_id,
                                                          case.prompt_len, case.max_model_len),
                  name="my_check_stop", label=lambda case: case.label(m.lang), forbid=FORBIDDEN["my_check_stop"],
                  fresh=lambda case: any(case is f for f in fresh))
    for case, name, args, value in run:
        try:
            got, note = _as_reason(value)
        except TypeError as exc:
            run.fail(f"{name}{'：' if m.lang == 'zh' else ': '}{exc}")
            continue
        if note:
            notes.add(note)
        want = expected_stop(case, args[3])
        if got == want:
            run.passed()
        else:
            fmt = lambda r: m.t("stop.keep_going") if r is None else f"StopReason.{r.name}"  # noqa: E731
            run.fail(m.t("stop.expected", case=name, want=fmt(want), got=fmt(got)))
    run.report(m, 3, m.t("stop.all", n=run.total), m.t("stop.some", passed=run.passes, n=run.total), 4)
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
        raise CannotGrade(msg("bytes.busy"))
    if s.prompt_tokens + s.output_tokens > llm.max_model_len:
        raise CannotGrade(msg("bytes.too_long", n=llm.max_model_len))
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
            raise CannotGrade(msg("bytes.unclean"))
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


def hidden_scenarios(seed: int | None = None) -> list[Scenario]:
    """Three scenarios never printed (drawn from :func:`run_seed`): a function answer must get them
    right too, so a lookup table of the printed ones earns nothing."""
    rng = random.Random((run_seed() if seed is None else seed) ^ 0x5EED)
    return [Scenario(rng.randint(2, 8), rng.randint(5, 60), rng.randint(3, 40), "hidden") for _ in range(3)]


def plausible_bytes(s: Scenario, ref: Measured) -> set:
    """Every count the printed scenarios accept, by the rule: whole blocks or exact tokens, with or
    without the last sampled token (whose K and V are not yet written)."""
    bs, bpt, n = ref.block_size, ref.bytes_per_token, s.num_requests
    t = s.prompt_tokens + s.output_tokens
    return {n * -(-k // bs) * bs * bpt for k in (t, t - 1)} | {n * k * bpt for k in (t, t - 1)}


def _check_hidden(fn, m: Marks, ref: Measured) -> None:
    """Score 0 and a flag when the function is right on every printed scenario but not on fresh ones."""
    hidden = hidden_scenarios()
    misses = []
    for s in hidden:
        out = safecall.call(fn, forbid=FORBIDDEN["scenario_kv_bytes"], **s.as_kwargs())
        v = out.value if out.ok else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v not in plausible_bytes(s, ref):
            misses.append((s, v))
    if misses:
        s, v = misses[0]
        want = s.num_requests * -(-(s.prompt_tokens + s.output_tokens) // ref.block_size) * ref.block_size \
            * ref.bytes_per_token
        m.score = 0
        m.flag(m.t("bytes.hidden", n=len(misses), total=len(hidden), r=s.num_requests, p=s.prompt_tokens,
                   o=s.output_tokens, got=v, want=want))


def _student_numbers(answer) -> dict:
    if isinstance(answer, dict):
        return {"kind": "dict", "values": answer}
    if callable(answer):
        return {"kind": "function", "fn": answer}
    raise TypeError(msg("bytes.bad_answer", type=type(answer).__name__))


@register("task3_kv_bytes", "Task 3 · KV bytes of each scenario, checked by the engine", "§3 KV cache", 3,
          kind="engine", title_zh="任务 3 · 各场景的 KV 字节数，由引擎核对")
def grade_task3_bytes(answer, m: Marks) -> None:
    try:
        given = _student_numbers(answer)
    except TypeError as exc:  # the message is already in the current language
        m.wrong(str(exc))
        return
    failed: dict = {}
    if given["kind"] == "function":
        run = CaseRun(given["fn"], PRESSURE_SCENARIOS.items(), kwargs=lambda item: item[1].as_kwargs(),
                      name="scenario_kv_bytes", label=lambda item: item[0], forbid=FORBIDDEN["scenario_kv_bytes"])
        values = {r.label: r.value for r in run}
        failed = run.failed
        if run.engine_used:
            m.flag(why="the engine's own answer")
        if run.unverified:  # called in the notebook's own process: only its guard watched it
            m.flag(why=f"not run apart from the notebook ({run.unverified})")
    else:
        values = {name: given["values"].get(name) for name in PRESSURE_SCENARIOS}
    if given["kind"] == "dict" and all(v is None or v is Ellipsis for v in values.values()):
        raise NotAttempted.key("bytes.no_numbers")
    try:
        llm = engine()
    except Exception as exc:
        raise CannotGrade(m.t("bytes.no_engine", error=f"{type(exc).__name__}: {exc}")) from exc
    got = None
    for name, s in PRESSURE_SCENARIOS.items():
        if name in failed:
            m.wrong(failed[name])
            continue
        if name not in values:  # not called: an earlier call timed out ("stopped here")
            continue
        v = values[name]
        if v is None:
            m.missing(m.t("bytes.none", name=name))
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            m.wrong(m.t("bytes.not_number", name=name, type=type(v).__name__))
            continue
        got = measure(llm, s)
        if v == got.used_bytes:
            m.ok(m.t("bytes.exact", name=name, v=int(v), block=got.block_size), 1)
        elif v in (got.token_bytes, got.written_bytes):
            m.ok(m.t("bytes.per_token", name=name, v=int(v), used=got.used_bytes, block=got.block_size), 1)
        else:
            m.wrong(m.t("bytes.wrong", name=name, v=v, used=got.used_bytes, bpt=got.bytes_per_token,
                        block=got.block_size))
            ratio = v / got.token_bytes if got.token_bytes else 0
            if abs(ratio - 0.5) < 0.02:
                m.info(m.t("bytes.factor2"))
            elif s.num_requests > 1 and abs(ratio * s.num_requests - 1) < 0.05:
                m.info(m.t("bytes.one_request", n=s.num_requests))
            elif abs(ratio * 4 - 1) < 0.05:
                m.info(m.t("bytes.fp32"))
            continue
        waste = 1 - got.token_bytes / got.used_bytes if got.used_bytes else 0
        if waste > 0.3:
            m.info(m.t("bytes.waste", name=name, waste=waste, n=s.num_requests))
    if given["kind"] == "function" and got is not None and m.score >= len(PRESSURE_SCENARIOS):
        _check_hidden(given["fn"], m, got)


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
    zh: str = ""  # the name in Chinese

    def label(self, lang: str | None = None) -> str:
        from ...i18n import resolve

        return self.zh if resolve(lang) == "zh" and self.zh else self.name


def chat_cases() -> list[ChatCase]:
    def C(name, zh, *args):
        return ChatCase(name, *args, zh=zh)

    return [
        C("turn 1 (no history yet)", "第 1 轮（还没有历史）", 1, 40, 20, 30, None),
        C("turn 2, full history", "第 2 轮，完整历史", 2, 40, 20, 30, None),
        C("turn 10, full history", "第 10 轮，完整历史", 10, 40, 20, 30, None),
        C("turn 25, a long system prompt", "第 25 轮，很长的系统提示", 25, 400, 15, 60, None),
        C("turn 10, keep the last 3 turns", "第 10 轮，只保留最近 3 轮", 10, 40, 20, 30, 3),
        C("turn 2, keep the last 3 turns (fewer turns than N so far)", "第 2 轮，保留最近 3 轮（目前还不到 N 轮）",
          2, 40, 20, 30, 3),
        C("turn 8, keep the last 0 turns (only the new message)", "第 8 轮，保留最近 0 轮（只有新消息）",
          8, 40, 20, 30, 0),
        C("turn 30, keep the last 5 turns", "第 30 轮，保留最近 5 轮", 30, 100, 25, 80, 5),
    ]


def fresh_chat_cases(seed: int | None = None, n: int = 2) -> list[ChatCase]:
    """``n`` chat cases drawn from the run's seed (never printed before grading)."""
    rng = random.Random((run_seed() if seed is None else seed) ^ 0xC4A7)
    out = []
    for _ in range(n):
        turn, system, user, reply = rng.randint(1, 40), rng.randint(0, 500), rng.randint(1, 90), rng.randint(1, 200)
        keep = rng.choice((None, None, rng.randint(0, 8)))
        how = "full history" if keep is None else f"keep the last {keep} turns"
        how_zh = "完整历史" if keep is None else f"只保留最近 {keep} 轮"
        out.append(ChatCase(f"drawn for this run: turn {turn}, {how} (system {system}, user {user}, reply {reply})",
                            turn, system, user, reply, keep,
                            zh=f"本次随机抽取：第 {turn} 轮，{how_zh}（系统 {system}，用户 {user}，回复 {reply}）"))
    return out


def expected_chat_tokens(c: ChatCase) -> int:
    """Tokens of the one request that turn ``c.turn`` sends, once its reply is generated: the system
    prompt, the earlier turns it re-sends (all of them, or the last ``keep_last``), the new user
    message and the reply."""
    earlier = c.turn - 1 if c.keep_last is None else min(c.turn - 1, c.keep_last)
    return c.system_tokens + earlier * (c.user_tokens + c.reply_tokens) + c.user_tokens + c.reply_tokens


@register("code_chat_kv", "Code · the long chat: KV bytes at turn k", "§3 scenario 1 (long chat)", 2,
          answer_name="chat_kv_bytes", kind="code", title_zh="编程 · 长对话：第 k 轮的 KV 字节数")
def grade_chat_kv(fn, m: Marks) -> None:
    kv_bytes_per_token = engine_piece(m, fn, "chat_kv_bytes", "minillm.kv_cache", _load_kv_bytes)
    if kv_bytes_per_token is None:
        return
    shipped = shipped_config()
    bpt = kv_bytes_per_token(*shipped[1:]) if shipped else kv_bytes_per_token(4, 4, 32, 4)
    hints = set()
    fresh = fresh_chat_cases()
    run = CaseRun(fn, chat_cases() + fresh, lambda c: (c.turn, c.system_tokens, c.user_tokens, c.reply_tokens, bpt,
                                                       c.keep_last),
                  name="chat_kv_bytes", label=lambda c: c.label(m.lang), forbid=FORBIDDEN["chat_kv_bytes"],
                  fresh=lambda c: c in fresh)
    for c, name, _, y in run:
        want = expected_chat_tokens(c) * bpt
        if isinstance(y, bool) or type(y) not in (int, float):
            run.fail(m.t("code.not_number", case=name, type=type(y).__name__))
            continue
        if y == want:
            run.passed()
            continue
        run.fail(m.t("chat.mismatch", case=name, got=y, want=want))
        tokens = y / bpt
        earlier = c.turn - 1 if c.keep_last is None else min(c.turn - 1, c.keep_last)
        if tokens == want / bpt - c.reply_tokens:
            hints.add("chat.reply")
        elif tokens == want / bpt - c.system_tokens:
            hints.add("chat.system")
        elif c.keep_last is not None and tokens == c.system_tokens + c.keep_last * (c.user_tokens + c.reply_tokens) \
                + c.user_tokens + c.reply_tokens:
            hints.add("chat.fewer")
        elif earlier and tokens == c.system_tokens + c.turn * (c.user_tokens + c.reply_tokens) + c.user_tokens \
                + c.reply_tokens:
            hints.add("chat.k_minus_1")
    run.report(m, 2, m.t("chat.all", n=run.total, bpt=bpt), m.t("chat.some", passed=run.passes, n=run.total))
    for h in sorted(m.t(k) for k in hints):
        m.info(h)


def prepare(need_engine: bool) -> None:
    """Import (and, when ``need_engine``, load) what these graders use, before any student code
    runs: ``minillm grade`` calls this first, so a submission cannot shadow or slow what they need."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import minillm.kv_cache  # noqa: F401
    import minillm.sampler  # noqa: F401
    from minillm import SamplingParams, StopReason  # noqa: F401

    shipped_config()
    if need_engine:
        try:
            engine()
        except Exception:  # reported by the grader that needs it
            pass
