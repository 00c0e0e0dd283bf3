"""Results out: one JSON per model, PNG plots, and the markdown tables of benchmarks/README.md."""

from __future__ import annotations

import json
from pathlib import Path

BEGIN = "<!-- bench:results:begin -->"
END = "<!-- bench:results:end -->"


def write_json(result: dict, out_dir: Path) -> Path:
    path = out_dir / f"results_{result['model']['name']}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return path


def merge_previous(result: dict, out_dir: Path, sections) -> None:
    """Fill in the sections this run skipped (``--only``) from the model's previous JSON."""
    path = out_dir / f"results_{result['model']['name']}.json"
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    for sec in sections:
        if sec not in result and sec in old:
            result[sec] = old[sec]


def load_all(out_dir: Path, first=()) -> list[dict]:
    """Every results_*.json in ``out_dir``: the default model, then 135m, then the others."""
    found = {json.loads(p.read_text())["model"]["name"]: p for p in sorted(out_dir.glob("results_*.json"))}
    order = [n for n in ("default", "135m") if n in found] + sorted(n for n in found if n not in ("default", "135m"))
    return [json.loads(found[n].read_text()) for n in order]


def _meta(section: dict) -> str:
    m = section.get("meta")
    if not m:
        return ""
    load = m.get("load_average_start"), m.get("load_average_end")
    load = "" if None in load else f", load average {load[0][0]:.1f} → {load[1][0]:.1f}"
    cpu = f", {m['cpu_seconds']} s CPU in {m['seconds']} s wall" if "cpu_seconds" in m else ""
    return f" — median of {m['runs']} rounds, {m['torch_threads']} threads, {m['started']}{load}{cpu}"


def _ms(x) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f}" if x >= 0.1 else f"{x * 1e3:.2f}"


def _r(x) -> str:
    return "n/a" if x is None else f"{x:.2f}×"


def markdown(result: dict) -> str:
    """The tables for one model."""
    m, mach = result["model"], result["machine"]
    lines = [f"### `{m['name']}`: {m['description']}", ""]
    lines.append(f"{m['parameters'] / 1e6:.1f}M parameters, {m['dtype']} on {mach['device']}; engines "
                 f"alternating, medians of the timed rounds; every comparison token-identical (greedy) first.")
    lines.append("")
    if "latency" in result:
        lat = result["latency"]
        lines += [f"**1. Batch-1 latency** ({lat['new_tokens']} new tokens; ratio = minillm / transformers, "
                  f"lower is better{_meta(lat)})", "",
                  "| prompt tokens | TTFT minillm (ms) | TTFT generate() (ms) | TTFT ratio | TPOT minillm (ms) "
                  "| TPOT generate() (ms) | TPOT ratio |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for row in lat["prompts"]:
            a, b = row["minillm"], row["transformers"]
            lines.append(f"| {row['prompt_tokens']} | {_ms(a['ttft_s']['median'])} | {_ms(b['ttft_s']['median'])} "
                         f"| {_r(row['ttft_ratio'])} | {_ms(a['tpot_s']['median'])} | {_ms(b['tpot_s']['median'])} "
                         f"| {_r(row['tpot_ratio'])} |")
        lines.append("")
    if "throughput" in result:
        t = result["throughput"]
        lines += [f"**2. Mixed workload** ({t['num_requests']} requests, prompts {min(t['prompt_lens'])}–"
                  f"{max(t['prompt_lens'])} tokens, outputs {min(t['output_lens'])}–{max(t['output_lens'])}, "
                  f"{t['useful_output_tokens']} wanted output tokens; output tokens/s, higher is better"
                  f"{_meta(t)})", "",
                  "| engine | requests timed | output tokens/s | vs generate() best |", "|---|---:|---:|---:|"]
        best = t["generate_best_tokens_per_s"]["median"]
        for row in t["generate_batch_sizes"]:
            tps = row["tokens_per_s"]
            if row["batch_size"] == t["generate_best_batch_size"]:
                tps = best
            tag = " (best)" if row["batch_size"] == t["generate_best_batch_size"] else ""
            lines.append(f"| generate(), static batch {row['batch_size']}{tag} | {row['requests']} | {tps:.0f} "
                         f"| {tps / best:.2f}× |")
        if "minillm_static_tokens_per_s" in t:
            st = t["minillm_static_tokens_per_s"]["median"]
            lines.append(f"| minillm, `scheduling=\"static\"` | {t['num_requests']} | {st:.0f} | {st / best:.2f}× |")
        mc = t["minillm_continuous_tokens_per_s"]["median"]
        lines.append(f"| **minillm, continuous batching** | {t['num_requests']} | **{mc:.0f}** | "
                     f"**{mc / best:.2f}×** |")
        lines.append("")
        extra = (f"; continuous vs static inside minillm: **{_r(t['ratio_continuous_vs_static'])}**"
                 if "ratio_continuous_vs_static" in t else "")
        lines.append(f"minillm / generate() at its best batch size: **{_r(t['ratio_minillm_vs_generate_best'])}** "
                     f"(per-round ratios {t['ratio_per_round']['min']:.2f}–{t['ratio_per_round']['max']:.2f})"
                     f"{extra}. Batch sizes other than the best were timed once (their check run); "
                     f"the check runs count as round 1.")
        lines.append("")
    if "kv_cache" in result:
        kv = result["kv_cache"]
        lines += ["**3. KV cache on / off** (batch 1; one decode step with the cache vs recomputing the whole "
                  f"context for the same token{_meta(kv)})", "",
                  "| context tokens | with cache (ms) | recompute, last logits (ms) | ratio | recompute, "
                  "`full_logits` (ms) | ratio |", "|---:|---:|---:|---:|---:|---:|"]
        for row in kv["points"]:
            lines.append(f"| {row['context']} | {_ms(row['cached_s']['median'])} | {_ms(row['recompute_s']['median'])} "
                         f"| {row['ratio']:.1f}× | {_ms(row['recompute_full_logits_s']['median'])} "
                         f"| {row['ratio_full_logits']:.1f}× |")
        lines.append("")
    plots = result.get("plots", [])
    if plots:
        lines.append(" ".join(f"![{Path(p).stem}]({Path(p).name})" for p in plots))
        lines.append("")
    return "\n".join(lines)


def machine_markdown(results: list[dict]) -> str:
    """The machine the results were measured on (from the JSON), as a small table."""
    if not results:
        return ""
    m = results[0]["machine"]
    rows = [("CPU", f"{m['cpu']} ({', '.join(m.get('cpu_features', [])) or 'features unknown'})"),
            ("cores / threads", f"{m['logical_cpus']} logical CPUs; torch threads {m['torch_threads']}"),
            ("memory", f"{m['memory_gib']} GiB"),
            ("read bandwidth", _bandwidth(m)),
            ("device", m["device"] + (f" ({m['gpu']})" if m.get("gpu") else "")),
            ("software", f"Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}"),
            ("OS", m["platform"])]
    out = ["| machine | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(out) + "\n"


def _bandwidth(m: dict) -> str:
    """GB/s one float32 sum reads at 1 and 2 threads, before and after the run (CPU runs)."""
    start, end = m.get("read_gbs_start"), m.get("read_gbs_end") or {}
    if not start:
        return "not measured in this run"
    return "; ".join(f"{t} thread(s) {v:.1f} GB/s" + (f" → {end[t]:.1f}" if t in end else "")
                     for t, v in start.items()) + " (before → after)"


def summary_markdown(results: list[dict]) -> str:
    """One table of the headline ratios, a column per model."""
    if not results:
        return ""
    names = [r["model"]["name"] for r in results]
    rows = []

    def lat(key):
        def cell(r):
            ps = r.get("latency", {}).get("prompts", [])
            return " / ".join(f"{p[key]:.2f}" for p in ps) or "n/a"
        return cell

    def thr(r):
        t = r.get("throughput")
        if not t:
            return "n/a"
        return (f"{t['minillm_continuous_tokens_per_s']['median']:.0f} vs {t['generate_best_tokens_per_s']['median']:.0f}"
                f" (batch {t['generate_best_batch_size']}): **{t['ratio_minillm_vs_generate_best']:.2f}×**")

    def static(r):
        t = r.get("throughput", {})
        return f"{t['ratio_continuous_vs_static']:.2f}×" if "ratio_continuous_vs_static" in t else "n/a"

    def kv(r):
        pts = r.get("kv_cache", {}).get("points", [])
        return f"{pts[-1]['ratio']:.1f}× at {pts[-1]['context']} tokens" if pts else "n/a"

    plens = next((" / ".join(str(p["prompt_tokens"]) for p in r["latency"]["prompts"]) for r in results
                  if "latency" in r), "")
    rows.append((f"batch-1 TPOT, minillm / `generate()` (prompt {plens})", lat("tpot_ratio")))
    rows.append((f"batch-1 TTFT, minillm / `generate()` (prompt {plens})", lat("ttft_ratio")))
    rows.append(("mixed workload, output tok/s: minillm continuous vs `generate()` at its best static batch", thr))
    rows.append(("the same workload, continuous / static scheduling inside minillm", static))
    rows.append(("decode step with the KV cache vs recomputing the context (no cache / cache)", kv))
    out = ["| | " + " | ".join(f"`{n}`" for n in names) + " |", "|---|" + "---|" * len(names)]
    out += [f"| {label} | " + " | ".join(fn(r) for r in results) + " |" for label, fn in rows]
    return "\n".join(out) + "\n"


def update_readme(readme: Path, results: list[dict]) -> None:
    """Replace the generated block of the README (between the markers) with fresh tables."""
    block = (BEGIN + "\n\n" + machine_markdown(results) + "\n" + summary_markdown(results) + "\n"
             + "\n".join(markdown(r) for r in results) + "\n" + END)
    if readme.is_file():
        text = readme.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            tail = rest.split(END, 1)[1]
            readme.write_text(head + block + tail)
            return
        readme.write_text(text.rstrip() + "\n\n## Results\n\n" + block + "\n")
    else:
        readme.write_text("# Benchmarks\n\n" + block + "\n")


# --- plots ----------------------------------------------------------------------------------------
def plots(result: dict, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = result["model"]["name"]
    made = []
    blue, orange, grey = "#2563eb", "#f59e0b", "#9ca3af"
    if "latency" in result:
        rows = result["latency"]["prompts"]
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
        xs = range(len(rows))
        for ax, key, title in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
            a = [r["minillm"][key]["median"] * 1e3 for r in rows]
            b = [r["transformers"][key]["median"] * 1e3 for r in rows]
            ax.bar([x - 0.2 for x in xs], a, 0.4, label="minillm", color=blue)
            ax.bar([x + 0.2 for x in xs], b, 0.4, label="transformers generate()", color=orange)
            ax.set_xticks(list(xs), [str(r["prompt_tokens"]) for r in rows])
            ax.set_xlabel("prompt tokens")
            ax.set_ylabel("ms")
            ax.set_title(f"{title}, batch 1 ({result['latency']['new_tokens']} new tokens)")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{name}: batch-1 latency (median)", fontsize=10)
        fig.tight_layout()
        made.append(_save(fig, out_dir / f"latency_{name}.png"))
    if "throughput" in result:
        t = result["throughput"]
        labels, vals, colors = [], [], []
        for row in t["generate_batch_sizes"]:
            best = row["batch_size"] == t["generate_best_batch_size"]
            labels.append(f"generate()\nbatch {row['batch_size']}" + ("\n(best)" if best else ""))
            vals.append(t["generate_best_tokens_per_s"]["median"] if best else row["tokens_per_s"])
            colors.append(orange)
        if "minillm_static_tokens_per_s" in t:
            labels.append("minillm\nstatic")
            vals.append(t["minillm_static_tokens_per_s"]["median"])
            colors.append(grey)
        labels.append("minillm\ncontinuous")
        vals.append(t["minillm_continuous_tokens_per_s"]["median"])
        colors.append(blue)
        fig, ax = plt.subplots(figsize=(8, 3.6))
        ax.bar(range(len(vals)), vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(vals)), labels, fontsize=8)
        ax.set_ylabel("useful output tokens / s")
        ax.set_title(f"{name}: {t['num_requests']} mixed requests "
                     f"(minillm / best generate() = {t['ratio_minillm_vs_generate_best']:.2f}×)", fontsize=10)
        fig.tight_layout()
        made.append(_save(fig, out_dir / f"throughput_{name}.png"))
    if "kv_cache" in result:
        pts = result["kv_cache"]["points"]
        L = [p["context"] for p in pts]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
        ax1.plot(L, [p["cached_s"]["median"] * 1e3 for p in pts], "o-", color=blue, label="KV cache (decode step)")
        ax1.plot(L, [p["recompute_s"]["median"] * 1e3 for p in pts], "o-", color=orange,
                 label="no cache (recompute context)")
        ax1.set_xscale("log", base=2)
        ax1.set_yscale("log")
        ax1.set_xlabel("context tokens")
        ax1.set_ylabel("ms per generated token")
        ax1.legend(fontsize=8)
        ax1.set_title("cost of one token")
        ax2.plot(L, [p["ratio"] for p in pts], "o-", color="#111827")
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("context tokens")
        ax2.set_ylabel("no cache / cache")
        ax2.set_title("how much the cache saves")
        fig.suptitle(f"{name}: KV cache on vs off (batch 1, median)", fontsize=10)
        fig.tight_layout()
        made.append(_save(fig, out_dir / f"kv_cache_{name}.png"))
    return made


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
