"""What the text graders read before they read anything: the Unicode clean-up, keyword runs, copied
text in every field, and clause-scoped negation, in both languages."""

from __future__ import annotations

import pytest

from minillm.grading import check
from minillm.grading.concepts import is_salad, keyword_run
from minillm.grading.copies import copied_share, verdict
from minillm.grading.ch04.lifecycle import _holds_kv, roles_of
from minillm.grading.unicode_clean import clean, tricks

ZW = "\u200b"


@pytest.mark.parametrize("raw, seen, found", [
    ("n" + ZW + "ot", "not", ["invisible"]),
    ("n\u2060o\u00adt", "not", ["invisible"]),
    ("nоt", "not", ["lookalike"]),  # Cyrillic о
    ("ΚV cache", "KV cache", ["lookalike"]),  # Greek Κ
    ("ｎｏｔ ＫＶ", "not KV", ["width"]),
    ("\u202enot", "not", ["invisible"]),
    ("显存" + ZW + "占用", "显存占用", ["invisible"]),
    ("λ = 0.5 and дом", "λ = 0.5 and дом", []),  # real Greek and Russian words stay
    ("顯存佔用隨長度增長", "显存占用随长度增长", []),  # traditional characters: read, not a trick
])
def test_the_text_is_read_as_a_reader_sees_it(raw, seen, found):
    assert clean(raw) == seen and tricks(raw) == found


def test_a_hidden_negation_is_still_a_negation():
    hidden = check("task2_kv_explain", "It does n" + ZW + "ot avoid recomputation; it only takes memory that grows.")
    plain = check("task2_kv_explain", "It does not avoid recomputation; it only takes memory that grows.")
    assert hidden.score == plain.score == 1 and hidden.needs_human_review
    lookalike = check("task4_sampling", "The sаmpled token is аppended to the history and the next step is computed from it.")
    assert lookalike.score == 2


def test_negation_is_scoped_to_its_clause_in_both_languages():
    assert check("task2_kv_explain", "它不是那种按提示命中的缓存，而是存已处理 token 的键值，免去重算；显存占用随上下文增长。").score == 2
    assert check("task2_kv_explain", "It is not a cache of answers: it keeps past K/V so decode never recomputes "
                                     "them, and its memory grows with tokens.").score == 2
    assert check("task2_kv_explain", "Each step only computes the new token instead of redoing the prefix, but the "
                                     "cache takes memory proportional to context length.").score == 2
    assert check("task2_kv_explain", "KV Cache 并不能减少计算，只是占用显存。").score <= 1


@pytest.mark.parametrize("text", ["避免重算；显存增长；长上下文", "重复计算、显存占用、上下文增长、decode 加速",
                                  "no recomputation / memory growth / context length", "缓存 键值 复用 显存 增长 并发",
                                  "KV, recompute, memory grows, 显存, decode"])
def test_keyword_runs_score_nothing_in_either_language(text):
    assert is_salad(text)
    assert check("task2_kv_explain", text).score == 0


@pytest.mark.parametrize("text", ["缓存 K/V 避免 recompute, memory 占用随 context 增长",
                                  "Stored K/V, no recompute, but memory grows",
                                  "存好 K 和 V，之后不用算了，挺占显存",  # comma-chained clauses with 了/不用/挺
                                  "Avoids recomputing past K/V; memory grows", "saves compute, costs memory"])
def test_terse_statements_are_not_keyword_runs(text):
    assert not is_salad(text) and not keyword_run(text)


def test_copies_of_what_the_notebook_shows_earn_nothing_in_every_field():
    option = "It spares decode from redoing past tokens' keys and values, and that storage grows with tokens and live requests."
    assert verdict(option) in ("copied", "pasted") and check("task2_kv_explain", option).score == 0
    quiz = check("quiz1_live_requests", ("B", "Because each request holds resources until it is released, and the "
                                              "engine decides who runs, who waits, who is freed."))
    assert quiz.score == 1 and "pasted from the course" in quiz.flags  # wholly pasted: certain, no review needed
    mostly = check("quiz1_live_requests", ("B", "each request holds resources until it is released, and the engine "
                                                "decides who runs, who waits, who is freed, so it must track them all the time"))
    assert mostly.score == 1 and mostly.needs_human_review  # mostly pasted: a person looks
    bar = "for each one, say why it makes requests hold more state — what grows, and because of what"
    task3 = check("task3_pressure", [("long context", bar), ("high concurrency", bar), ("long outputs", bar)])
    assert task3.score == 3
    own = "Past keys and values stay in memory so decode never redoes them; that memory grows with each token."
    assert copied_share(own) < 0.35 and check("task2_kv_explain", own).score == 2


def test_diagram_names_and_notes_are_cleaned_and_zero_is_none():
    assert roles_of("DЕCODE") == {"decode"} and roles_of("WAIT" + ZW + "ING") == {"enqueue"}
    assert not _holds_kv("0 KV blocks") and not _holds_kv("零个 KV 块") and _holds_kv("10 KV blocks")


def test_how_learners_write_in_a_hurry_is_read():
    assert check("task2_kv_explain", "快取存下 K/V，省去重複計算；顯存佔用隨上下文變長而增加。").score == 2  # traditional
    assert check("task2_kv_explain", "no recomp of prev toks; mem grows w/ ctx").score == 2  # abbreviations
    assert check("task2_kv_explain", "It saves no compute at all, it only takes memory that grows.").score == 1
    assert check("task4_sampling", "Later steps ignore the sampled token; it never joins the context.").score == 0


def test_a_trimming_reason_is_read_through_its_negation():
    assert check("task5_trim_policy", ("summary", "最近 N 轮不会丢掉第一轮贴的题目")).score == 1  # says last-N keeps it
    assert check("task5_trim_policy", ("summary", "摘要不会丢掉第一轮的题目，最近 N 轮会")).score == 2
    assert check("task5_trim_policy", ("summary", "a last-N window would drop the exercise from turn 1")).score == 2


@pytest.mark.parametrize("exercise, answer, score", [
    ("task2_kv_explain", "没有 KV cache 的话，每一步都得把前面的 token 重新算一遍", 1),  # a counterfactual names the saving
    ("task2_kv_explain", "它的大小和 batch size、序列长度都成正比", 1),  # 、 lists inside one clause
    ("task2_kv_explain", "避免重算、显存不会增长", 1),  # … and ends a negation's reach
    ("task4_sampling", "采出来的 token 接在后面，下一轮拿它继续算", 2),
    ("pitfall1_kv_not_hit_cache", (False, "KV cache 跟着请求走，请求没了它也就没了"), 2),
    ("quiz6_key_table_decode", ("B", "每个输出 token 都要走一次 decode"), 2),
])
def test_chinese_paraphrases_are_read(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    ("task2_kv_explain", "与其说省显存，不如说省计算；显存反而会涨", 2),  # 与其 … 不如: the first is denied
    ("task2_kv_explain", "显存：占用大；计算：不重复", 2),
    ("task4_sampling", "后续计算与它无关", 0),  # 无关 after the subject denies it
    ("task4_sampling", "没有哪一步不依赖之前采样出的 token，它们都在上下文里", 2),  # a double negative
    ("task4_sampling", "采样仅影响展示，后续计算与它无关", 0),
])
def test_chinese_negation_constructions(exercise, answer, score):
    assert check(exercise, answer).score == score


def test_one_idea_found_beside_a_clause_nothing_matched_goes_to_a_person():
    r = check("task4_sampling", "它像掷骰子一样被挑出来，然后后续每一步都基于它计算")
    assert r.score == 1 and r.needs_human_review


def test_a_task3_reason_names_the_state_that_grows():
    thin = check("task3_pressure", [("long context", "because more tokens"), ("high concurrency", "because more users"),
                                    ("long outputs", "because it is longer")])
    assert thin.score == 3  # "more users" says what there is more of, not what the engine keeps for each
    terse = check("task3_pressure", [("batch 很大", "batch 里每条序列都有 KV"), ("请求泄漏", "每个请求各占一份 KV"),
                                     ("长输出", "每个新 token 追加 KV")])
    assert terse.score == 6


@pytest.mark.parametrize("exercise, answer, score", [
    ("task2_kv_explain", "拿内存换速度", 1),  # memory for speed names the effect, not the saving
    ("task2_kv_explain", "用存储换计算，存储随 token 增长", 2),  # memory for compute names it
    ("task2_kv_explain", "With the cache, step n works on token n only. Without it, tokens 1..n-1 are recomputed. Cost: memory.", 2),
    ("quiz4_states_before_batching", ("D", "请求有的在等、有的在跑、有的结束了"), 2),  # 有的…有的 across 、
    ("quiz5_debug_by_request", ("B", "看看哪些请求结束了还没释放"), 2),
    ("task3_pressure", [("代码仓库问答", "整个仓库塞进 prompt，KV 跟着 token 数涨"), ("客户端断开但服务端没取消", "请求还在跑，KV 一直不释放"),
                        ("n=4 采样", "4 条序列各有一份 KV")], 6),
])
def test_more_ways_of_saying_it(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    ("task2_kv_explain", "no recompute needed, but memory isn't free", 2),  # the cost said by denying its opposite
    ("task2_kv_explain", "decode 阶段的计算量变小了，但显存变大了", 2),
    ("task4_sampling", "每次采样的 token 都会回到模型里，模型接着它往后写", 2),
    ("task3_pressure", [("长上下文", "上下文长 → KV 多"), ("双十一", "同一时间在线请求激增，每个都要一份 KV"),
                        ("长输出", "输出长 → KV 多")], 6),  # one arrow is "leads to"; a chain of them stays a list
    ("task4_sampling", "token → appended → next step", 0),
    ("task5_trim_policy", ("summary", "last_n 会把题目那一轮扔掉，后面就没法引用了"), 2),
])
def test_c12_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


def test_an_idea_said_only_by_denying_its_opposite_goes_to_a_person():
    r = check("task2_kv_explain", "KV cache does NOT reduce memory; it reduces compute.")
    assert r.needs_human_review and "said only by denying its opposite" in r.flags


def test_a_negator_that_is_part_of_the_idea_is_not_a_hedge():
    r = check("quiz5_debug_by_request", ("B", "每个请求释放前都占着 KV 块，看看谁结束了却没有归还"))
    assert r.score == 2 and "negation near an idea" not in r.flags


@pytest.mark.parametrize("exercise, answer, score", [
    # a predicate carried into the next clause, its subject left in the first
    ("task2_kv_explain", "旧 token 的 K/V 不用再算；只是这些缓存占显存，对话越长越多", 2),
    ("task2_kv_explain", "旧 token 的 K/V 不用再算；缓存都放在显存里，用户一多就很吃紧", 2),
    ("task2_kv_explain", "旧 token 的 K/V 不用再算；缓存放在显存里，但聊得越久也不会越多", 1),  # the growth denied
    ("task2_kv_explain", "每步的计算量从整个序列降到一个 token，代价是显存随长度增长", 2),
    ("task2_kv_explain", "Without a KV cache, decoding would be quadratic; with it, memory grows per token.", 2),
    ("task4_sampling", "后面的每一步都在包含这个 token 的序列上计算", 2),
    ("quiz4_states_before_batching", ("D", "一个批里既有在 prefill 的，也有在 decode 的，还有刚结束的"), 2),
    # comma-chained verb-object pieces are a sentence; enumeration marks and semicolons still make a list
    ("task2_kv_explain", "避免重复计算，占用更多显存", 2),
    ("task2_kv_explain", "避免重复计算、占用更多显存", 0),
    ("task2_kv_explain", "避免重算，增加显存，长上下文", 0),
    # input-method slips read as the word meant
    ("task2_kv_explain", "不用从新计算之前的 K/V，但显存站用随长度增长", 2),
    ("task4_sampling", "because each step's output is the next step's input", 2),
])
def test_c15_c16_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    # a cost named by its label ("Downside: VRAM", "the catch: memory", "缺点：占显存") is the cost; denied, it is not
    ("task2_kv_explain", "Past K/V are kept, so there is no recompute. Downside: VRAM.", 2),
    ("task2_kv_explain", "It skips recomputing old tokens; the catch: memory.", 2),
    ("task2_kv_explain", "It skips recomputing old tokens; drawback: it does not use more memory.", 1),
    ("task2_kv_explain", "不用重算前面的 token，缺点：占显存", 2),
    ("task2_kv_explain", "缺点：显存，好处：计算", 0),  # labels over bare nouns are still keywords
    # what follows the token, said as "generating from there" or "every step after it"
    ("task4_sampling", "The picked token is added to the context and decoding carries on from there.", 2),
    ("task4_sampling", "the sampled token becomes part of the input of every step that follows", 2),
    ("task4_sampling", "The sampled token is appended, but no step after it uses it.", 1),
    ("task3_pressure", [("long chats", "the request's history keeps its K/V growing"),
                        ("everyone in the class asking at once", "many live requests, each holds its own blocks"),
                        ("long outputs", "each new token adds K/V")], 6),
    # English feedback quotes the learner's own scenario back ('…'): pasted with it, it is still pasted feedback
    ("task3_pressure", [(n, "'a class of 40 students all asking at once': not a cache-pressure scenario the grader "
                            "recognises (long context, high concurrency, long outputs, …)")
                        for n in ("long context", "high concurrency", "long outputs")], 3),
])
def test_c17_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    # comma-chained verb-object pieces with more verbs (提升, 加速 …); bare verbs of speed are still only the effect
    ("task2_kv_explain", "省掉重复的计算，提升生成速度", 1),
    ("task2_kv_explain", "加速推理，提升速度", 0),
    # computed once in one clause, used from then on in the next
    ("task2_kv_explain", "K/V 只算一遍，之后每步直接拿来用；代价是显存越来越多", 2),
    ("task2_kv_explain", "KV 算一次，后面不能再用", 0),
    # fed to the model again: the next pass is computed from it
    ("task4_sampling", "选中的 token 接到序列末尾，再喂给模型", 2),
    # task 5: the early turn named by its place, kept or lost by a potential complement (留住 / 留不住)
    ("task5_trim_policy", ("summary", "题目贴在一开始，摘要能保住它"), 2),
    ("task5_trim_policy", ("summary", "只留最近几轮的话，前面的题目就留不住了"), 2),
    ("task5_trim_policy", ("summary", "摘要留不住题目"), 1),
    ("pitfall1_kv_not_hit_cache", (False, "里面是每个请求自己的中间计算结果"), 2),
])
def test_c18_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    # the whole prefix run through again, named at a distance ("再把前 n-1 个 token 过一遍")
    ("task2_kv_explain", "有了它就不用再把前面所有 token 跑一遍，但显存一直涨", 2),
    # the token changes what the next step reads, or is the condition of what follows
    ("task4_sampling", "选了哪个 token，就改变了模型下一步的输入", 2),
    ("task4_sampling", "the token it picks changes the context of every later step", 2),
    ("task4_sampling", "之前采样出的 token 就是之后生成的依据", 2),
    ("task4_sampling", "采样不会改变下一步模型的输入", 0),
    # the cache lives only while its request runs
    ("pitfall1_kv_not_hit_cache", (False, "请求一结束，这些 K/V 就被回收了"), 2),
    ("pitfall1_kv_not_hit_cache", (False, "the cache only lives while its request is running"), 2),
])
def test_c19_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


def test_an_answer_longer_than_the_grader_reads_goes_to_a_person_unread():
    """A written answer past MAX_ANSWER_CHARS scores 0, is flagged and says why in the learner's
    language; one just under it is read as usual (the longest labelled answer has 583 characters)."""
    from minillm.grading.registry import MAX_ANSWER_CHARS

    right = "Without the KV cache every step recomputes the keys and values of the whole prefix."
    padded = right + " " * (MAX_ANSWER_CHARS - len(right) - 1)
    assert check("task2_kv_explain", padded).score > 0
    for lang, words in (("en", "a person will read it"), ("zh", "人工阅读")):
        r = check("task2_kv_explain", right + " ok" * MAX_ANSWER_CHARS, lang=lang)
        assert r.score == 0 and r.needs_human_review and "cannot grade" in r.flags
        assert any(words in f.text and f"{MAX_ANSWER_CHARS:,}" in f.text for f in r.feedback)
    r = check("quiz2_kv_tradeoff", "d " + "because " * MAX_ANSWER_CHARS)
    assert r.score == 0 and r.needs_human_review


@pytest.mark.parametrize("exercise, answer, score", [
    # the saving named by its contrast with starting over; computing from scratch *instead of* caching is not it
    ("task2_kv_explain", "Decode is incremental rather than from scratch; the cache memory grows with the context.", 2),
    ("task2_kv_explain", "Each step recomputes everything from scratch rather than caching; memory stays flat.", 0),
    # memory named by its unit; "saves gigabytes" is still the saves-memory misconception
    ("task2_kv_explain", "Past keys and values are reused, not recomputed; for long prompts the cache takes gigabytes.", 2),
    ("task2_kv_explain", "It reuses past keys and values and saves gigabytes of memory.", 1),
    # task 5: "turn-1" with a hyphen, "cut it off" with its object in between
    ("task5_trim_policy", ("summary", "the exercise pasted in turn-1 is what every later answer refers to"), 2),
    ("task5_trim_policy", ("summary", "later turns still need the exercise, and a last-N window would cut it off"), 2),
    ("task5_trim_policy", ("summary", "a last-N window is simpler to cut"), 1),
    # "it is autoregressive" names the property, not what follows from the sampled token
    ("task4_sampling", "因为 LLM 是自回归的", 0),
    ("task4_sampling", "Because LLMs are autoregressive.", 0),
    ("task4_sampling", "它是自回归的：选出的 token 会进入上下文，下一步基于它计算", 2),
])
def test_contrast_with_starting_over_memory_units_turn_1_and_autoregressive(exercise, answer, score):
    assert check(exercise, answer).score == score


_C20_DIAGRAM = {"states": {"等候": "prompt token、采样参数，没有 KV", "预填": "prompt 全部 token 的 KV 块",
                           "生成中": "KV 块，每步再加一个 token 的", "完成": "停止原因，块还没归还", "回收": "不占块，全部还给池子"},
                "transitions": [["等候", "预填", "被调度"], ["预填", "生成中", "采出第一个 token"], ["生成中", "生成中", "下一个 token"],
                                ["生成中", "完成", "EOS"], ["完成", "回收", "释放"]]}


@pytest.mark.parametrize("exercise, answer, score", [
    # input-method slips: 重负 for 重复 before a verb of computing, 家入 for 加入 before what it joins
    ("task2_kv_explain", "保存算过的 key/value，后面不用重负计算，不过显存会随着长度增长", 2),
    ("task2_kv_explain", "显存不堪重负，推理也慢", 0),  # the real word 重负 (a heavy load) stays itself
    ("task4_sampling", "采样得到的词会家入上下文，下一步的计算以它为基础", 2),
    # a distributive predicate without a verb is a sentence, not a keyword list
    ("task3_pressure", [("长prompt", "prompt 长"), ("多用户", "每个用户一份 KV cache"), ("长回答", "生成越多 KV 越多")], 5),
    ("task3_pressure", [("长prompt", "prompt 长"), ("多用户", "用户 KV cache"), ("长回答", "生成越多 KV 越多")], 4),
    # task 5: the exercise kept by a 把 phrase (object first); one claim made for both policies is never right
    ("task5_trim_policy", ("摘要", "可以把题目压缩进摘要里一直带着"), 2),
    ("task5_trim_policy", ("summary", "可以把对话压缩进摘要里"), 1),
    ("task5_trim_policy", ("summary", "摘要不会把题目带着，只有最近几轮会"), 1),
    ("task5_trim_policy", ("summary", "summary 和 last_n 都会丢掉第一轮，所以无所谓"), 1),
    ("task5_trim_policy", ("summary", "last_n 会丢掉第一轮的题目，summary 会保留它"), 2),
    # 等候 (waiting) names the queue state
    ("task1_diagram", _C20_DIAGRAM, 12),
])
def test_c20_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


def test_waiting_synonyms_name_the_queue_and_nothing_else():
    assert roles_of("等候") == {"enqueue"} and roles_of("待处理") == {"enqueue"}
    assert "enqueue" not in roles_of("回收") and "enqueue" not in roles_of("生成中")


@pytest.mark.parametrize("exercise, answer, score", [
    # growth said by doubling: "长度翻倍显存也翻倍", "memory doubles"; speed that doubles is no memory cost
    ("task2_kv_explain", "上下文长度翻倍，显存也翻倍", 1),
    ("task2_kv_explain", "Reuses the cached keys; the memory doubles when the context doubles.", 2),
    ("task2_kv_explain", "有了它速度翻倍", 0),
    # a cleft "V 的不是 A，而是 B": B is the verb's object, whichever way it is right or wrong
    ("task2_kv_explain", "它省的不是显存，而是重复计算；代价是显存随长度增长", 2),
    ("task2_kv_explain", "KV cache 省的不是计算，而是显存", 0),
    # a reuse verb run on into the idea said by negation ("直接读不用再算") agrees with it
    ("task2_kv_explain", "旧 token 的 K/V 直接读不用再算，显存会随长度增长", 2),
    ("task2_kv_explain", "KV 直接读不到，每一步都要重新计算，显存随长度增长", 1),
    # the past tokens' part taken from the cache ("之前的 k v 拿缓存的"); putting it into the cache is not the saving
    ("task2_kv_explain", "历史 token 的 KV 都读 cache，代价是显存随长度变大", 2),
    ("task2_kv_explain", "历史 token 的 KV 都存进缓存，代价是显存随长度变大", 1),
    # 家到 for 加到 before what the token joins
    ("task4_sampling", "选出的 token 会家到历史里，后面每一步都基于它", 2),
    # an English verb or identifier inside Chinese: "concat 到 input_ids"; concatenated for display is not the history
    ("task4_sampling", "新 token concat 到 input_ids 里，下一步 forward 就基于它", 2),
    ("task4_sampling", "sample 完把 token concat 成字符串给用户看", 0),
    # a reasoning model's thinking is generated tokens: long outputs; "reasoning" alone names no scenario
    ("task3_pressure", [("长文档", "每个 prompt token 都要存 KV"), ("高并发", "每个请求各占一份 KV"),
                        ("reasoning model", "思考的每个 token 都追加 KV")], 6),
    ("task3_pressure", [("长文档", "每个 prompt token 都要存 KV"), ("高并发", "每个请求各占一份 KV"),
                        ("reasoning", "思考的每个 token 都追加 KV")], 5),
    # task 5: the exercise given at the very start, a window that discards it or where it can no longer be found
    ("task5_trim_policy", ("summary", "the exercise was pasted at the beginning of the chat; a window of recent turns discards it"), 2),
    ("task5_trim_policy", ("摘要", "题目从最开始就给了，只看最近几轮就看不到它了"), 2),
    ("task5_trim_policy", ("summary", "At the start I liked last_n, but a summary reads better"), 1),
    ("task5_trim_policy", ("摘要", "最开始我想选最近几轮，后来觉得摘要更好"), 1),
    ("task5_trim_policy", ("summary", "摘要有时会找不到重点"), 1),
])
def test_c21_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


def test_slips_and_clefts_rewrite_only_what_they_name():
    from minillm.grading.concepts import expand_abbreviations, unfold_cleft

    assert expand_abbreviations("会家到上下文里") == "会加到上下文里"
    assert expand_abbreviations("大家到上下文里找找") == "大家到上下文里找找"  # 大家 (everyone) stays
    assert unfold_cleft("它避免的不是显存开销，而是重复计算") == "它避免的是重复计算，不是显存开销"
    assert unfold_cleft("它不是答案，是中间结果") == "它不是答案，是中间结果"  # no cleft: untouched


_T3_OTHERS = [("高并发", "每个请求各占一份 KV"), ("长输出", "每生成一个 token 缓存就多一份")]


@pytest.mark.parametrize("reason, score", [
    # the slash of a term ("K/V", "Q/K/V") or of one pair of words ("prefill/decode") splits no sentence
    ("每个 prompt token 都要存 K/V", 6),
    ("每个 prompt token 都要存K/V", 6),
    ("prompt 里每个 token 的 Q/K/V 里 K/V 都要留着", 6),
    # slashes between keywords still make a keyword run
    ("KV/显存/token", 5),
    ("prefill/decode/KV", 5),
    ("K/V / 显存 / 长度", 5),
])
def test_a_slash_inside_a_term_is_no_list_mark(reason, score):
    assert check("task3_pressure", [("长文档", reason)] + _T3_OTHERS).score == score


def test_a_pair_joined_by_a_slash_is_one_term_not_a_sentence():
    from minillm.grading.concepts import terse_clause
    from minillm.grading.text import keyword_list

    assert keyword_list("prefill/decode 都要读 KV") is None
    assert keyword_list("prefill/decode") == "list"  # a bare pair is still keywords
    assert keyword_list("K/V") == "list"
    assert keyword_run("KV/显存/并发") and keyword_run("prefill/decode, KV cache, memory")
    # every reader sees the term whole (normalize_terms): one clause of six words, not two short fragments;
    # one subject before its verb, not two pieces
    assert keyword_list("cache stores K/V tensors here") is None
    assert terse_clause("prefill/decode reads KV")


_T3_TWO = [("长文档", "每个 prompt token 都要存 KV"), ("高并发", "每个请求各占一份 KV")]


@pytest.mark.parametrize("exercise, answer, score", [
    # the sampled token named among the tokens the next step reads: "previous tokens including the sampled one"
    ("task4_sampling", "because next token prob depend on all previous tokens including the sampled one", 2),
    ("task4_sampling", "下一步要看前面所有 token，包括刚采样出的那个", 2),
    ("task4_sampling", "the next step depends on all previous tokens, including the sampled one", 2),
    ("task4_sampling", "the softmax gives a probability to all tokens including the sampled one", 0),
    ("task4_sampling", "the next step reads the previous tokens, not including the sampled one", 1),
    ("task4_sampling", "下一步要看前面所有 token，不包括刚采样出的那个", 1),
    # task 3: a cancel the engine never hears of is a request that is not released
    ("task3_pressure", _T3_TWO + [("请求取消没通知引擎", "块一直不释放")], 6),
    ("task3_pressure", _T3_TWO + [("the engine never hears that the user left", "its KV blocks are still held by the request")], 6),
    ("task3_pressure", _T3_TWO + [("用户取消了请求", "取消后引擎马上释放块")], 4.5),
])
def test_c22_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


def _lifecycle(released_note: str) -> dict:
    return {"states": {"WAITING": "prompt tokens, no KV yet", "PREFILL": "KV blocks for the prompt",
                       "DECODE": "own KV blocks, +1 token per step", "FINISHED": "stop reason, blocks still held",
                       "RELEASED": released_note},
            "transitions": [["WAITING", "PREFILL", "admit"], ["PREFILL", "DECODE", "first token"],
                            ["DECODE", "DECODE", "next token"], ["DECODE", "FINISHED", "EOS"],
                            ["FINISHED", "RELEASED", "free"]]}


@pytest.mark.parametrize("note, holds", [
    ("blocks 回 pool", False),  # the pool named in English inside a Chinese note
    ("blocks 还给 allocator", False),
    ("blocks 还没回 pool", True),  # not yet returned: still held
    ("KV blocks 从 pool 分配", True),
])
def test_blocks_back_in_the_pool_said_in_two_languages(note, holds):
    assert _holds_kv(note) is holds
    assert check("task1_diagram", _lifecycle(note)).score == (11 if holds else 12)


@pytest.mark.parametrize("exercise, answer, score", [
    # one terse clause with no glue word: a verb between its subject and its object is a sentence, in either language
    ("task2_kv_explain", "KV cache saves compute", 1),
    ("task4_sampling", "sampling affects next steps", 1),
    ("task2_kv_explain", "KV缓存省计算", 1),
    ("task2_kv_explain", "KV cache 省 compute", 1),
    ("task4_sampling", "采样 token 影响下一步", 1),
    # nouns strung round a verb stay keyword runs: a long subject, a second predicate, 显存占用 as a noun
    ("task2_kv_explain", "keys values cache memory grows recompute avoided", 0),
    ("task2_kv_explain", "cache memory grows recompute avoided", 0),
    ("task2_kv_explain", "KV缓存显存重算", 0),
    ("task2_kv_explain", "KV cache 显存占用 context", 0),
    ("task2_kv_explain", "显存占用 KV", 0),
])
def test_a_terse_clause_is_a_sentence_not_a_keyword_run(exercise, answer, score):
    assert check(exercise, answer).score == score
    assert is_salad(answer) is (score == 0)


def test_a_plural_subject_takes_a_bare_verb_and_a_bare_noun_run_takes_none():
    assert not is_salad("requests hold KV blocks") and not is_salad("cache memory grows")
    assert is_salad("sample append next step history") and is_salad("KV cache memory recompute")


@pytest.mark.parametrize("exercise, answer, score", [
    # "不然 / 否则 / otherwise" with its own consequence is a whole counterfactual: the clause after it is the real world
    ("task2_kv_explain", "存历史 KV，不然每步都要从头算；显存随 token 数涨", 2),
    ("task2_kv_explain", "存历史 KV，否则每步都要重算；代价是显存随长度增长", 2),
    ("task2_kv_explain", "keeps past K/V, otherwise every step redoes the prefix; memory grows with tokens", 2),
    # a bare condition still reaches its consequence: memory that grows *without* the cache is not its cost
    ("task2_kv_explain", "没有 KV cache 的话，显存会一直涨", 0),
    ("task2_kv_explain", "Without it, memory would grow with every token.", 0),
    ("task2_kv_explain", "KV 缓存存起来，否则显存会爆", 0),
    # later steps named as what is generated after the token
    ("task4_sampling", "it picks the token, and everything produced after it changes", 1),
    ("task4_sampling", "sampling picks the tokens generated after the prompt", 0),
    # the request's token list by its name in code
    ("task4_sampling", "next_id is appended to generated_tokens and the next step attends to it", 2),
    ("task4_sampling", "output_ids are detokenized and shown to the user", 0),
    # an arrow from the token into the history, in a chain that ends in a statement
    ("task4_sampling", "chosen token → history → the next step reads it", 2),
    ("task4_sampling", "it is not UI: picked token → history → next step", 1),  # a bare chain of nouns gains nothing
    ("task4_sampling", "context -> logits -> token, the next step reads it", 1),  # the arrow the other way
    # decode going on from prefill's state
    ("pitfall3_one_lifecycle", (True, "decode just keeps going from prefill's KV for that request"), 2),
    ("pitfall3_one_lifecycle", (True, "decode keeps going until EOS"), 1),
])
def test_c23_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    # the cost named as what the cache bills or spends ("the bill: VRAM", 花的是显存); a bill for time or none at all is no cost
    ("task2_kv_explain", "no recompute of old tokens; the bill: VRAM", 2),
    ("task2_kv_explain", "不用重算历史 token，花的是显存", 2),
    ("task2_kv_explain", "decode 不用花时间重算旧 token", 1),
    ("task2_kv_explain", "不用重算，也不花显存", 1),
    ("task2_kv_explain", "no recompute; the bill is small", 1),
    # a potential complement (扛不住 "can't bear", 吃不消) says what memory cannot do: no negation of the cost
    ("task2_kv_explain", "不用重复计算，但上下文一长显存就扛不住", 2),
    ("task2_kv_explain", "不用重算旧 token，长对话时显存吃不消", 2),
    ("task2_kv_explain", "不用重算，显存也不会扛不住", 1),  # negated before it: still denied
    ("task2_kv_explain", "不用重算，显存多了也放得下", 1),
    # the saving in colloquial verbs: only the new token is run (跑), the old K/V fetched from the cache (捞, grabbed)
    ("task2_kv_explain", "每步只跑新 token，代价是显存随长度涨", 2),
    ("task2_kv_explain", "历史 KV 从缓存里捞，显存随序列长度增长", 2),
    ("task2_kv_explain", "old K/V is grabbed from the cache; memory grows with context", 2),
    ("task2_kv_explain", "每步都跑一遍整个序列，显存随长度涨", 1),
    # the token stuck onto the history ("tacked onto", 贴到); stuck onto a screen is not the history
    ("task4_sampling", "the chosen token is tacked onto the context", 1),
    ("task4_sampling", "选中的 token 贴到上下文末尾，下一步基于它算", 2),
    ("task4_sampling", "the result gets stuck on the screen", 0),
    ("task4_sampling", "采样结果贴在网页上给用户看", 0),
    # prefill and decode said around a Latin word, and decode that walks on from prefill's state
    ("pitfall3_one_lifecycle", (True, "prefill 把 prompt 的 KV 算好"), 2),
    ("pitfall3_one_lifecycle", (True, "decode 在 prefill 的结果上往后走"), 2),
    ("pitfall3_one_lifecycle", (True, "decode just goes forward from the prompt's state"), 2),
    ("pitfall3_one_lifecycle", (True, "先 prefill 后 decode，一步步往前"), 1),
    ("pitfall3_one_lifecycle", (True, "decode goes forward until EOS"), 1),
    ("pitfall3_one_lifecycle", (True, "decode 不往后走"), 1),
])
def test_c24_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


_T3_REST = [("long outputs", "each new token adds K/V")]


@pytest.mark.parametrize("pairs, score", [
    # scenarios by their short names: a document as "doc(s)", a batch by its size, the busy hour
    ([("long docs", "every doc token keeps K/V"), ("many users", "each request holds its own KV")] + _T3_REST, 6),
    ([("contract doc QA", "every doc token keeps K/V"), ("many users", "each request holds its own KV")] + _T3_REST, 6),
    ([("long prompts", "every prompt token keeps K/V"), ("batch of 128", "128 sequences hold KV at once")] + _T3_REST, 6),
    ([("long prompts", "every prompt token keeps K/V"), ("rush hour", "each live request holds its own KV")] + _T3_REST, 6),
    ([("long prompts", "every prompt token keeps K/V"), ("batch 开到 8", "每个请求一份 KV")] + _T3_REST, 5),  # no size named
    # a reason with a modal before a one-character verb (要存) is a sentence, and a count of copies is what multiplies
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("n=4 采样", "同一个 prompt 要存 4 条 sequence 的 KV")], 6),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("beam search", "4 copies of the cache for one prompt")], 6),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("n=4 采样", "要存 KV")], 5),  # still a keyword list
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("n=4 采样", "4 条 sequence")], 5),
])
def test_c24_task3_scenarios_and_reasons(pairs, score):
    assert check("task3_pressure", pairs).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    # a short gloss in brackets stays in its clause; one with a negation or a subject of its own stays an aside
    ("task2_kv_explain", "old K/V is reused, and the card (VRAM) fills up as the chat grows", 2),
    ("task2_kv_explain", "历史 KV 直接复用，锅（显存）随对话越来越满", 2),
    ("task2_kv_explain", "old K/V is reused, and the card (not VRAM) fills up", 1),
    ("task2_kv_explain", "不是为了省显存（它反而吃显存），是为了不重复算", 2),
    ("task2_kv_explain", "no recompute of old tokens; its footprint is O(n) in sequence length", 2),  # a formula's bracket
    # a negation carries over "or" to the next verb ("don't re-read or redo"); a new subject after "or" starts afresh
    ("task2_kv_explain", "decode doesn't re-read or redo past tokens' K/V; memory grows with length", 2),
    ("task2_kv_explain", "decode doesn't re-read or redo past tokens' K/V; memory doesn't grow or shrink", 1),
    # the saving in colloquial words: only the new token fed in (喂), the old KV used on (接着用), "only evals the new one"
    ("task2_kv_explain", "每步只喂新 token 进模型，代价是显存随长度涨", 2),
    ("task2_kv_explain", "老 token 的 KV 留着接着用，显存随长度涨", 2),
    ("task2_kv_explain", "the forward pass only evals the new one; memory grows with context", 2),
    ("task2_kv_explain", "每步都把整段喂进模型，显存随长度涨", 1),
    # memory named by the buffer it lives in
    ("task2_kv_explain", "old K/V is reused; the price is the kv buffer, sized by the context length", 2),
    # a negated verb as the condition (不缓存的话); a consequence in the same clause does not reach the next one
    ("task2_kv_explain", "不缓存的话每步都得把前文重新过一遍；缓存了又吃显存", 2),
    ("task2_kv_explain", "不缓存的话每步都要重算；缓存的话显存随长度涨", 2),
    ("task2_kv_explain", "不缓存答案的话每步都要重算", 0),
    # code comments: each "#" or "//" starts a clause; "the # of tokens" is no comment
    ("task2_kv_explain", "# keep K/V of past tokens -> decode only projects the new token # cost: mem ~ n_layers * n_tokens", 2),
    ("task2_kv_explain", "// reuse cached K/V for the prefix // cost: vram ~ seq_len * batch", 2),
    ("task2_kv_explain", "the # of tokens grows", 0),
    # the request's token list by its code name, torch.cat as the join; a bare run of the names is still keywords
    ("task4_sampling", "next_tokens 会 torch.cat 到 input_ids 后面，下一轮 forward 就拿它跑", 2),
    ("task4_sampling", "the sampled id is appended to seq.output_token_ids", 1),
    ("task4_sampling", "torch.cat input_ids next step", 0),
    # a negative question that expects "yes" is a statement; a why question, and a misconception asked back, stay so
    ("task4_sampling", "采样出的 token 不就拼回序列里了吗？下一步不也是基于它算的吗？", 2),
    ("task4_sampling", "isn't the picked token the next step's input?", 2),
    ("task4_sampling", "isn't it just a UI knob?", 0),
    ("pitfall2_sampling_not_ui", (True, "不就是个 UI 旋钮吗？"), 0),
    ("task2_kv_explain", "Why doesn't decode recompute old tokens? Their K/V is cached, and memory grows with length.", 2),
    # a belief the answer reports and then takes back is not its claim; one it does not take back still is
    ("task4_sampling", "at first I thought it was just a UI thing, but the picked token is appended to the context and "
                       "the next step reads it", 2),
    ("task4_sampling", "我一开始以为采样只是调随机性，其实选出的 token 会拼回序列，下一步基于它算", 2),
    ("task4_sampling", "I thought it was just a UI thing", 0),
    ("task4_sampling", "我以为采样只是调随机性", 0),
    ("task4_sampling", "It's just a UI thing, but whatever", 0),
    # the two phases by TensorRT-LLM's names (context / generation phase); their order alone is still not the link
    ("pitfall3_one_lifecycle", (True, "context phase 把 prompt 的 KV 写进 cache，generation 阶段就在这份 KV 上往后生成"), 2),
    ("pitfall3_one_lifecycle", (True, "the context phase builds the KV cache and the generation phase extends it"), 2),
    ("pitfall3_one_lifecycle", (True, "context phase 先跑，generation phase 后跑"), 1),
    # the token changes what is in the context
    ("task4_sampling", "the sampled token changes what's in the context", 1),
    ("task4_sampling", "the token changes what's in the UI", 0),
])
def test_c25_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


_T3_OUT = "思考越久，每步新增的 token 都要存 KV"


@pytest.mark.parametrize("pairs, score", [
    # a whole book pasted in, a count of requests said in Chinese (300 个请求), a reasoning model or a generation
    # that does not stop, in mixed wording; "多一格 KV" is growth
    ([("一次丢进去一整本小说让它总结", "每个 token 都存一份 KV"), ("高并发", "每个请求一份 KV")] + _T3_REST, 6),
    ([("长 prompt", "每个 token 都存 KV"), ("同时挂着 300 个请求", "每个请求一份 KV")] + _T3_REST, 6),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("reasoning 模型 think 很久", _T3_OUT)], 6),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("n_predict=-1 一直生成", _T3_OUT)], 6),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("长输出", "生成一个 token 就多一格 KV")], 6),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("想了想", _T3_OUT)], 5),  # no scenario named
])
def test_c25_task3_scenarios_and_reasons(pairs, score):
    assert check("task3_pressure", pairs).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    # Taiwan's words: 快取 (cache), 記憶體 (memory), 併發 (concurrency), and 成長 as growth
    ("task2_kv_explain", "快取之前 token 的 K/V，不必重新運算；代價是記憶體用量隨序列長度成長", 2),
    ("task2_kv_explain", "快取之前 token 的 K/V，不必重新運算；記憶體用量不會成長", 1),
    # the saving named by not redoing the whole thing / starting over from the first one
    ("task2_kv_explain", "instead of re-hashing the entire history each step it keeps the old K/V; the price is VRAM that grows", 2),
    ("task2_kv_explain", "像游戏存档，不用每次都从头重打一遍；代价是显存随长度涨", 2),
    ("task2_kv_explain", "it keeps re-hashing the entire history each step; memory grows with length", 1),
    ("task2_kv_explain", "每次都要从头重打一遍，显存随长度涨", 1),
    # computed once, used for free afterwards (白嫖)
    ("task2_kv_explain", "K/V 算一遍就存着，后面每步白嫖；代价是显存随长度涨", 2),
    ("task2_kv_explain", "each K/V is computed once, after that later steps get it for free; memory grows with length", 2),
    ("task2_kv_explain", "白嫖有代价", 0),
    # the cost piled up (往上堆), the card blown up (撑爆, "blow up the GPU")
    ("task2_kv_explain", "历史 KV 直接复用，显存按 token 数往上堆", 2),
    ("task2_kv_explain", "历史 KV 直接复用，上下文一长就把显卡撑爆", 2),
    ("task2_kv_explain", "old K/V is reused, but long chats blow up the GPU", 2),
    ("task2_kv_explain", "历史 KV 直接复用，显存不会往上堆", 1),
    ("task2_kv_explain", "历史 KV 直接复用，不会把卡撑爆", 1),
    # a shape or a size formula with the length as a factor is memory that grows with it
    ("task2_kv_explain", "no recompute of old tokens; it keeps a [layers, seq_len, heads, dim] buffer", 2),
    ("task2_kv_explain", "不用重算旧 token；缓存大小 = 2 × 层数 × 序列长度 × 头维度", 2),
    ("task2_kv_explain", "no recompute of old tokens; it keeps a [layers, heads, dim] buffer", 1),
    ("task2_kv_explain", "no recompute of old tokens; the input is a [batch, seq_len] tensor", 1),
    # a saving of memory denied and turned round ("quite the reverse") is the cost
    ("task2_kv_explain", "it's no memory saver, quite the opposite; what it saves is recomputing old K/V", 2),
    ("task2_kv_explain", "it's no memory saver; what it saves is recomputing old K/V", 1),
])
def test_c26_kinds_of_wording_task2(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("exercise, answer, score", [
    # what a knob does to each step's distribution is not what follows from the token
    ("task4_sampling", "top-p 会改变每一步的概率分布，所以输出会不一样", 0),
    ("task4_sampling", "采样出的 token 会影响之后每一步的计算", 1),
    # one token changed, all that follows differs
    ("task4_sampling", "换一个 token 开头，后面全变了", 1),
    ("task4_sampling", "采样完后面全是 padding", 0),
    # the next step from the prompt alone, sampling that only changes what is shown: misconceptions
    ("task4_sampling", "the next step is computed from the prompt only, so sampling just changes what gets shown", 0),
    ("task4_sampling", "下一步只根据 prompt 算，采样出来的 token 不进上下文", 0),
    ("task4_sampling", "not only what is shown: the sampled token is appended to the context and the next step reads it", 2),
    # the token lands in / 落进 the context
    ("task4_sampling", "the sampled token lands in the context and the next step reads it", 2),
    ("task4_sampling", "采样出的 token 落到上下文末尾，下一步基于它算", 2),
    ("task4_sampling", "the sampled token lands on the screen", 0),
    # decode reads (读) the same cache, adds on top (往上加)
    ("pitfall3_one_lifecycle", (True, "prefill 一次性把 prompt 过完、KV 落进缓存，decode 后面每步都读它"), 2),
    ("pitfall3_one_lifecycle", (True, "prefill 一次性把 prompt 过完、KV 落进缓存，decode 后面每步都不读它，自己重算"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill 一次性把 prompt 过完、KV 落进缓存，decode 后面每步都读不到它"), 1),
    # some … others (有人…有人), said of where the requests are
    ("quiz4_states_before_batching", ("D", "同一个 batch 里有人还在 prefill、有人已经在 decode 了"), 2),
    ("quiz4_states_before_batching", ("D", "有人说 batching 只是拼请求，有人说是省显存"), 1),
])
def test_c26_kinds_of_wording_task4_pitfalls_quiz(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("pairs, score", [
    # a product is a predicate ("乘以 4"); the model's size said plainly is the bigger-model kind, its weights are no
    # reason (they do not grow with any scenario)
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("n=4 采样", "每个 beam 一条序列，KV 乘以 4")], 6),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("模型很大，比如 70B", "每个 token 要存的 KV 字节更多")], 6),
    ([("long prompts", "every token keeps its K/V"), ("many users", "each request keeps its own KV"),
      ("a 70B model", "more bytes of KV for every token")], 6),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("层数多的模型", "权重占了大部分显存")], 5),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("n=4 采样", "KV，序列")], 5),
    ([("长 prompt", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("模型权重很大", "权重占显存")], 4),
])
def test_c26_task3_scenarios_and_reasons(pairs, score):
    assert check("task3_pressure", pairs).score == score


# A denial of the key idea is the misconception, not the idea: "decode 不读它，自己重新算", "the engine doesn't feed it
# back", "请求不占资源". Each wrong answer (the denial) has a right twin that uses negation properly and keeps its marks.
@pytest.mark.parametrize("exercise, answer, score", [
    # pitfall 3 (true): prefill built the cache, decode denied reading it; one idea named used to be enough
    ("pitfall3_one_lifecycle", (True, "prefill 把 KV 算好存起来，但 decode 不用它，每一步都重新算一遍"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill 建好 KV cache，decode 没用到这份缓存，它自己重算"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill 写好缓存，decode 不查缓存，每步从头重算整个序列"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill 算好 KV 存起来，decode 没用上 prefill 的 KV"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill builds the KV cache, but decode does not read it, it recomputes everything itself"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill fills the cache; decode doesn't use it and recomputes the whole prefix every step"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill writes the KV cache but decode never touches it: it redoes all the keys and values"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill computes the prompt's KV, then decode ignores it and recalculates from scratch"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill builds the cache; decode skips the cache and recomputes the prefix"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill 建好 KV cache，decode 直接在这份缓存上继续，不用重新计算前缀"), 2),
    ("pitfall3_one_lifecycle", (True, "prefill builds the KV cache and decode continues from it, it doesn't need to recompute the prefix"), 2),
    ("pitfall3_one_lifecycle", (True, "prefill 算好 KV，decode 接着用，不是每步都重算"), 2),
    ("pitfall3_one_lifecycle", (True, "decode 不是自己重新算，而是读 prefill 存好的 KV 接着往下走"), 2),
    ("pitfall3_one_lifecycle", (True, "decode never recomputes the prompt: it continues from the cache prefill built"), 2),
    # the denial under "if", as a condition, in a counterfactual, or said of prefill (which writes the cache) is no claim
    ("pitfall3_one_lifecycle", (True, "如果 decode 不读 prefill 的缓存，就得每步重算，所以它是接着 prefill 的 KV 继续"), 2),
    ("pitfall3_one_lifecycle", (True, "without the cache decode would recompute everything; instead it continues from prefill's KV"), 2),
    ("pitfall3_one_lifecycle", (True, "prefill 不读缓存，只负责写；decode 每步都读它继续生成"), 2),
    # pitfall 2 (false): the token denied its way back into the context
    ("pitfall2_sampling_not_ui", (False, "sampling picks each token but the engine doesn't feed it back, the next step "
                                         "recomputes from the prompt"), 1),
    ("pitfall2_sampling_not_ui", (False, "采样决定每一个 token，但 token 不会加入上下文，下一步从 prompt 重新算"), 1),
    ("pitfall2_sampling_not_ui", (False, "the picked token is not discarded: it is appended to the history and later steps depend on it"), 2),
    ("pitfall2_sampling_not_ui", (False, "采样决定每一个 token，token 不会被丢掉，而是加入上下文"), 2),
    # task 2: a negated verb with its own object does not reach the next verb ("不读它重算", "skips the cache and recomputes")
    ("task2_kv_explain", "KV cache 不读它重算，显存随长度增长", 1),
    ("task2_kv_explain", "KV cache 跳过缓存重算，显存随长度增长", 1),
    ("task2_kv_explain", "decode skips the cache and recomputes, and the cache's memory grows with length", 1),
    ("task2_kv_explain", "缓存之前 token 的 K/V，decode 不用重新计算前缀，但显存随长度增长", 2),
    ("task2_kv_explain", "it keeps past K/V so decode doesn't need to recompute the prefix; memory grows with context", 2),
    ("task2_kv_explain", "存下 K 和 V，不是每步都重算，代价是显存随序列变长而增长", 2),
    ("task2_kv_explain", "no recomputation of past tokens, but the cache's memory grows with tokens", 2),
    ("task2_kv_explain", "decode skips recomputing past tokens, and the cache's memory grows with length", 2),
    # task 4: the next step "from the prompt" after the token was denied its place
    ("task4_sampling", "the engine doesn't feed the sampled token back; the next step recomputes from the prompt", 0),
    ("task4_sampling", "采样出的 token 不会加入上下文，下一步从 prompt 重新算", 0),
    ("task4_sampling", "采样的 token 不会被丢掉，而是追加进上下文，下一步基于它计算", 2),
    # quiz reasons: a why that denies what it should name earns nothing
    ("quiz1_live_requests", ("B", "请求不占资源，引擎只是数请求"), 1),
    ("quiz1_live_requests", ("B", "requests hold no resources, the engine only counts them"), 1),
    ("quiz5_debug_by_request", ("B", "请求对象不占块，问题在前向"), 1),
    ("quiz5_debug_by_request", ("B", "live requests don't hold any blocks, so the forward pass is the suspect"), 1),
    ("quiz1_live_requests", ("B", "每个请求在释放前都占着 KV 块和状态"), 2),
    ("quiz1_live_requests", ("B", "请求释放后不再占资源，在那之前一直占着 KV 块"), 2),
    ("quiz5_debug_by_request", ("B", "a finished request should hold no blocks, so look for one that still holds them"), 2),
    ("quiz2_kv_tradeoff", ("D", "KV 存着但 decode 不读它重算，显存随 token 数增长"), 1),
    ("quiz2_kv_tradeoff", ("D", "decode 不用重新算之前 token 的 K、V，直接读缓存，但缓存随 token 数增长占显存"), 2),
    ("quiz2_kv_tradeoff", ("D", "no recomputation of past keys, but memory grows with tokens and requests"), 2),
    ("quiz3_sampling_interface", ("C", "sampling picks the token, but the engine never feeds it back, later steps recompute "
                                       "from the prompt"), 1),
    ("quiz3_sampling_interface", ("C", "采样出的 token 不会加入历史，但之后每步都依赖 prompt"), 1),
    ("quiz3_sampling_interface", ("C", "采样出的 token 会加入历史，之后每步都依赖它"), 2),
])
def test_a_denial_of_the_key_idea_is_the_misconception_not_the_idea(exercise, answer, score):
    assert check(exercise, answer).score == score


def test_a_negation_written_inside_a_misconception_phrase_denies_it():
    # "缓存不是查答案的" denies the answer cache (it used to be read as one and cancel the saving)
    assert check("task2_kv_explain", "缓存不是查答案的：它存下 K/V，decode 不用重新算，显存随长度涨").score == 2
    assert check("task2_kv_explain", "缓存了之前的答案，相同问题直接返回，显存随长度涨").score <= 1


@pytest.mark.parametrize("exercise, answer, score", [
    # decode cut off from prefill, or starting over: the same denial in other words
    ("pitfall3_one_lifecycle", (True, "prefill 把 KV 建好，decode 跟 prefill 没关系，从零开始算"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill builds the KV cache; decode does not depend on it and starts from scratch"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill builds the cache, then decode starts over from the prompt"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill builds the cache but decode is a separate pass that does not rely on it"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill builds the cache, and decode doesn't need it"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill 建好缓存，decode 依赖它继续，不需要从头开始"), 2),
    ("pitfall3_one_lifecycle", (True, "decode 不用从零开始，它接着 prefill 的 KV 往下走"), 2),
    ("pitfall3_one_lifecycle", (True, "decode doesn't start over: it continues from the cache prefill built"), 2),
    # the token thrown away once shown
    ("pitfall2_sampling_not_ui", (False, "sampling picks every token; the sampled token is shown and then discarded"), 1),
    ("pitfall2_sampling_not_ui", (False, "每个 token 都由采样决定；采样的 token 显示完就被丢掉了"), 1),
    ("pitfall2_sampling_not_ui", (False, "每个 token 都由采样决定；采样的 token 不会被丢掉，会加入上下文"), 2),
    ("pitfall2_sampling_not_ui", (False, "sampling picks every token; the sampled token is not discarded but appended to the context"), 2),
])
def test_decode_cut_off_from_prefill_and_a_token_thrown_away_are_denials_too(exercise, answer, score):
    assert check(exercise, answer).score == score


def test_the_misconception_denied_then_the_idea_said_without_its_subject():
    # "不是从头开始，而是在 prefill 的 KV 上继续": decode continues "on" the KV (在…上继续), its subject left before 不是
    assert check("pitfall3_one_lifecycle", (True, "decode 不是从头开始，而是在 prefill 的 KV 上继续")).score == 2


@pytest.mark.parametrize("exercise, answer, score", [
    # a pitfall's reason names one of its ideas and denies another: it says the opposite of the chapter
    ("pitfall2_sampling_not_ui", (False, "sampling picks each token, and the next step never sees it"), 1),
    ("pitfall2_sampling_not_ui", (False, "sampling picks every token; later steps ignore it"), 1),
    ("pitfall2_sampling_not_ui", (False, "每个 token 都由采样决定，但后面的步骤不依赖它"), 1),
    ("pitfall3_one_lifecycle", (True, "prefill builds the cache, but decode doesn't continue from it"), 1),
    # a negator before a verb of ignoring is a yes
    ("pitfall2_sampling_not_ui", (False, "sampling picks every token; later steps can't ignore it"), 2),
    ("pitfall2_sampling_not_ui", (False, "采样决定每个 token，后面的步骤不能忽略它"), 2),
    ("pitfall2_sampling_not_ui", (False, "采样决定每个 token，后面的步骤离不开它"), 2),
    ("pitfall3_one_lifecycle", (True, "prefill builds the cache; decode never recomputes it, it continues from it"), 2),
])
def test_a_pitfall_reason_that_denies_one_of_its_ideas_earns_nothing(exercise, answer, score):
    assert check(exercise, answer).score == score


# c27 (issue #27): kinds of wording behind the fresh batch's tune disagreements; each right answer failed on the rules
# before, each near miss or wrong twin scores as it did.
@pytest.mark.parametrize("exercise, answer, score", [
    # the saving: memory traded for FLOPs after a colon, computed once, computed before and used directly, the cost of
    # recomputing said under "if"
    ("task2_kv_explain", "Trade: memory for FLOPs. Each old token's K/V is computed once; the cache grows with every token", 2),
    ("task2_kv_explain", "each old token's K/V is computed once per step, and the cache grows with every token", 1),
    ("task2_kv_explain", "每个 token 的 K/V 只算一次，显存随长度增长", 2),
    ("task2_kv_explain", "算好的 K/V 留在显存，后面生成时直接拼上去用；显存随长度增长", 2),
    ("task2_kv_explain", "算好的 K/V 留在显存，后面生成时不拼上去用；显存随长度增长", 1),
    ("task2_kv_explain", "要是每一步都把前面的 token 重新算一遍就太慢了，所以缓存 K/V；代价是显存随长度增长", 2),
    ("task2_kv_explain", "if each step recomputed all the old K/V it would be slow, so they are cached; memory grows with length", 2),
    # the cost: the cache 涨, the size that follows the length ("开多大，KV 就占多大")
    ("task2_kv_explain", "不用重算旧 token 的 K/V，但缓存随 token 数涨", 2),
    ("task2_kv_explain", "不用重算旧 token 的 K/V，缓存也不会涨", 1),
    ("task2_kv_explain", "上下文开多大，KV 就占多大；好处是旧 token 不用重算", 2),
    ("task2_kv_explain", "上下文开多大都行，旧 token 不用重算", 1),
    # the sampled token as the next step's input; the next step from the original prompt, "only for display"
    ("task4_sampling", "采样出的 token 记下来，下一步以它为输入", 2),
    ("task4_sampling", "采样出的 token 只是拿去显示，下一步还是只看原来的 prompt", 0),
    ("task4_sampling", "采样出的 token 不只是拿去显示：它进了上下文，下一步基于它算", 2),
    # a misconception named as what the cache is not like; the request named in English inside Chinese; Cantonese
    ("pitfall1_kv_not_hit_cache", (False, "它是这个请求自己的中间状态，跟“同样的问题直接返回答案”的缓存不是一回事"), 2),
    ("pitfall1_kv_not_hit_cache", (True, "它跟“同样的问题直接返回答案”的缓存是一回事"), 0),
    ("pitfall1_kv_not_hit_cache", (False, "它存的是这个 request 每个 token 的 K 和 V"), 2),
    ("pitfall1_kv_not_hit_cache", (False, "KV 唔係答案，係存住呢個 request 每個 token 嘅 K 同 V"), 2),
    # decode cannot do without prefill's state ("离不开" is no negation); without the state it names no mechanism
    ("pitfall3_one_lifecycle", (True, "decode 离不开 prefill 写好的那份 KV"), 2),
    ("pitfall3_one_lifecycle", (True, "decode 离不开 prefill"), 1),
    ("pitfall3_one_lifecycle", (True, "decode 不依赖 prefill 的 KV，自己重算"), 1),
    # a batch as some requests doing one thing, others another; who is at which stage
    ("quiz7_scheduling_states", ("C", "每一步都有请求刚进来、有请求刚结束"), 2),
    ("quiz7_scheduling_states", ("C", "有请求就调度"), 1),
    ("quiz4_states_before_batching", ("D", "you need to know who's at which stage"), 2),
])
def test_c27_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("pairs, score", [
    # a document counted in pages, a whole repository sent as context: long context
    ([("一份 200 页的合同", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("长输出", "每生成一个 token 多存一份 KV")], 6),
    ([("the whole repo sent as context", "every token keeps its K/V"), ("many users", "each request keeps its own KV"),
      ("long outputs", "each generated token adds K/V")], 6),
    ([("几页纸", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("长输出", "每生成一个 token 多存一份 KV")], 5),
])
def test_c27_task3_scenarios(pairs, score):
    assert check("task3_pressure", pairs).score == score


def test_written_cantonese_is_read_as_mandarin_only_where_it_is_cantonese():
    from minillm.grading.hanzi import simplified

    assert simplified("佢係系统嘅一部分，唔使再計過") == "它是系统的一部分，不用再算过"
    assert simplified("这个系统的关系") == "这个系统的关系"  # no Cantonese mark: nothing read
    assert simplified("食堂") == "食堂"


# c28 (issue #27): kinds of wording behind the fresh batch's tune disagreements (chat, code-review and notes wording);
# each right answer failed on the rules before, each near miss or wrong twin scores as it did.
@pytest.mark.parametrize("exercise, answer, score", [
    # the computing named by an English term inside Chinese, or by an English re- verb
    ("task2_kv_explain", "K/V 留着，省得每步对 prefix 重新做 projection；显存随长度增长", 2),
    ("task2_kv_explain", "每步都对 prefix 重新做 projection，显存随长度增长", 1),
    ("task2_kv_explain", "生成时不再对老 token 做 matmul，显存随长度增长", 2),
    ("task2_kv_explain", "it avoids re-projecting the old tokens' K/V; memory grows with every token", 2),
    # a condition whose consequence starts with an English word keeps it in its own clause
    ("task2_kv_explain", "不存的话 decode 每步要把前面的 token 再 forward 一遍；存了的话显存随长度涨", 2),
    # the cache as 它 that grows; memory filled up, or going up
    ("task2_kv_explain", "旧 token 的 K/V 不用重算；长对话、多用户都会让它变大", 2),
    ("task2_kv_explain", "旧 token 的 K/V 不用重算；它不会变大", 1),
    ("task2_kv_explain", "旧 token 的 K/V 不用重算，显存迟早被塞满", 2),
    ("task2_kv_explain", "旧 token 的 K/V 不用重算，内存随 token 数一路往上走", 2),
    # bullets are clause marks: the 不用 of one bullet does not deny the next
    ("task2_kv_explain", "• 不用每步重算 prefix\n• 占显存，随长度涨", 2),
    # the recomputing as what is spared; the misconception as what sampling must not be taken for
    ("task2_kv_explain", "它省的是 decode 时对前文的重新计算，显存随 token 数增长", 2),
    ("task4_sampling", "不能把它当成后处理：选中的 token 会拼进上下文，下一步基于它算", 2),
    ("task4_sampling", "don't treat it as post-processing: the picked token is appended to the context and the next step is computed from it", 2),
    ("task4_sampling", "它就是后处理：选中的 token 只是拿去显示", 0),
    # the feedback's praise lines pasted back earn nothing; the same ideas in the learner's own sentence do
    ("task4_sampling", "you say that the sampled token is appended to the request's history; you say that every later step is "
                       "computed from that token", 0),
    ("task4_sampling", "你说到了：采样出的 token 会加入请求的历史（上下文）；你说到了：之后的每一步都基于这个 token 计算", 0),
    ("task4_sampling", "my take: the picked token goes into this request's history and the steps after it are computed from it", 2),
    # prefill that finished computing the KV; decode rolling on along the cache
    ("pitfall3_one_lifecycle", (True, "prefill 算完 prompt 的 KV，一个请求走到底"), 2),
    ("pitfall3_one_lifecycle", (True, "decode 直接在这个 cache 上往后滚"), 2),
    ("pitfall3_one_lifecycle", (True, "prefill 算完了，一个请求走到底"), 1),
])
def test_c28_kinds_of_wording(exercise, answer, score):
    assert check(exercise, answer).score == score


@pytest.mark.parametrize("pairs, score", [
    # the input's size in tokens; the output's length as a count to write
    ([("32k-token contracts", "every prompt token keeps its K/V"), ("many users", "each request keeps its own KV"),
      ("long outputs", "each generated token adds K/V")], 6),
    ([("长文档", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("让模型写 5000 字的周报", "周报很长")], 5),
    ([("长文档", "每个 token 都存 KV"), ("高并发", "每个请求一份 KV"), ("让模型写 50 字的周报", "周报很短")], 4),
])
def test_c28_task3_scenarios(pairs, score):
    assert check("task3_pressure", pairs).score == score
