#!/usr/bin/env python
"""Train minillm's tiny default model (``stories-3m``) from scratch, on the CPU.

    python scripts/train_default_model.py --out minillm/assets/stories-3m

Steps (all seeded, so a rerun gives the same corpus and tokenizer and, up to
floating-point differences between machines, the same model):

1. generate a synthetic corpus of simple English stories (``scripts/story_corpus.py``) and,
   with ``--lang en,zh``, as many Chinese ones (``scripts/story_corpus_zh.py``);
2. train one byte-level BPE tokenizer on it (``tokenizers``), with ``<|bos|>`` and
   ``<|endoftext|>``; its post-processor prepends ``<|bos|>`` to every encoded text. When
   the corpus has Chinese, Han text is first cut at the words of the Chinese grammar
   (forward maximum matching, one regex inside ``tokenizer.json``), so that common
   characters and words become tokens and token boundaries fall on word boundaries;
3. train a small ``transformers.LlamaForCausalLM`` (AdamW, warm-up + cosine schedule),
   each story being ``<|bos|> story <|endoftext|>``;
4. save model (float32 safetensors), tokenizer, generation config, a loss-curve PNG and a
   model card (README.md) into ``--out``.

A default run takes about 10 minutes on 2 otherwise idle CPU cores (longer on a busy
machine). Nothing is downloaded. ``--tokenizer-report`` trains only the tokenizer and prints
its measurements (tokens per Chinese character, English tokens per word against the
English-only recipe, model size for its vocabulary), without training a model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# On a shared machine, spinning OpenMP workers make a busy CPU much slower still.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from story_corpus import (  # noqa: E402
    ANIMALS, BOY_NAMES, CREATURES, GIRL_NAMES, OBJECTS, PLACES, PLOTS, generate_stories,
)
import story_corpus_zh  # noqa: E402

BOS, EOS = "<|bos|>", "<|endoftext|>"
PROMPTS_GREEDY = ["Once upon a time", "One day, Mia went to the beach",
                  "Once upon a time, there was a fox named", "The little robot"]
PROMPTS_SAMPLED = ["Once upon a time, there was a little", "Long ago,"]
PROMPTS_GREEDY_ZH = ["从前", "有一天，小明", "从前有一只小狐狸，它"]
PROMPTS_SAMPLED_ZH = ["从前有一个小女孩", "很久以前，"]
LANGS = ("en", "zh")
# full-width punctuation kept out of BPE merges, like the words of the Chinese lexicon
CJK_PUNCTUATION = "，。！？“”：、；（）《》"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="minillm/assets/stories-3m", help="output folder")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--stories", type=int, default=40000, help="training stories")
    ap.add_argument("--val-stories", type=int, default=1000)
    ap.add_argument("--vocab-size", type=int, default=4096, help="BPE target vocabulary size")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32, help="stories per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto",
                    help="bfloat16 autocast for the matmuls (weights stay float32)")
    ap.add_argument("--lang", type=parse_langs, default="en",
                    help="corpus languages, comma-separated: en (the shipped model), zh, or en,zh; "
                         "--stories and --val-stories count stories per language")
    ap.add_argument("--tokenizer-report", action="store_true",
                    help="train the tokenizer only, print its measurements and exit")
    return ap.parse_args(argv)


def parse_langs(value: str) -> str:
    """'en,zh' -> 'en,zh' (canonical order); anything else is a clear error."""
    langs = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in langs if v not in LANGS]
    if not langs or bad or len(set(langs)) != len(langs):
        raise argparse.ArgumentTypeError(
            f"--lang must be a comma-separated subset of {', '.join(LANGS)} without repeats, got {value!r}")
    return ",".join(v for v in LANGS if v in langs)


# ---------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------

def han_split_pattern(words):
    """Regex that matches, at each Han character, the longest of *words* starting there
    (else that one character), or one full-width punctuation mark.

    The words are laid out as a trie, ``小(?:狐狸|明|…)``, so matching stays linear in the
    text however long the lexicon is.
    """
    trie = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node):
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        group = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        if "" in node:  # a word ends here: try the longer words first, else stop
            return ("(?:" + group + ")" if len(alts) == 1 else group) + "?"
        return group

    body = emit(trie)
    return (body + "|" if body else "") + r"\p{Han}|[" + re.escape(CJK_PUNCTUATION) + "]"


def train_tokenizer(texts, vocab_size, han_words=None):
    """Byte-level BPE; with *han_words*, Han text is cut at those words before BPE sees it.

    Without the cut, the byte-level pre-tokenizer would hand BPE whole Chinese clauses
    (there are no spaces), BPE would learn tokens across word boundaries such as "它很", and
    a prompt ending in "它" would end in a token the model rarely saw in that place.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if han_words is None:
        tok.pre_tokenizer = byte_level
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(han_split_pattern(han_words)), behavior="isolated"),
            byte_level,
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)],
    )
    return tok


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------

def make_batches(seqs, batch_size, rng, pad_id):
    """Length-bucketed, shuffled batches of whole stories, right-padded.

    Each row is one story starting at position 0 with <|bos|>, exactly as at inference.
    Padding sits at the end and gets label -100, so causal attention needs no mask.
    """
    idx = list(range(len(seqs)))
    rng.shuffle(idx)
    chunk = batch_size * 50
    batches = []
    for c in range(0, len(idx), chunk):
        part = sorted(idx[c:c + chunk], key=lambda i: len(seqs[i]))
        batches += [part[b:b + batch_size] for b in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    for b in batches:
        n = max(len(seqs[i]) for i in b)
        x = torch.full((len(b), n), pad_id, dtype=torch.long)
        y = torch.full((len(b), n), -100, dtype=torch.long)
        for r, i in enumerate(b):
            s = torch.tensor(seqs[i])
            x[r, :len(s)] = s
            y[r, :len(s)] = s
        yield x, y


def bf16_ok(mode):
    if mode == "off":
        return False
    if mode == "on":
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # pragma: no cover
        return False


@torch.no_grad()
def evaluate(model, seqs, pad_id, use_bf16, batch_size=64):
    model.eval()
    tot, n = 0.0, 0
    rng = random.Random(0)
    for x, y in make_batches(seqs, batch_size, rng, pad_id):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(input_ids=x).logits.float()
        lp = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), y[:, 1:].reshape(-1),
            ignore_index=-100, reduction="sum")
        tot += lp.item()
        n += (y[:, 1:] != -100).sum().item()
    model.train()
    return tot / n


# ---------------------------------------------------------------------------------------
# corpus and tokenizer measurements
# ---------------------------------------------------------------------------------------

def make_corpus(args):
    """{lang: (train stories, validation stories)}, in the order of LANGS; same seeds per language."""
    gen = {"en": generate_stories, "zh": story_corpus_zh.generate_stories_zh}
    return {lang: (gen[lang](args.stories, seed=args.seed), gen[lang](args.val_stories, seed=args.seed + 1))
            for lang in args.lang.split(",")}


_ZH_SENTENCE = re.compile(r"[^。！？]*[。！？]”?")


def chinese_stats(tok, stories):
    """Tokens per character, sentence by sentence, and how many tokens are byte fallback."""
    sentences = [s for story in stories for s in _ZH_SENTENCE.findall(story)]
    encs = tok.encode_batch(sentences, add_special_tokens=False)
    n_chars = sum(map(len, sentences))
    n_tokens = sum(len(e.ids) for e in encs)
    partial = {i for i in range(tok.get_vocab_size()) if "\ufffd" in tok.decode([i])}
    fallback = sum(i in partial for e in encs for i in e.ids)
    worst = max(len(e.ids) / len(s) for e, s in zip(encs, sentences))
    over = sum(len(e.ids) > len(s) for e, s in zip(encs, sentences))
    return dict(sentences=len(sentences), tokens_per_char=n_tokens / n_chars, worst_sentence=worst,
                sentences_over_n=over, byte_fallback_tokens=fallback, tokens=n_tokens)


def word_cuts(story):
    """Positions where a word ends: before a space in English; at the end of each lexicon
    word, single Han character or punctuation mark in Chinese."""
    from tokenizers import Regex, pre_tokenizers

    global _HAN_SPLIT
    if "_HAN_SPLIT" not in globals():
        _HAN_SPLIT = pre_tokenizers.Split(Regex(han_split_pattern(story_corpus_zh.lexicon())), "isolated")
    if re.search(r"[\u4e00-\u9fff]", story):
        return [end for _, (_, end) in _HAN_SPLIT.pre_tokenize_str(story)][:-1]
    return [m.start() for m in re.finditer(" ", story)]


def prefix_consistency(tok, stories, at_words=False):
    """Fraction of cut points where the prompt's tokens are the first tokens of the whole text.

    Where they are not, a prompt that stops there ends in a token sequence the model never
    saw inside a story (the prompt-boundary problem). Cuts are after every character, or
    with *at_words* only where a word ends.
    """
    ok = total = 0
    for story in stories:
        full = tok.encode(story, add_special_tokens=False).ids
        cuts = word_cuts(story) if at_words else range(1, len(story))
        prefixes = [story[:i] for i in cuts]
        for enc in tok.encode_batch(prefixes, add_special_tokens=False):
            ok += enc.ids == full[:len(enc.ids)]
            total += 1
    return ok / total


def english_tokens_per_word(tok, stories):
    encs = tok.encode_batch(stories, add_special_tokens=False)
    return sum(len(e.ids) for e in encs) / sum(len(s.split()) for s in stories)


def model_bytes(args, vocab):
    """float32 weight bytes of the model this script builds for *vocab* tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=1024, tie_word_embeddings=True)
    with torch.device("meta"):
        n = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    return n, 4 * n


def tokenizer_report(tok, corpus, args):
    """Print what the bilingual tokenizer does to each language, against the alternatives."""
    import tempfile

    vocab = tok.get_vocab_size()
    with tempfile.TemporaryDirectory() as d:
        tok.save(os.path.join(d, "tokenizer.json"))
        tok_bytes = os.path.getsize(os.path.join(d, "tokenizer.json"))
    n_params, w_bytes = model_bytes(args, vocab)
    limit = 20 * 1024 * 1024
    other = 150_000  # config, generation config, model card, loss curve: well under this
    per_token = 4 * args.hidden + tok_bytes / vocab
    print(f"tokenizer ({args.lang}): vocabulary {vocab} (target {args.vocab_size}), tokenizer.json "
          f"{tok_bytes / 1e3:.0f} kB; model {n_params:,} parameters = {w_bytes / 2**20:.1f} MiB float32, "
          f"checkpoint about {(w_bytes + tok_bytes + other) / 2**20:.1f} MiB of the 20 MiB limit; "
          f"the largest vocabulary that fits is about {int(vocab + (limit - w_bytes - tok_bytes - other) / per_token)}")
    if "zh" in corpus:
        held_out = corpus["zh"][1]
        st = chinese_stats(tok, held_out)
        print(f"Chinese, {len(held_out)} held-out stories, {st['sentences']} sentences: "
              f"{st['tokens_per_char']:.3f} tokens per character, worst sentence {st['worst_sentence']:.2f} "
              f"tokens per character, {st['sentences_over_n']} sentences with more tokens than characters, "
              f"{st['byte_fallback_tokens']} byte-fallback tokens")
        sample = held_out[:100]
        words = story_corpus_zh.lexicon()
        whole = sum(tok.token_to_id(tok.pre_tokenizer.pre_tokenize_str(w)[0][0]) is not None for w in words)
        print(f"  {whole} of the {len(words)} lexicon words are single tokens; prefix consistency over "
              f"{len(sample)} stories: {prefix_consistency(tok, sample, at_words=True):.3f} at word ends, "
              f"{prefix_consistency(tok, sample):.3f} after every character")
        prompt = "从前有一只小狐狸，它"
        print(f"  {prompt!r} -> {[tok.decode([i]) for i in tok.encode(prompt, add_special_tokens=False).ids]}")
        plain = train_tokenizer([s for lang in corpus for s in corpus[lang][0]], args.vocab_size)
        pst = chinese_stats(plain, held_out)
        print(f"  for comparison, plain byte-level BPE on the same corpus (no word cut): vocabulary "
              f"{plain.get_vocab_size()}, {pst['tokens_per_char']:.3f} tokens per character, worst sentence "
              f"{pst['worst_sentence']:.2f}, prefix consistency {prefix_consistency(plain, sample, at_words=True):.3f} "
              f"at word ends and {prefix_consistency(plain, sample):.3f} after every character, "
              f"{prompt!r} -> {[plain.decode([i]) for i in plain.encode(prompt, add_special_tokens=False).ids]}")
    if "en" in corpus:
        held_out = corpus["en"][1]
        english_only = train_tokenizer(corpus["en"][0], args.vocab_size)
        line = (f"English, {len(held_out)} held-out stories: {english_tokens_per_word(tok, held_out):.4f} tokens "
                f"per word; English-only recipe {english_tokens_per_word(english_only, held_out):.4f} "
                f"(vocabulary {english_only.get_vocab_size()})")
        shipped = Path(__file__).resolve().parents[1] / "minillm" / "assets" / "stories-3m" / "tokenizer.json"
        if shipped.exists():
            from tokenizers import Tokenizer

            line += f"; shipped stories-3m tokenizer {english_tokens_per_word(Tokenizer.from_file(str(shipped)), held_out):.4f}"
        print(line)
        print(f"  prefix consistency over 100 stories at word ends: {prefix_consistency(tok, held_out[:100], True):.3f}"
              f" (English-only recipe {prefix_consistency(english_only, held_out[:100], True):.3f})")


# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    t_start = time.time()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM,
                              PreTrainedTokenizerFast)

    # 1. corpus
    t0 = time.time()
    corpus = make_corpus(args)
    train_texts = [s for lang in corpus for s in corpus[lang][0]]
    val_texts = [s for lang in corpus for s in corpus[lang][1]]
    n_words = sum(len(s.split()) for s in corpus.get("en", ([], []))[0])
    n_chars_zh = sum(len(s) for s in corpus.get("zh", ([], []))[0])
    print(f"corpus ({args.lang}): {len(train_texts)} train + {len(val_texts)} val stories, "
          f"{n_words} English train words, {n_chars_zh} Chinese train characters ({time.time() - t0:.1f}s)")

    # 2. tokenizer
    t0 = time.time()
    han_words = story_corpus_zh.lexicon() if "zh" in corpus else None
    tok = train_tokenizer(train_texts, args.vocab_size, han_words)
    if args.tokenizer_report:
        tokenizer_report(tok, corpus, args)
        return
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    vocab = tok.get_vocab_size()
    train_seqs = [e.ids + [eos_id] for e in tok.encode_batch(train_texts)]
    val_seqs = [e.ids + [eos_id] for e in tok.encode_batch(val_texts)]
    val_seqs_by_lang = {lang: [e.ids + [eos_id] for e in tok.encode_batch(corpus[lang][1])] for lang in corpus}
    n_tokens = sum(map(len, train_seqs))
    n_val_tokens = sum(map(len, val_seqs))
    assert all(s[0] == bos_id for s in train_seqs)
    print(f"tokenizer: vocab {vocab}, {n_tokens} train tokens, {n_val_tokens} val tokens, "
          f"max story {max(map(len, train_seqs))} tokens ({time.time() - t0:.1f}s)")

    # 3. model
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=1024,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))

    use_bf16 = bf16_ok(args.bf16)
    print(f"bf16 autocast: {use_bf16}")
    data_rng = random.Random(args.seed)

    def batches_forever():
        while True:
            yield from make_batches(train_seqs, args.batch_size, data_rng, eos_id)

    batches = batches_forever()
    history = {"step": [], "train": [], "val_step": [], "val": []}
    tokens_seen = 0
    ema = None
    model.train()
    t_train = time.time()
    bar = tqdm(range(args.steps), desc="training", dynamic_ncols=True, mininterval=2.0)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = next(batches)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            loss = model(input_ids=x, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += int((y != -100).sum())
        li = loss.item()
        ema = li if ema is None else 0.95 * ema + 0.05 * li
        history["step"].append(step)
        history["train"].append(li)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            v = evaluate(model, val_seqs, eos_id, use_bf16)
            history["val_step"].append(step + 1)
            history["val"].append(v)
            tqdm.write(f"step {step + 1}: train {ema:.3f}  val {v:.3f}")
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr_at(step):.1e}")
    train_time = time.time() - t_train

    # final losses, in float32
    model.eval()
    final_val = evaluate(model, val_seqs, eos_id, use_bf16=False)
    final_val_by_lang = {lang: evaluate(model, seqs, eos_id, use_bf16=False)
                         for lang, seqs in val_seqs_by_lang.items()}
    if len(final_val_by_lang) > 1:
        print("final validation loss by language: "
              + ", ".join(f"{lang} {v:.4f}" for lang, v in final_val_by_lang.items()))
    sub = random.Random(1).sample(train_seqs, min(1000, len(train_seqs)))
    final_train = evaluate(model, sub, eos_id, use_bf16=False)
    print(f"final: train loss {final_train:.4f}, val loss {final_val:.4f}, "
          f"{tokens_seen:,} tokens seen in {train_time:.0f}s")

    # 4. save
    model = model.float()
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        do_sample=False, max_new_tokens=256,
    )
    model.save_pretrained(out, safe_serialization=True)
    # transformers 5 writes rope_theta inside "rope_parameters"; keep the classic
    # top-level key too, for readers of config.json that expect it.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", config.rope_parameters.get("rope_theta", 10000.0)
                   if getattr(config, "rope_parameters", None) else 10000.0)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
        model_max_length=1024, clean_up_tokenization_spaces=False,
    )
    hf_tok.save_pretrained(out)
    stm = out / "special_tokens_map.json"
    if not stm.exists():
        stm.write_text(json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}, indent=2) + "\n")
    plot_losses(history, out / "loss_curve.png")

    samples = make_samples(model, hf_tok, eos_id, langs=list(corpus))
    checks = zh_stats = None
    if "zh" in corpus:
        checks = language_checks(model, hf_tok, eos_id, list(corpus))
        zh_stats = chinese_stats(tok, corpus["zh"][1])
        for lang, c in checks.items():
            print(f"check {lang}: {c['eos']}/{c['n']} sampled stories end with EOS, {c['same_language']}/{c['n']} "
                  f"stay in the language; next-token entropy after {c['prompt']!r}: {c['entropy_bits']:.2f} bits")
        print(f"check zh: {zh_stats['tokens_per_char']:.3f} tokens per character, "
              f"{zh_stats['sentences_over_n']} of {zh_stats['sentences']} sentences with more tokens than characters")
    total_time = time.time() - t_start
    write_card(out, args, dict(
        n_params=n_params, vocab=vocab, n_train=len(train_texts), n_val=len(val_texts),
        n_words=n_words, n_tokens=n_tokens, n_val_tokens=n_val_tokens, tokens_seen=tokens_seen,
        train_time=train_time, total_time=total_time, final_train=final_train,
        final_val=final_val, bos_id=bos_id, eos_id=eos_id, bf16=use_bf16, samples=samples,
        history=history, final_val_by_lang=final_val_by_lang, n_chars_zh=n_chars_zh,
        checks=checks, zh_stats=zh_stats,
    ))
    for f in out.iterdir():
        if f.is_file():
            f.chmod(0o644)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"saved to {out} ({size / 1e6:.1f} MB); total time {total_time:.0f}s")


def plot_losses(history, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(history["step"], history["train"], lw=0.6, alpha=0.4, color="tab:blue", label="train (per step)")
    k, sm, acc = 0.95, [], None
    for v in history["train"]:
        acc = v if acc is None else k * acc + (1 - k) * v
        sm.append(acc)
    ax.plot(history["step"], sm, lw=1.5, color="tab:blue", label="train (smoothed)")
    ax.plot(history["val_step"], history["val"], "o-", color="tab:orange", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    ax.set_yscale("log")
    ax.set_title("stories-3m training loss")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@torch.no_grad()
def make_samples(model, tok, eos_id, langs=("en",)):
    greedy = (PROMPTS_GREEDY if "en" in langs else []) + (PROMPTS_GREEDY_ZH if "zh" in langs else [])
    sampled = (PROMPTS_SAMPLED if "en" in langs else []) + (PROMPTS_SAMPLED_ZH if "zh" in langs else [])
    out = []
    for p in greedy:
        ids = tok(p, return_tensors="pt").input_ids
        g = model.generate(ids, do_sample=False, max_new_tokens=256, pad_token_id=eos_id)
        out.append(("greedy", p, tok.decode(g[0], skip_special_tokens=True), g[0, -1].item() == eos_id))
    for i, p in enumerate(sampled):
        torch.manual_seed(i)
        ids = tok(p, return_tensors="pt").input_ids
        g = model.generate(ids, do_sample=True, temperature=0.8, top_k=0, top_p=1.0,
                           max_new_tokens=256, pad_token_id=eos_id)
        out.append((f"sampled, temperature 0.8, torch seed {i}", p,
                    tok.decode(g[0], skip_special_tokens=True), g[0, -1].item() == eos_id))
    return out


CHECK_PROMPTS = {"en": "Once upon a time", "zh": "从前有一只小狐狸，它"}


@torch.no_grad()
def language_checks(model, tok, eos_id, langs, n=50, temperature=0.8):
    """Issue 14's numbers per language: of *n* stories sampled at *temperature*, how many
    end with EOS and how many stay in the prompt's language; and the entropy (bits) of the
    next-token distribution right after the prompt."""
    han = re.compile(r"[\u4e00-\u9fff]")
    out = {}
    for i, lang in enumerate(langs):
        prompt = CHECK_PROMPTS[lang]
        ids = tok(prompt, return_tensors="pt").input_ids
        p = model(input_ids=ids).logits[0, -1].float().softmax(-1)
        entropy = -(p * p.clamp_min(1e-30).log2()).sum().item()
        torch.manual_seed(100 + i)
        batch = ids.repeat(n, 1)
        g = model.generate(batch, attention_mask=torch.ones_like(batch), do_sample=True, temperature=temperature,
                           top_k=0, top_p=1.0, max_new_tokens=256, pad_token_id=eos_id)[:, ids.shape[1]:]
        texts = tok.batch_decode(g, skip_special_tokens=True)
        ended = sum(bool((row == eos_id).any()) for row in g)
        if lang == "zh":
            same = sum(bool(han.search(t)) and not re.search(r"[A-Za-z]", t) for t in texts)
        else:
            same = sum(not han.search(t) for t in texts)
        out[lang] = dict(prompt=prompt, entropy_bits=entropy, eos=ended, same_language=same, n=n,
                         temperature=temperature)
    return out


def write_card(out, args, r):
    cmd = "python scripts/train_default_model.py --out minillm/assets/stories-3m"
    defaults = vars(parse_args([]))
    changed = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v != defaults[k]]
    if changed:
        cmd += " " + " ".join(changed)
    samples = "\n\n".join(
        f"**{kind}** — prompt `{p}`{'' if ended else ' (hit the 256-token limit)'}:\n\n> {text}"
        for kind, p, text, ended in r["samples"])
    vals = ", ".join(f"{s}: {v:.3f}" for s, v in zip(r["history"]["val_step"], r["history"]["val"]))
    zh = "zh" in args.lang.split(",")
    en = "en" in args.lang.split(",")
    language = {"en": "English", "zh": "Chinese", "en,zh": "English and Chinese"}[args.lang]
    zh_tokenizer = zh_data = val_rows = ""
    if zh:
        zh_tokenizer = f"""

Chinese has no spaces, so before BPE sees it, Han text is cut at the
{len(story_corpus_zh.lexicon())} words of the Chinese grammar (forward maximum matching: a `Split`
pre-tokenizer whose regex is stored in `tokenizer.json`), and each full-width punctuation mark
stands alone. BPE therefore learns every common character and word as one token and no token
spans two words, so a prompt such as `从前有一只小狐狸，它` ends where a word ends inside the
training stories too."""
        zh_stories = r["n_train"] // len(args.lang.split(","))
        zh_data = f"""

The Chinese stories ({zh_stories:,} for training, {r['n_chars_zh']:,} characters) come from
`scripts/story_corpus_zh.py` with the same seeds: {len(story_corpus_zh.GIRL_NAMES) + len(story_corpus_zh.BOY_NAMES)}
children's names (小明, 小红, ...), {len(story_corpus_zh.PET_NAMES)} pet names, {len(story_corpus_zh.ANIMALS)} animals
and {len(story_corpus_zh.CREATURES)} creatures with their measure words, {len(story_corpus_zh.PLACES)} places,
{len(story_corpus_zh.OBJECTS)} objects and the same {len(story_corpus_zh.PLOTS)} plot shapes, written with 他/她/它
and full-width punctuation, {story_corpus_zh.MIN_CHARS}-{story_corpus_zh.MAX_CHARS} characters each."""
    checks_section = ""
    if r.get("checks"):
        rows = "\n".join(
            f"| `{c['prompt']}` | {c['eos']}/{c['n']} | {c['same_language']}/{c['n']} | {c['entropy_bits']:.2f} |"
            for c in r["checks"].values())
        t = next(iter(r["checks"].values()))["temperature"]
        zs = r["zh_stats"]
        checks_section = f"""
## Checks

Stories sampled at temperature {t} (transformers `generate`, at most 256 new tokens), and the
entropy of the next-token distribution right after the prompt:

| prompt | end with EOS | stay in the prompt's language | next-token entropy (bits) |
|---|---|---|---|
{rows}

Chinese validation stories: {zs['tokens_per_char']:.3f} tokens per character; {zs['sentences_over_n']} of
{zs['sentences']:,} sentences have more tokens than characters; {zs['byte_fallback_tokens']} byte-fallback tokens.
"""
    if len(r.get("final_val_by_lang", {})) > 1:
        val_rows = "".join(f"\n| final validation, { {'en': 'English', 'zh': 'Chinese'}[k]} stories | {v:.3f} |"
                           for k, v in r["final_val_by_lang"].items())
    card = f"""---
license: mit
library_name: transformers
pipeline_tag: text-generation
tags: [llama, tiny, synthetic, minillm]
---

# stories-3m

The tiny default model of **minillm**: a {r['n_params'] / 1e6:.1f}M-parameter Llama-architecture
causal language model trained from scratch, on a CPU, on a synthetic corpus of simple
{language} short stories. It exists so that the engine, its tests and the course have a real
model to run offline. It writes short, simple, grammatical stories; it knows nothing else.

## Architecture

| | |
|---|---|
| architecture | `LlamaForCausalLM` (RMSNorm, rotary position embeddings, SwiGLU MLP) |
| parameters | {r['n_params']:,} (float32, {r['n_params'] * 4 / 1e6:.1f} MB) |
| hidden size | {args.hidden} |
| layers | {args.layers} |
| attention heads | {args.heads} query heads, {args.kv_heads} key/value heads (grouped-query attention), head dim {args.hidden // args.heads} |
| MLP intermediate size | {args.intermediate} |
| vocabulary | {r['vocab']} |
| context length | 1024 positions (`max_position_embeddings`); trained on stories of at most ~250 tokens |
| RoPE theta | 10000 |
| embeddings | tied input/output (`tie_word_embeddings=True`) |
| special tokens | `<|bos|>` = {r['bos_id']}, `<|endoftext|>` = {r['eos_id']} (also used as padding) |

## Tokenizer

Byte-level BPE trained with the `tokenizers` library on the training stories (target
vocabulary {args.vocab_size}; the corpus has fewer distinct words than that, so the
learned vocabulary has {r['vocab']} entries, whole words for almost everything). ByteLevel
pre-tokenizer and decoder, so decoding round-trips text, spaces included. A
`TemplateProcessing` post-processor prepends `<|bos|>` to every encoded text, so
`tokenizer("Once upon a time")` already starts with the BOS id, in transformers and in
minillm alike. Generation stops at `<|endoftext|>`.{zh_tokenizer}

## Training data

{r['n_train']:,} training and {r['n_val']:,} validation stories ({r['n_words']:,} training words,
{r['n_tokens']:,} training tokens, {r['n_val_tokens']:,} validation tokens), {'the English ones ' if zh else ''}generated by
`scripts/story_corpus.py` (seed {args.seed} for training, {args.seed + 1} for validation).
The generator is a hand-written grammar: {len(GIRL_NAMES) + len(BOY_NAMES)} names,
{len(ANIMALS)} animals and {len(CREATURES)} other creatures (robot, dragon, ...), {len(PLACES)} places,
{len(OBJECTS)} objects, colours, weather, foods and feelings, and {len(PLOTS)} plot shapes
({', '.join(p.replace('_', ' ') for p in PLOTS)}). The hero, the friend, the place and
the object drawn at the start of a story are carried through it, so a prompt that names
them leads to a story about them. Stories are 60-180 words. Each training sequence is
`<|bos|> story <|endoftext|>`. The corpus is synthetic: no third-party text is used.{zh_data}

## Training

AdamW (betas 0.9/0.95, weight decay {args.weight_decay}), peak learning rate {args.lr}, {args.warmup}
warm-up steps then cosine decay to {args.min_lr_ratio * args.lr:g}, {args.steps} steps of {args.batch_size}
stories (length-bucketed, right-padded), gradient clipping 1.0, seed {args.seed}.
{r['tokens_seen']:,} tokens seen (about {r['tokens_seen'] / r['n_tokens']:.1f} epochs).
Matmuls in bfloat16 autocast on the CPU: {'yes' if r['bf16'] else 'no'}; weights and optimizer state in float32.

    {cmd}

took {r['total_time'] / 60:.1f} minutes in all ({r['train_time'] / 60:.1f} minutes of training) on
{args.threads} CPU threads. Wall time depends on what else the machine is running: on two
otherwise idle cores (with bfloat16 autocast) a step takes about 0.5 s, so the default run
takes about 10 minutes; on a busy shared machine it can take two or three times longer.

| | loss (nats/token, float32) |
|---|---|
| final train (1,000 training stories) | {r['final_train']:.3f} |
| final validation | {r['final_val']:.3f} |{val_rows}

Validation loss during training (step: loss): {vals}.

![loss curve](loss_curve.png)
{checks_section}
## Samples

{samples}

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
path = "minillm/assets/stories-3m"
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
ids = tok("Once upon a time", return_tensors="pt").input_ids   # starts with <|bos|>
print(tok.decode(model.generate(ids, max_new_tokens=256)[0], skip_special_tokens=True))
```

## Limitations

A toy: a small vocabulary, a few hundred sentence patterns, no knowledge of the world.
Prompts far from the corpus (other topics, {'languages other than English and Chinese' if en and zh else 'other languages'}, code) give nonsense.

## Licence

MIT, the same as the minillm project. The training corpus is synthetic, generated by the
project's own script.
"""
    (out / "README.md").write_text(card)


if __name__ == "__main__":
    main()
