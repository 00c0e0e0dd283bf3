"""Host work of one decode step against the context length, this tree against an older commit.

    python benchmarks/step_host_work.py --ref 04476a6^ --rounds 5

What a decode step costs the host, apart from the model's arithmetic: building the step's
upload (ids, positions, slots, block tables, context lengths), the metadata made from it, and
sampling (penalties included). To see that cost alone, the model's forward is replaced by a
stub that returns fixed logits of the right shape; what is timed is ``ModelRunner.run`` plus
``ModelRunner.sample`` per decode-only step (median of ``--steps`` steps after 3 warm-up
steps), and within it the host preparation alone (up to the step's upload and up to the
sampler's upload: pure Python work, what a GPU would wait on). 16 requests at each context length (64 ... 2048 tokens), greedy, without and with
penalties (repetition 1.1, presence 0.2, frequency 0.1), on a random Llama with SmolLM2's
vocabulary (49,152; the sampler's work scales with it) and 16-token blocks.

``--ref``'s ``minillm/`` is extracted into a temporary folder as ``minillm_before`` (as
``before_after.py`` does) and both engines run in this one process, alternating which goes
first in every (round, context, setting); medians over rounds. Also counted, on one extra
step: the values the step's one upload carries (``StepUpload``) and the sampler's upload.
1 thread. Prints a table and writes ``step_host_work.json`` next to this script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import minillm  # noqa: E402
from before_after import load_before  # noqa: E402
from minillm.apps.bench.models import build_random_llama  # noqa: E402

NUM_REQUESTS = 16
BLOCK_SIZE = 16
SHAPE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
             tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5)
SETTINGS = {"greedy": dict(temperature=0.0),
            "penalties": dict(temperature=0.0, repetition_penalty=1.1, presence_penalty=0.2,
                              frequency_penalty=0.1)}


class StubForward:
    """Stands in for the model: the logits rows the runner asks for, no arithmetic."""

    def __init__(self, vocab: int):
        self.logits = torch.randn(4 * NUM_REQUESTS, vocab, generator=torch.Generator().manual_seed(0))

    def __call__(self, input_ids, batch, kv, logits_rows=None):
        rows = input_ids.numel() if logits_rows is None else logits_rows.numel()
        return self.logits[:rows]


def engine_at(pkg, folder: Path, context: int, setting: str, steps: int):
    """An engine of package ``pkg`` with 16 requests decoding at ``context`` tokens."""
    blocks = NUM_REQUESTS * (-(-(context + steps + 8) // BLOCK_SIZE)) + 8
    llm = pkg.LLM(str(folder), "cpu", "float32", block_size=BLOCK_SIZE, num_kv_blocks=blocks,
                  max_num_seqs=NUM_REQUESTS, max_num_batched_tokens=NUM_REQUESTS * (context + 1),
                  enable_prefix_caching=False, max_model_len=SHAPE["max_position_embeddings"])
    llm.runner.model = StubForward(SHAPE["vocab_size"])
    rng = random.Random(context)
    for _ in range(NUM_REQUESTS):
        prompt = [rng.randrange(3, SHAPE["vocab_size"]) for _ in range(context)]
        llm.add_request(prompt_token_ids=prompt, params=pkg.SamplingParams(
            max_tokens=steps + 8, ignore_eos=True, **SETTINGS[setting]))
    while any(r.state.value != "DECODE" for r in llm.requests.values()):
        llm.step()
    return llm


def time_steps(pkg, llm, steps: int) -> tuple[float, float]:
    """Median seconds per decode step (after 3 warm-up steps) of run + sample, and of their
    host preparation alone: from entering ``run`` to its ``StepUpload.send``, plus from
    entering ``sample`` to the sampler's upload (``torch.tensor`` of its float64 block; 0
    when it sends none). The rest is tensor work, which on a GPU would run asynchronously."""
    runner = llm.runner
    runner_mod = sys.modules[pkg.__name__ + ".runner"]
    real_run, real_sample = runner.run, runner.sample
    real_send, real_tensor = runner_mod.StepUpload.send, torch.tensor
    marks: dict = {}

    def timed(real, mark, forget=False):
        """``real``, its start noted as ``marks[mark]`` and its time added to the total."""
        def call(*a, **k):
            marks[mark] = t = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                marks["total"] += time.perf_counter() - t
                if forget:
                    marks.pop(mark, None)
        return call

    run, sample = timed(real_run, "run"), timed(real_sample, "sample", forget=True)

    def send(self, device):
        marks["host"] += time.perf_counter() - marks["run"]
        return real_send(self, device)

    def tensor(data, *a, **k):
        if k.get("dtype") is torch.float64 and "sample" in marks:
            marks["host"] += time.perf_counter() - marks.pop("sample")
        return real_tensor(data, *a, **k)

    runner.run, runner.sample = run, sample
    runner_mod.StepUpload.send = send
    torch.tensor = tensor
    totals, hosts = [], []
    try:
        for i in range(steps + 3):
            marks.update(total=0.0, host=0.0)
            llm.step()
            if i >= 3:
                totals.append(marks["total"])
                hosts.append(marks["host"])
    finally:
        runner.run, runner.sample = real_run, real_sample
        runner_mod.StepUpload.send = real_send
        torch.tensor = real_tensor
    return statistics.median(totals), statistics.median(hosts)


def upload_sizes(pkg, llm) -> tuple[int, int]:
    """Values sent by one decode step: the runner's one upload, the sampler's upload."""
    runner_mod = sys.modules[pkg.__name__ + ".runner"]
    sizes = {"step": 0, "sampler": 0}
    real_send, real_tensor = runner_mod.StepUpload.send, torch.tensor

    def send(self, device):
        sizes["step"] += len(self.data)
        return real_send(self, device)

    def tensor(data, *a, **k):
        t = real_tensor(data, *a, **k)
        if t.dtype == torch.float64:  # the sampler's parameter block
            sizes["sampler"] += t.numel()
        return t

    runner_mod.StepUpload.send = send
    torch.tensor = tensor
    try:
        llm.step()
    finally:
        runner_mod.StepUpload.send = real_send
        torch.tensor = real_tensor
    return sizes["step"], sizes["sampler"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="04476a6^", help="git ref of the engine before")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15, help="timed decode steps per measurement")
    ap.add_argument("--contexts", default="64,256,1024,2048")
    ap.add_argument("--json", default=str(HERE / "step_host_work.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    contexts = [int(c) for c in args.contexts.split(",")]
    before = load_before(args.ref)
    engines = {"before": before, "after": minillm}
    folder = build_random_llama(Path(tempfile.mkdtemp(prefix="step-host-work-")) / "model", SHAPE)
    load = [os.getloadavg()]
    times: dict = {}
    host: dict = {}
    uploads: dict = {}
    for rnd in range(args.rounds):
        for ci, ctx in enumerate(contexts):
            for si, setting in enumerate(SETTINGS):
                order = list(engines) if (rnd + ci + si) % 2 == 0 else list(engines)[::-1]
                for name in order:
                    llm = engine_at(engines[name], folder, ctx, setting, args.steps)
                    t, h = time_steps(engines[name], llm, args.steps)
                    times.setdefault((ctx, setting, name), []).append(t)
                    host.setdefault((ctx, setting, name), []).append(h)
                    if rnd == 0:
                        uploads[(ctx, setting, name)] = upload_sizes(engines[name], llm)
                    del llm
        print(f"round {rnd + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    load.append(os.getloadavg())
    rows = []
    print(f"\nrun + sample per decode step, {NUM_REQUESTS} requests, model forward stubbed, 1 thread, "
          f"medians of {args.rounds} rounds; load average {load[0][0]:.2f} -> {load[-1][0]:.2f}")
    print(f"{'context':>8} {'setting':>10} {'run+sample ms before':>21} {'after':>7} "
          f"{'host prep ms before':>20} {'after':>7} {'uploaded before':>16} {'after':>8}")

    def stats(d, key):
        v = d[key]
        return {"median_ms": statistics.median(v) * 1e3, "range_ms": [min(v) * 1e3, max(v) * 1e3]}

    for ctx in contexts:
        for setting in SETTINGS:
            kb, ka = (ctx, setting, "before"), (ctx, setting, "after")
            ub, ua = uploads[kb], uploads[ka]
            row = {"context": ctx, "setting": setting,
                   "run_sample": {"before": stats(times, kb), "after": stats(times, ka)},
                   "host_prep": {"before": stats(host, kb), "after": stats(host, ka)},
                   "uploaded_values": {"before": {"step": ub[0], "sampler": ub[1]},
                                       "after": {"step": ua[0], "sampler": ua[1]}}}
            rows.append(row)
            rs, hp = row["run_sample"], row["host_prep"]
            print(f"{ctx:>8} {setting:>10} {rs['before']['median_ms']:>21.2f} {rs['after']['median_ms']:>7.2f} "
                  f"{hp['before']['median_ms']:>20.3f} {hp['after']['median_ms']:>7.3f} "
                  f"{ub[0] + ub[1]:>16} {ua[0] + ua[1]:>8}")
    out = {"ref": args.ref, "rounds": args.rounds, "steps": args.steps, "requests": NUM_REQUESTS,
           "block_size": BLOCK_SIZE, "vocab": SHAPE["vocab_size"], "threads": 1,
           "loadavg_start": load[0], "loadavg_end": load[-1], "rows": rows}
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
