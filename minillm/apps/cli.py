"""The ``minillm`` command: generate | lab | grade | bench | serve."""

from __future__ import annotations

import argparse
import sys


def _generate(args: argparse.Namespace) -> int:
    from .. import LLM, SamplingParams

    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, min_p=args.min_p, seed=args.seed,
                                stop=args.stop or None, ignore_eos=args.ignore_eos)
        llm = LLM(args.model, device=args.device, dtype=args.dtype)
        out = llm.generate([args.prompt], params)[0]
    except (ValueError, FileNotFoundError) as exc:
        print(f"minillm generate: error: {exc}", file=sys.stderr)
        return 2
    m = out.metrics
    print(args.prompt + out.text)
    print("---")
    ttft = f"{m['ttft'] * 1000:.1f} ms" if m["ttft"] is not None else "n/a"
    tpot = f"{m['tpot'] * 1000:.2f} ms" if m["tpot"] is not None else "n/a"
    print(f"stop reason: {out.stop_reason.value} | prompt tokens: {len(out.prompt_token_ids)} | "
          f"output tokens: {len(out.token_ids)} | TTFT: {ttft} | TPOT: {tpot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="minillm", description="A small LLM inference engine and its course.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("prompt")
    g.add_argument("--model", default=None, help="local Hugging Face folder (default: the shipped model)")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", default="auto")

    sub.add_parser("lab", help="open the course in JupyterLab (--lang zh: the Chinese edition, 中文版)", add_help=False)
    sub.add_parser("grade", help="grade submitted notebooks (one, or a folder into a gradebook)", add_help=False)
    sub.add_parser("bench", help="run the benchmarks against transformers", add_help=False)
    sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API", add_help=False)
    sub.add_parser("chat", help="chat with a model in the terminal (streams; Ctrl-C stops a reply)", add_help=False)

    if argv and argv[0] == "chat":
        from .chat_repl import main as chat_main
        return chat_main(argv[1:])
    if argv and argv[0] == "serve":
        from .serve.server import serve
        return serve(argv[1:])
    if argv and argv[0] in ("lab", "grade", "bench"):
        rest = argv[1:]
        if argv[0] == "lab":
            from .lab import main as lab_main
            return lab_main(rest)
        if argv[0] == "grade":
            from ..grading import cli_grade
            return cli_grade(rest)
        from .bench import main as bench_main
        return bench_main(rest)
    args = parser.parse_args(argv)
    return _generate(args)


if __name__ == "__main__":
    sys.exit(main())
