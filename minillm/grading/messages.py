"""Every feedback line the code graders, the diagram grader and the grading machinery give,
in English and Chinese, under one key.

Why one table: the two languages of a message sit on one line, so a change to one is seen next
to the other, and ``tests/test_grading_i18n.py`` checks that every key has both, with the same
``{fields}``. Graders say ``msg("top_p.all", n=11)`` (the current language, see
:mod:`language`) or ``m.t("top_p.all", n=11)`` (the language of the check that is running).
The written-answer graders (``texts.py``) keep their phrases next to the ideas they grade, and
choose by the answer's own language.
"""

from __future__ import annotations

from ..i18n import Bi, resolve

B = Bi
MESSAGES: dict[str, Bi] = {
    # --- the machinery: check(), minillm grade ------------------------------------------------------
    "na.empty": B("{name} is still empty", "{name} 还是空的（尚未作答）"),
    "na.no_variable": B("no variable named {name} yet: run the answer cell above first",
                        "还没有名为 {name} 的变量：请先运行上面的作答单元格"),
    "na.not_in_notebook": B("no variable named {name} in the notebook", "笔记本里没有名为 {name} 的变量"),
    "na.stub": B("{name} still raises NotImplementedError", "{name} 仍然抛出 NotImplementedError"),
    "grade.deadline": B("not graded: the whole run's time limit passed", "未评分：整次评分的时间上限已到"),
    "grade.unknown": B("no exercise {id!r}; the ids are: {ids}", "没有练习 {id!r}；练习编号有：{ids}"),
    "grade.ambiguous": B("{id!r} could mean {ids}: give the full id", "{id!r} 可能指 {ids}：请写完整的编号"),
    "grade.too_long": B("this answer is {chars:,} characters long, more than the grader reads ({limit:,}); "
                        "a person will read it", "这个回答有 {chars:,} 个字符，超过自动评分读取的上限（{limit:,}）；将由老师人工阅读"),
    "grade.failed": B("the grader itself failed ({error} at {where}); please report this",
                      "评分器本身出错了（{error}，位置 {where}）；请报告这个问题"),
    "grade.model_copy": B("this is very close to the model answer (show_solution): a person should look",
                          "这与参考答案（show_solution）非常接近：需要人工查看"),
    "grade.solution_viewed": B("the model answer was shown (show_solution) before this answer",
                               "作答之前查看过参考答案（show_solution）"),
    # --- a result's own words (the card, the headline) -------------------------------------------------
    "result.not_attempted": B("{id}: not attempted (0 / {max})", "{id}：未作答 · not attempted（0 / {max}）"),
    "result.error": B("{id}: could not be graded (0 / {max})", "{id}：无法评分（0 / {max}）"),
    "result.bonus": B(" (+{bonus} of {of} bonus)", "（附加分 +{bonus}，共 {of}）"),
    "result.review": B(" — flagged for human review", " —— 已标记为需要人工复核"),
    "badge.not_attempted": B("not attempted", "未作答 · not attempted"),
    "badge.error": B("could not be graded", "无法评分"),
    "badge.full": B("full marks", "满分"),
    "badge.partly": B("partly there", "部分正确"),
    "badge.not_yet": B("not yet", "还没答对"),
    "badge.bonus": B("bonus", "附加分"),
    "badge.review": B("The heuristic grader is unsure about this answer: it is flagged for a human to read.",
                      "启发式评分器对这个回答没有把握：已标记为需要人工阅读。"),
    # --- calling the student's function (safecall, the sandbox) ---------------------------------------
    "call.not_function": B("expected a function, got {type}", "应为函数，得到的是 {type}"),
    "call.timeout": B("did not return within {t:g} s (an endless loop?)", "{t:g} 秒内没有返回（死循环？）"),
    "call.timeout_bare": B("did not return within {t:g} s", "{t:g} 秒内没有返回"),
    "call.no_kernel": B("the sandboxed kernel is not running (see the report's problems)",
                        "沙箱内核没有在运行（见报告中的 problems）"),
    "call.ended_kernel": B("the call ended the kernel ({error})", "这次调用让内核退出了（{error}）"),
    "grade.engine_named": B("the notebook names the engine's own implementation of this task: a person should "
                            "check the function does not use it",
                            "笔记本里出现了引擎对这道题的自带实现：请人工确认函数没有调用它"),
    "grade.guard_tampered": B("the notebook's code reaches into the grader's guard (engine_guard, the profiler, "
                              "code objects): this function's score is 0 until a person has read it",
                              "笔记本的代码动了评分器的防护（engine_guard、性能分析钩子或代码对象）：这个函数先记 0 分，"
                              "等人工阅读后再定"),
    "call.engine_used": B("calls the engine's own {name} (the task is to write it yourself)",
                          "调用了引擎自带的 {name}（这道题要求自己实现）"),
    "call.unreadable": B("the function returned data the grader cannot read", "函数返回了评分器无法读取的数据"),
    # --- the code graders' shared preamble ------------------------------------------------------------
    "code.cannot_import": B("the engine's {module} could not be imported ({error})",
                            "无法导入引擎的 {module}（{error}）"),
    "code.not_a_function": B("{name} should be a function, got {type}", "{name} 应该是一个函数，得到的是 {type}"),
    "code.stub": B("{name} still raises NotImplementedError: write its body, then check again",
                   "{name} 仍然抛出 NotImplementedError：请写出函数体，再检查一次"),
    "code.fresh_only": B("right on every case that could have been seen in advance, wrong on {n} drawn fresh for "
                         "this run: 0 points, and a person reads the function",
                         "事先能看到的用例全对，本次现场随机抽取的用例却错了 {n} 个：记 0 分，并由人工阅读这个函数"),
    "code.stopped": B("{case}: {error}; stopped here", "{case}：{error}；到此为止"),
    "code.raised": B("{case}: your function raised {error}", "{case}：你的函数抛出了 {error}"),
    "code.not_number": B("{case}: return a number of bytes (an int), got {type}",
                         "{case}：应返回字节数（int），得到的是 {type}"),
    # --- reading a diagram ---------------------------------------------------------------------------
    "dia.only_in_transition": B("state {name} appears only in a transition", "状态 {name} 只出现在转移里"),
    # --- the DiagramEditor's own words -----------------------------------------------------------------
    "ed.name": B("state name, e.g. WAITING", "状态名，例如 入队 / WAITING"),
    "ed.holds": B("what it holds, e.g. prompt token ids; no KV block yet", "它占有什么，例如 prompt token；还没有 KV 块"),
    "ed.pick": B("+ add a resource…", "+ 添加一种资源…"),
    "ed.add_state": B("Add / update state", "添加 / 更新状态"),
    "ed.remove_state": B("Remove state", "删除状态"),
    "ed.from": B("from", "从"),
    "ed.to": B("to", "到"),
    "ed.label": B("label, e.g. scheduled / EOS / cancel", "标签，例如 被调度 / EOS / 取消"),
    "ed.add_transition": B("Add transition", "添加转移"),
    "ed.edges": B("edges", "转移"),
    "ed.remove_transition": B("Remove transition", "删除转移"),
    "ed.check": B("Check my diagram", "检查我的状态图"),
    "ed.states_head": B("<b>States</b> — a name and what the state holds", "<b>状态</b>——状态名，以及这个状态占有什么"),
    "ed.transitions_head": B("<b>Transitions</b> — from, to, and what triggers it", "<b>转移</b>——起点、终点，以及触发它的事件"),
    "ed.type_name": B("Type a state name first.", "请先输入状态名。"),
    "ed.updated": B("Updated what {name} holds.", "已更新 {name} 占有的内容。"),
    "ed.added": B("Added state {name}.", "已添加状态 {name}。"),
    "ed.no_state": B("There is no state {name!r}.", "没有状态 {name!r}。"),
    "ed.removed_state": B("Removed {name} and its transitions.", "已删除 {name} 及其转移。"),
    "ed.both_ends": B("Choose both ends of the transition (add states first).", "请选好转移的两端（先添加状态）。"),
    "ed.add_first": B("There is no state {name!r}; add it first.", "没有状态 {name!r}；请先添加它。"),
    "ed.already": B("{src} → {dst} is already there.", "{src} → {dst} 已经存在。"),
    "ed.added_edge": B("Added {src} → {dst}{label}.", "已添加 {src} → {dst}{label}。"),
    "ed.no_edge": B("No such transition: {edge!r}.", "没有这条转移：{edge!r}。"),
    "ed.removed_edge": B("Removed {src} → {dst}.", "已删除 {src} → {dst}。"),
    "ed.cleared": B("Cleared.", "已清空。"),
    "ed.none_selected": B("No transition selected.", "没有选中任何转移。"),
    "ed.stored": B("(diagram stored in this notebook for minillm grade: {n} states, {m} transitions — save the "
                   "notebook to keep it)",
                   "（状态图已存入本笔记本，供 minillm grade 读取：{n} 个状态，{m} 条转移——请保存笔记本）"),
    "ed.cannot_save": B("Could not save to {path}: {error}", "无法保存到 {path}：{error}"),
    "ed.empty": B("Add a state to start drawing.", "添加一个状态，开始画图。"),
    "ed.cannot_read": B("Could not read {path} ({error}); starting empty.", "无法读取 {path}（{error}）；从空白开始。"),
}


def msg(key: str, lang: str | None = None, **fields) -> str:
    """The message ``key`` in ``lang`` (default: the current language), with its fields filled in."""
    return MESSAGES[key](resolve(lang), **fields)


def both(key: str, **fields) -> tuple[str, str]:
    """(English, Chinese) of one message, for what is built before its language is known."""
    return msg(key, "en", **fields), msg(key, "zh", **fields)
