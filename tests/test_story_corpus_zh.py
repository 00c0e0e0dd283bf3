"""Fast checks of the Chinese story grammar (scripts/story_corpus_zh.py), the Chinese half of
the bilingual default model's corpus. A few hundred stories, no training. (Seeds, prefixes and the
global random state: tests/test_default_model_corpus.py, for both generators.)"""

import random
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import story_corpus_zh as zh  # noqa: E402
from story_corpus_zh import generate_stories_zh  # noqa: E402

HAN = re.compile(r"[\u4e00-\u9fff]")
SENTENCE = re.compile(r"[^。！？]*[。！？]”?")


@pytest.fixture(scope="module")
def stories():
    return generate_stories_zh(200, seed=0)


def test_stories_are_sized_and_end_a_sentence(stories):
    for s in stories:
        assert zh.MIN_CHARS <= len(s) <= zh.MAX_CHARS, s
        assert s[-1] in "。！？”", s
        assert len(SENTENCE.findall(s)) >= 3, s


def test_only_han_and_full_width_punctuation(stories):
    for s in stories:
        assert not re.search(r"[\x00-\x7f]", s), s  # no ASCII: no spaces, digits, braces, commas
        assert zh.is_clean(s), sorted(set(s) - set(zh.PUNCTUATION) - set(HAN.findall(s)))
        assert s.count("“") == s.count("”"), s
        assert "。。" not in s and "，，" not in s and "，。" not in s, s
    assert not zh.is_clean("从前有一只小狐狸, 它")  # the check itself sees ASCII


def test_grammar_inventory():
    assert len(zh.GIRL_NAMES) + len(zh.BOY_NAMES) >= 30
    assert len(zh.PET_NAMES) >= 15
    assert len(zh.ANIMALS) >= 40
    assert len(zh.CREATURES) >= 6
    assert len(zh.PLACES) >= 30
    assert len(zh.OBJECTS) >= 45
    assert len(zh.FOODS) >= 20
    assert len(zh.FEELINGS) >= 15
    assert len(zh.WEATHER) >= 6
    assert len(zh.PLOTS) >= 8
    # every animal and object has a measure word, so the story can say 一只 / 那个 correctly
    for noun, measure in zh.ANIMALS + zh.CREATURES + zh.OBJECTS:
        assert len(measure) == 1 and HAN.match(measure), noun


def test_every_plot_is_told():
    # each plot has a sentence that no other plot writes
    marks = {"lost_found": "不见了", "new_friend": "一起玩", "trip": "去了那里|到了", "problem": "好主意|有办法了|该怎么做",
             "gift": "生日", "fear": "害怕", "contest": "比赛", "helping": "您", "rainy_day": "待在家里|不能去"}
    stories = generate_stories_zh(300, seed=2)
    for plot, mark in marks.items():
        assert plot in zh.PLOTS
        assert sum(bool(re.search(mark, s)) for s in stories) >= 10, plot


def test_stories_are_varied(stories):
    assert len(set(stories)) == len(stories)
    text = "".join(stories)
    names = {n for n in zh.GIRL_NAMES + zh.BOY_NAMES + zh.PET_NAMES if n in text}
    animals = {a for a, _ in zh.ANIMALS if a in text}
    places = {p[0] for p in zh.PLACES if p[0] in text}
    objects = {o for o, _ in zh.OBJECTS if o in text}
    assert len(names) >= 40, names
    assert len(animals) >= 30, animals
    assert len(places) >= 25, places
    assert len(objects) >= 35, objects
    assert len(set(HAN.findall(text))) >= 600  # distinct characters
    # sentence shapes: sentences with the drawn entities masked out
    entities = sorted({*zh.GIRL_NAMES, *zh.BOY_NAMES, *zh.PET_NAMES, *(a for a, _ in zh.ANIMALS + zh.CREATURES),
                       *(p[1] for p in zh.PLACES), *(p[0] for p in zh.PLACES), *(o for o, _ in zh.OBJECTS),
                       *(f[0] for f in zh.FOODS), *(f[1] for f in zh.FOODS), *(c[0] for c in zh.COLOURS),
                       *(r for r, _ in zh.RELATIVES), *zh.HOBBIES, *zh.GAMES, *zh.HERO_ADJECTIVES,
                       *zh.FRIEND_ADJECTIVES}, key=len, reverse=True)
    mask = re.compile("|".join(map(re.escape, entities)))
    shapes = {mask.sub("X", s) for story in stories for s in SENTENCE.findall(story)}
    assert len(shapes) >= 600, len(shapes)
    openings = {re.split("[，。]", s)[0] for s in stories}
    assert len(openings) >= 30, openings


def test_story_starts_a_learner_would_type():
    stories = generate_stories_zh(2000, seed=1)
    assert sum(s.startswith("从前") for s in stories) >= 500
    assert sum(s.startswith("有一天，") for s in stories) >= 50
    # "从前有一只小狐狸，它……": the hero named by its kind, then continued with 它
    assert sum(bool(re.match(r"从前有一只[^，。]+，它", s)) for s in stories) >= 40
    assert any(re.match(r"有一天，(?:%s)" % "|".join(zh.BOY_NAMES + zh.GIRL_NAMES), s) for s in stories)


def test_entities_are_carried_through():
    # a named hero introduced in the first sentence is named again later in the story
    named = carried = 0
    for s in generate_stories_zh(300, seed=5):
        first = s.split("。")[0]
        m = re.search(r"名叫(\w\w)的|名叫(\w\w)$|叫[他她它](\w\w)$", first)
        if m:
            name = next(g for g in m.groups() if g)
            named += 1
            carried += s.count(name) >= 2
    assert named >= 50
    assert carried >= 0.95 * named
    # the object lost in a lost-and-found story is the one searched for and found again
    objs = "|".join(sorted((o for o, _ in zh.OBJECTS), key=len, reverse=True))
    lost = 0
    for s in generate_stories_zh(300, seed=6):
        m = re.search(rf"({objs})不见了|找不到\w的({objs})了", s)
        if m:
            lost += 1
            obj = m.group(1) or m.group(2)
            assert s.count(obj) >= 3 and re.search("找到了|原来正是", s[m.end():]), s
    assert lost >= 15


def test_pronouns_follow_the_hero():
    # a girl is 她, a boy 他, an animal 它, from the opening on
    girls = boys = 0
    for s in generate_stories_zh(300, seed=9):
        first = s.split("。")[0]
        if "小女孩" in first and "名叫" in first and "朋友" not in first:
            girls += 1
            assert "她" in s, s
        if "小男孩" in first and "名叫" in first and "朋友" not in first:
            boys += 1
            assert "他" in s, s
    assert girls >= 10 and boys >= 10


def test_lexicon_is_words_longest_first(stories):
    words = zh.lexicon()
    assert len(words) >= 400
    assert all(len(w) >= 2 and all(HAN.match(c) for c in w) for w in words)
    assert [len(w) for w in words] == sorted((len(w) for w in words), reverse=True)
    for w in ["从前", "小狐狸", "狐狸", "小明", "朋友", "喜欢", "公园"]:
        assert w in words, w
    # forward maximum matching with the lexicon puts most Han characters inside a word
    lex, longest = set(words), len(words[0])
    inside = total = 0
    for s in stories:
        i = 0
        while i < len(s):
            n = next((n for n in range(longest, 1, -1) if s[i:i + n] in lex), 1)
            if HAN.match(s[i]):
                total += n if n > 1 else 1
                inside += n if n > 1 else 0
            i += n
    assert inside / total >= 0.5


# ---------------------------------------------------------------------------------------
# the bilingual tokenizer recipe of scripts/train_default_model.py (small corpus, no model)
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def recipe():
    import train_default_model as tdm

    return tdm


@pytest.fixture(scope="module")
def bilingual(recipe):
    from story_corpus import generate_stories

    en, zh_train = generate_stories(400, seed=1), generate_stories_zh(3000, seed=1)
    return recipe.train_tokenizer(en + zh_train, 4096, zh.lexicon())


def test_han_split_pattern_is_forward_maximum_matching(recipe):
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(recipe.han_split_pattern(["小狐", "小狐狸", "狐狸", "喜欢", "很久以前"])),
                                 "isolated")
    pieces = [p for p, _ in split.pre_tokenize_str("很久从前有一只小狐狸，它很喜欢小狐。Fox!")]
    assert pieces == ["很", "久", "从", "前", "有", "一", "只", "小狐狸", "，", "它", "很", "喜欢", "小狐", "。",
                      "Fox!"]


def test_bilingual_tokenizer_chinese_characters_are_tokens(recipe, bilingual):
    held_out = generate_stories_zh(100, seed=99)
    st = recipe.chinese_stats(bilingual, held_out)
    assert st["byte_fallback_tokens"] == 0
    assert st["sentences_over_n"] == 0 and st["worst_sentence"] <= 1.0  # N characters -> at most N tokens
    assert st["tokens_per_char"] < 0.9  # and words are tokens too, not only characters
    for word in ["从前", "小狐狸", "朋友", "喜欢"]:
        assert len(bilingual.encode(word, add_special_tokens=False).ids) == 1, word


def test_bilingual_tokenizer_prompt_ends_at_a_word(recipe, bilingual):
    prompt = "从前有一只小狐狸，它"
    pieces = [bilingual.decode([i]) for i in bilingual.encode(prompt, add_special_tokens=False).ids]
    assert "".join(pieces) == prompt and pieces[-2:] == ["，", "它"]
    # a prompt cut where a word ends is tokenized as the start of the whole story
    held_out = generate_stories_zh(8, seed=98)
    assert recipe.prefix_consistency(bilingual, held_out, at_words=True) == 1.0


def test_bilingual_tokenizer_keeps_english_and_round_trips(recipe, bilingual):
    from story_corpus import generate_stories

    english_only = recipe.train_tokenizer(generate_stories(400, seed=1), 4096)
    held_out = generate_stories(100, seed=97)
    a = recipe.english_tokens_per_word(bilingual, held_out)
    b = recipe.english_tokens_per_word(english_only, held_out)
    assert a <= b * 1.01, (a, b)
    bos = bilingual.token_to_id("<|bos|>")
    for text in held_out[:3] + generate_stories_zh(3, seed=96) + ["Mia说：“Hello!” 你好，ünïcode ✓ 42。"]:
        enc = bilingual.encode(text)
        assert enc.ids[0] == bos and enc.ids.count(bos) == 1
        assert bilingual.decode(enc.ids, skip_special_tokens=True) == text


def test_bilingual_tokenizer_survives_transformers(recipe, bilingual, tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=bilingual, bos_token="<|bos|>", eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>", clean_up_tokenization_spaces=False).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    text = "从前有一只小狐狸，它很喜欢唱歌。Once upon a time"
    assert loaded(text).input_ids == bilingual.encode(text).ids


def test_lang_flag(recipe):
    assert recipe.parse_args([]).lang == "en"  # the shipped English-only model is the default
    assert recipe.parse_args(["--lang", "zh,en"]).lang == "en,zh"
    for bad in ["fr", "en,en", ""]:
        with pytest.raises(SystemExit):
            recipe.parse_args(["--lang", bad])


def test_bilingual_pipeline_end_to_end(recipe, tmp_path):
    """A tiny --lang en,zh run (two steps of a 1-layer model) writes a checkpoint that
    transformers and minillm both load, with a model card that reports the language checks."""
    import json

    from minillm import LLM, SamplingParams
    from transformers import AutoTokenizer

    import torch

    threads, torch_rng, py_rng = torch.get_num_threads(), torch.get_rng_state(), random.getstate()
    try:  # main() seeds the global generators and sets the thread count: leave them as they were
        recipe.main(["--lang", "en,zh", "--out", str(tmp_path), "--stories", "60", "--val-stories", "8",
                     "--steps", "2", "--eval-every", "1", "--warmup", "1", "--hidden", "32", "--layers", "1",
                     "--heads", "2", "--kv-heads", "1", "--intermediate", "64", "--threads", "1", "--bf16", "off"])
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(torch_rng)
        random.setstate(py_rng)
    card = (tmp_path / "README.md").read_text()
    assert "English and Chinese short stories" in card and "## Checks" in card and "--lang en,zh" in card
    assert "`从前有一只小狐狸，它`" in card and "final validation, Chinese stories" in card
    cfg = json.loads((tmp_path / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert cfg["vocab_size"] == len(tok)
    ids = tok("从前有一只小狐狸，它").input_ids
    assert ids[0] == cfg["bos_token_id"] and len(ids) <= 1 + len("从前有一只小狐狸，它")
    out = LLM(str(tmp_path)).generate(["从前有一只小狐狸，它"], SamplingParams(max_tokens=3, temperature=0))[0]
    assert len(out.token_ids) <= 3 and out.stop_reason is not None
