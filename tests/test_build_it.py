"""The build-it track's grader (minillm.grading.build_it): the reference solutions get full
marks through the engine's seams, and every seeded bug is caught with a short shrunk program
(or, for the filters, the smallest small case) that names what broke."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from minillm.grading.ch04 import build_it
from minillm.request import RequestState as S

sys.path.insert(0, str(Path(__file__).parent / "solved"))
import build_it as sol  # noqa: E402

MAX_LINES = 9  # engine line + at most 7 actions + the finishing line


def _caught(verdict, *needles):
    assert not verdict.passed, verdict
    text = str(verdict)
    for needle in needles:
        assert needle in text, text
    if verdict.program is not None:
        assert len(verdict.program.splitlines()) <= MAX_LINES, verdict.program
    return text


def _without(edge):
    table = {k: set(v) for k, v in sol.MY_TRANSITIONS.items()}
    table[edge[0]].discard(edge[1])
    return table


# --- the reference solutions -----------------------------------------------------------------
@pytest.mark.parametrize("part,answer", [
    ("a", sol.MY_TRANSITIONS), ("b", sol.MyBlockPool), ("c", sol.my_step),
    ("d", (sol.my_top_k_filter, sol.my_top_p_filter))])
def test_reference_solution_gets_full_marks(part, answer):
    v = build_it.check(part, answer, lang="en")
    assert v.passed and v.program is None, v


def test_stubs_are_not_attempted():
    class Stub:
        def __init__(self, n):
            pass

        def num_free(self):
            raise NotImplementedError

    def stub(*a):
        raise NotImplementedError

    assert build_it.check("b", Stub).result.status == "not attempted"
    assert build_it.check("d", (stub, stub)).result.status == "not attempted"
    assert build_it.check("a", {s: set() for s in S}).result.status == "not attempted"


# --- (a) the state machine ---------------------------------------------------------------------
@pytest.mark.parametrize("edge", [(S.PREFILL, S.PREFILL), (S.FINISHED, S.RELEASED), (S.PREFILL, S.WAITING),
                                  (S.PREEMPTED, S.PREFILL), (S.NEW, S.FINISHED)])
def test_a_missing_edge_is_caught_with_a_shrunk_program(edge):
    needles = (("never RELEASED",) if edge == (S.FINISHED, S.RELEASED) else
               ("IllegalTransition", f"{edge[0].value} -> {edge[1].value}"))
    text = _caught(build_it.check("a", _without(edge), lang="en"), *needles)
    assert "llm = build_it.small_engine(EngineParts(transitions=MY_TRANSITIONS))" in text


def test_a_extra_edge_is_named_with_its_reason():
    table = {k: set(v) for k, v in sol.MY_TRANSITIONS.items()}
    table[S.RELEASED].add(S.WAITING)
    v = build_it.check("a", table, lang="zh")
    assert v.result.score == 2, v
    assert "RELEASED → WAITING" in str(v) and "没有任何转移能让它回来" in str(v)
    assert v.program.splitlines()[-1].startswith("r.move_to(S.WAITING, MY_TRANSITIONS)"), v.program
    assert len(v.program.splitlines()) <= 4 and "不会被发现" in str(v)


# --- (b) the block pool ----------------------------------------------------------------------
class ForgetsCounts(sol.MyBlockPool):
    def free(self, block_ids):  # back on the free list at the first free, shared or not
        for b in block_ids:
            if self.counts[b] > 0:
                self.counts[b] = 0
                self.free_ids.append(b)


class Leaks(sol.MyBlockPool):
    def free(self, block_ids):  # counts go down but nothing comes back
        for b in block_ids:
            self.counts[b] -= 1


class SharesNothing(sol.MyBlockPool):
    def share(self, block_id):
        pass


class HandsOutTwice(sol.MyBlockPool):
    def allocate(self, n):  # forgets to take the blocks off the free list
        taken = self.free_ids[:n]
        for b in taken:
            self.counts[b] = 1
        return taken


@pytest.mark.parametrize("pool,needle", [(ForgetsCounts, "block"), (Leaks, "num_free()"),
                                         (SharesNothing, "ref_count"), (HandsOutTwice, "block")])
def test_b_pool_bug_is_caught_with_a_shrunk_program(pool, needle):
    text = _caught(build_it.check("b", pool, lang="en"), needle, "llm.add_request")
    assert "EngineParts(block_pool=MyBlockPool)" in text


# --- (c) one step -----------------------------------------------------------------------
def _step_ignoring_context_full(llm):
    batch = llm.scheduler.schedule()
    if batch:
        logits = llm.runner.run(batch.decodes, batch.prefills, batch.prefill_chunks)
        ids, lp, err = llm.runner.sample(llm.sampler, logits, batch.sampled)
        llm.scheduler.update_from_output(batch, ids, lp, err)
    return batch


def _step_sampling_decodes_only(llm):  # forgets that a prompt's last chunk yields its first token
    batch = llm.scheduler.schedule()
    for req in batch.context_full:
        llm.scheduler.finish(req, sol.StopReason.CONTEXT_FULL)
    if batch:
        logits = llm.runner.run(batch.decodes, batch.prefills, batch.prefill_chunks)
        ids, lp, err = llm.runner.sample(llm.sampler, logits[:len(batch.decodes)], batch.decodes)
        llm.scheduler.update_from_output(batch, ids, lp, err)
    return batch


def _step_without_update(llm):
    batch = llm.scheduler.schedule()
    if batch:
        llm.runner.run(batch.decodes, batch.prefills, batch.prefill_chunks)
    return batch


@pytest.mark.parametrize("step,needle", [(_step_ignoring_context_full, "vanished"),
                                         (_step_sampling_decodes_only, "did not finish"),
                                         (_step_without_update, "did not finish")])
def test_c_step_bug_is_caught_with_a_shrunk_program(step, needle):
    text = _caught(build_it.check("c", step, lang="en"), needle, "llm.add_request")
    assert "EngineParts(step=my_step)" in text


# --- (d) top-k and top-p -----------------------------------------------------------------------
def _top_k_one_too_many(logits, k):
    return sol.my_top_k_filter(logits, k + 1 if k > 0 else k)


def _top_p_drops_the_crossing_token(logits, p):
    values, order = torch.sort(logits, descending=True)
    drop = values.softmax(-1).cumsum(-1) >= p
    drop[0] = False
    out = logits.clone()
    out[order[drop]] = float("-inf")
    return out


def _top_k_capped(logits, k):  # right on every small case; wrong once k > 5
    return sol.my_top_k_filter(logits, min(k, 5))


def test_d_small_case_bugs_show_the_smallest_case():
    text = _caught(build_it.check("d", (_top_k_one_too_many, sol.my_top_p_filter), lang="en"),
                   "my_top_k_filter on logits [2.0, 1.0, 0.0] with k=1")
    assert "keeps [0, 1]" in text
    _caught(build_it.check("d", (sol.my_top_k_filter, _top_p_drops_the_crossing_token), lang="en"),
            "my_top_p_filter on logits")


def test_d_bug_only_the_engine_shows_is_caught_with_a_shrunk_program():
    text = _caught(build_it.check("d", (_top_k_capped, sol.my_top_p_filter), lang="en"), "top_k=40",
                   "llm.add_request")
    assert "stop reason" in text


# --- the notebook's engine helper ---------------------------------------------------------------
def test_engine_runs_on_the_learners_parts_and_falls_back_with_a_reason(capsys):
    from minillm.seams import EngineParts

    parts = EngineParts(transitions=sol.MY_TRANSITIONS, block_pool=sol.MyBlockPool, step=sol.my_step,
                        top_k_filter=sol.my_top_k_filter, top_p_filter=sol.my_top_p_filter)
    llm = build_it.engine(parts)
    assert llm.parts is parts and "runs on your parts" in capsys.readouterr().out
    out = llm.generate(["Once upon a time", "One day"], None)
    assert all(o.stop_reason is not None for o in out) and llm.cache_stats().used_blocks == 0
    fallback = build_it.engine(EngineParts(block_pool=Leaks))
    assert "not ready yet" in capsys.readouterr().out
    assert fallback.parts.block_pool is None
    fallback = build_it.engine(EngineParts(top_k_filter=lambda logits, k: 1 / 0, top_p_filter=sol.my_top_p_filter))
    assert "ZeroDivisionError" in capsys.readouterr().out
    assert fallback.parts.top_k_filter is None


def test_the_widgets_show_the_learners_engine():
    """The RequestStepper and the CacheMonitor drive an engine built from every reference part:
    the pool they draw is the learner's pool, and a shared prefix shows as a shared block."""
    from minillm.seams import EngineParts
    from minillm.viz.plots import CacheMonitor
    from minillm.viz.stepper import RequestStepperCore

    parts = EngineParts(transitions=sol.MY_TRANSITIONS, block_pool=sol.MyBlockPool, step=sol.my_step,
                        top_k_filter=sol.my_top_k_filter, top_p_filter=sol.my_top_p_filter)
    llm = build_it.engine(parts, quiet=True)
    pool = llm.kv_cache.allocator.pool
    assert isinstance(pool, sol.MyBlockPool)
    core = RequestStepperCore(llm, "Once upon a time")
    core.tokenize()
    core.prefill()
    core.decode_one()
    held = core.blocks_held
    assert held > 0 and sum(c["kind"] == "mine" for c in core.pool()) == held
    assert pool.num_free() == llm.kv_cache.num_blocks - held
    core.run_to_end()
    assert core.state == S.FINISHED and pool.num_free() < llm.kv_cache.num_blocks  # held until released
    core.release()
    assert core.state == S.RELEASED and pool.num_free() == llm.kv_cache.num_blocks
    monitor = CacheMonitor(llm, prompt_tokens=12, max_tokens=6)
    monitor.add_request()
    monitor.step(3)
    assert monitor.stats().used_blocks == llm.kv_cache.num_blocks - pool.num_free() > 0
    monitor.step(20)
    assert monitor.stats().used_blocks == 0


def test_ctrl_c_stops_a_learners_step_at_once():
    """A learner's step may loop forever: Ctrl-C (SIGINT) must stop it inside the loop, not
    wait for the step to end (the engine's own step defers it in its bookkeeping phases)."""
    import os
    import signal
    import time

    from minillm.seams import EngineParts

    # Python's own SIGINT handler, as in a notebook kernel (an earlier test in this worker, e.g. the
    # browser's event loop, may have left another one), put back afterwards
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    finished = []

    def slow_step(llm):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(300):
            time.sleep(0.01)
        finished.append(True)
        return llm.scheduler.schedule()

    llm = build_it.small_engine(EngineParts(step=slow_step))
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.step()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not finished


# --- the engine's own part handed in as an answer ---------------------------------------------------
def test_the_engines_own_parts_are_not_an_answer():
    from minillm.request import TRANSITIONS
    from minillm.sampler import top_k_filter, top_p_filter
    from minillm.seams import RefCountPool

    class Borrowed(RefCountPool):
        pass

    def borrowed_step(llm):
        return llm._step_once(None)

    assert "engine's own" in str(build_it.check("a", TRANSITIONS, lang="en"))
    assert "引擎自带" in str(build_it.check("b", Borrowed, lang="zh"))
    text = str(build_it.check("c", borrowed_step, lang="en"))
    assert "LLM._step_once" in text and "llm.step()" in text
    text = str(build_it.check("d", (lambda x, k: top_k_filter(x, k), lambda x, p: top_p_filter(x, p)), lang="en"))
    assert "engine's own" in text and "top_k_filter" in text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_chinese_notebook_with_the_reference_parts_runs_on_them(tmp_path):
    """The zh edition of 06b with its four stub cells replaced by the reference parts: every check
    gives full marks in the kernel, and every engine cell says it runs on the learner's parts."""
    import inspect

    import nbformat

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "scripts"))
    import run_notebooks

    nb = nbformat.read(str(root / "notebooks" / "zh" / "ch04" / "06b_build_it.ipynb"), as_version=4)
    table = inspect.getsource(sys.modules[sol.__name__]).split("# (a) the request state machine's legal moves\n")[1]
    table = table.split("\n\n\n")[0]
    answers = {"MY_TRANSITIONS = {": table, "class MyBlockPool": inspect.getsource(sol.MyBlockPool),
               "def my_step": inspect.getsource(sol.my_step),
               "def my_top_k_filter": inspect.getsource(sol.my_top_k_filter) + "\n\n"
               + inspect.getsource(sol.my_top_p_filter)}
    replaced = 0
    for cell in nb.cells:
        for head, source in answers.items():
            if cell.cell_type == "code" and cell.source.startswith(head):
                cell.source, replaced = source, replaced + 1
    assert replaced == 4
    path = tmp_path / "06b_solved.ipynb"
    nbformat.write(nb, str(path))
    done = run_notebooks.execute(path)
    text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                     for c in done.cells if c.cell_type == "code" for o in c.get("outputs", []))
    for part in ("build_a_moves", "build_b_pool", "build_c_step", "build_d_filters"):
        assert re.search(rf"{part}[^\n]*3 / 3", text), text
    assert text.count("这个引擎用的是你写的部件") == 5 and "还没准备好" not in text, text


def test_show_method_is_recorded_and_an_unknown_part_is_feedback():
    from minillm.grading import set_language
    from minillm.grading.extract import SOLUTION_MIME

    set_language("zh")
    try:
        shown = build_it.show_method("b")._repr_mimebundle_()
    finally:
        set_language("en")
    assert shown[SOLUTION_MIME] == {"id": "build_b_pool"}
    assert "空闲块列表" in shown["text/plain"]
    verdict = build_it.check("e", 1)
    assert not verdict.passed and "a, b, c, d" in str(verdict)


def test_bad_parts_are_refused_naming_the_field():
    from minillm import LLM
    from minillm.seams import EngineParts

    with pytest.raises(ValueError, match="parts must be"):
        LLM(device="cpu", parts={"block_pool": sol.MyBlockPool})
    with pytest.raises(ValueError, match="block_pool must be callable"):
        EngineParts(block_pool=3)
    with pytest.raises(ValueError, match="transitions must be a dict"):
        EngineParts(transitions=[S.NEW])

    class NoShare:
        def __init__(self, n):
            pass

    with pytest.raises(ValueError, match="lacks allocate, share, free, num_free, ref_count"):
        LLM(device="cpu", parts=EngineParts(block_pool=NoShare))


def test_a_filter_that_calls_the_fast_paths_own_filter_does_not_pass():
    import torch

    import minillm.fast.sampler as fast
    from minillm.grading.ch04.build_it import TOP_K_CASES, _check_cases
    from minillm.grading.registry import Marks
    from minillm.sampler import top_k_filter

    m = Marks()
    assert not _check_cases(m, lambda lg, k: fast.sorted_filters(lg, torch.tensor(k), None, None),
                            "my_top_k_filter", TOP_K_CASES, top_k_filter, "k")
