#!/usr/bin/env python
"""How long is one request's path through the engine? Count it, the way a reader would walk it.

Traces one short request (a few prompt tokens, 4 new tokens, greedy) with ``sys.setprofile`` from
``LLM.add_request`` until its KV blocks are released, and prints the number of distinct minillm
functions, the files they live in, and the calls made, for each engine configuration asked for
(default: the reference path, ``LLM(fast=False)``, and the default ``LLM()``). The engine is built and
one request is run before tracing starts, so loading and first-call work are not counted.

    .venv/bin/python scripts/request_path.py                 # both configurations, a summary each
    .venv/bin/python scripts/request_path.py --list          # ... and every function, by file
    .venv/bin/python scripts/request_path.py --json out.json

The design target (issue: one engine a reader can hold) is <= 60 functions in <= 9 files for the
reference path; this script is how that is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    # the reference path the chapter reads: LLM(fast=False)
    "reference": dict(fast=False),
    "default": {},
}


def trace_one_request(config: dict, prompt: str = "Once upon a time", max_tokens: int = 4):
    import minillm
    from minillm import LLM, SamplingParams

    package = str(Path(minillm.__file__).resolve().parent)
    llm = LLM(**config)
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    llm.generate([prompt], params)  # warm: first-call work is not the request's path

    calls: Counter = Counter()

    def profile(frame, event, _arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(package):
                name = f"{code.co_qualname}" if hasattr(code, "co_qualname") else code.co_name
                calls[(str(Path(code.co_filename).relative_to(Path(package).parent)), name)] += 1

    sys.setprofile(profile)
    try:
        req = llm.add_request(prompt, params)
        while not req.state.name == "RELEASED":
            llm.step()
    finally:
        sys.setprofile(None)
    files = Counter(f for f, _ in calls)
    return {"functions": len(calls), "files": len(files), "calls": sum(calls.values()),
            "by_file": {f: sorted(n for g, n in calls if g == f) for f in sorted(files)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=sorted(CONFIGS), action="append", help="default: all")
    p.add_argument("--list", action="store_true", help="print every function, by file")
    p.add_argument("--json", type=Path, help="write the counts here")
    args = p.parse_args(argv)
    results = {}
    for name in args.config or list(CONFIGS):
        results[name] = r = trace_one_request(CONFIGS[name])
        print(f"{name:8s} {r['functions']:4d} functions in {r['files']:2d} files, {r['calls']:5d} calls")
        if args.list:
            for f, names in r["by_file"].items():
                print(f"    {f} ({len(names)}): {', '.join(names)}")
    if {"reference", "default"} <= results.keys():
        plain, default = (set((f, n) for f, ns in results[k]["by_file"].items() for n in ns)
                          for k in ("reference", "default"))
        print(f"the default path adds {len(default - plain)} functions to the reference one and drops "
              f"{len(plain - default)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
