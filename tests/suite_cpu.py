"""Where the suite's time goes, in CPU seconds and idle seconds per test: an opt-in pytest plugin.

    bash scripts/test.sh -p tests.suite_cpu                 # writes $MINILLM_SUITE_CPU (default
                                                      #   $MINILLM_ARTIFACTS/suite-cpu)/<pid>.jsonl
    python tests/suite_cpu.py /tmp/minillm-artifacts/suite-cpu   # the table, by file, heaviest first
    python tests/suite_cpu.py DIR --save-costs    # ... and write them to tests/suite_costs.json, the
                                                  #   order tests/suite_order.py hands the files out in

Wall time on a shared machine says little; CPU time does not depend on who else is running.
For each test this records the CPU seconds of the pytest process and of everything it started
(notebook kernels, servers, browsers; live or already reaped), and the seconds in which none of
those processes wanted a CPU ("idle": sleeps, timeouts, waiting on a socket). On a quiet machine
with two workers, the suite's wall time is about (CPU + idle) / 2 when the workers finish
together. tests/suite_order.py orders the files by these CPU seconds.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

SAMPLE_S = 0.2  # how often the idle sampler looks at the process tree


def _out_dir() -> Path:
    default = Path(os.environ.get("MINILLM_ARTIFACTS", "/tmp/minillm-artifacts")) / "suite-cpu"
    return Path(os.environ.get("MINILLM_SUITE_CPU", default))


class _Tree:
    """This process and its descendants, read with psutil."""

    def __init__(self):
        import psutil

        self.psutil = psutil
        self.me = psutil.Process()
        self.sampler_tid = None

    def processes(self):
        try:
            return [self.me, *self.me.children(recursive=True)]
        except self.psutil.Error:
            return [self.me]

    def cpu(self) -> float:
        total = 0.0
        for p in self.processes():
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except self.psutil.Error:
                pass
        return total

    def wants_cpu(self) -> bool:
        """True if a thread of the tree (other than the sampler) is running or runnable."""
        for p in self.processes():
            for tid in _threads(p.pid):
                if tid != self.sampler_tid and _state(p.pid, tid) == "R":
                    return True
        return False


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _state(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


class SuiteCpu:
    def __init__(self):
        self.tree = _Tree()
        out = _out_dir()
        out.mkdir(parents=True, exist_ok=True)
        self.file = open(out / f"{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - closed at the end
        self.samples = self.idle_samples = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        threading.Thread(target=self._sample, name="suite_cpu", daemon=True).start()
        self._write(kind="start", cpu=self.tree.cpu(), time=time.time())

    def _sample(self):
        self.tree.sampler_tid = threading.get_native_id()
        while not self.stop.wait(SAMPLE_S):
            idle = not self.tree.wants_cpu()
            with self.lock:
                self.samples += 1
                self.idle_samples += idle

    def _write(self, **row):
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        with self.lock:
            self.samples = self.idle_samples = 0
        cpu0, t0 = self.tree.cpu(), time.time()
        yield
        wall = time.time() - t0
        with self.lock:
            idle = wall * self.idle_samples / self.samples if self.samples else 0.0
        self._write(kind="test", nodeid=item.nodeid, cpu=self.tree.cpu() - cpu0, wall=wall, idle=idle, t0=t0)

    def pytest_sessionfinish(self, session):
        self.stop.set()
        self._write(kind="end", cpu=self.tree.cpu(), time=time.time())
        self.file.close()


def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist") \
            and config.getoption("numprocesses", None):
        return  # the xdist controller runs no test: only its workers measure
    config.pluginmanager.register(SuiteCpu(), "suite_cpu_recorder")


def table(folder: Path) -> str:
    """Per file: CPU s, idle s, wall s, tests; heaviest first; then each worker's totals."""
    files: dict = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    workers = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        tests = [r for r in rows if r["kind"] == "test"]
        if not tests:
            continue
        for r in tests:
            f = files[r["nodeid"].split("::", 1)[0]]
            f[0] += r["cpu"]
            f[1] += r.get("idle", 0.0)
            f[2] += r["wall"]
            f[3] += 1
        span = tests[-1]["t0"] + tests[-1]["wall"] - tests[0]["t0"]
        workers.append((path.stem, sum(r["cpu"] for r in tests), sum(r.get("idle", 0) for r in tests), span))
    lines = [f"{'file':58s} {'CPU s':>8s} {'idle s':>8s} {'wall s':>8s} {'tests':>6s}"]
    for name, (cpu, idle, wall, n) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{name:58s} {cpu:8.1f} {idle:8.1f} {wall:8.1f} {n:6d}")
    cpu, idle = sum(f[0] for f in files.values()), sum(f[1] for f in files.values())
    lines.append(f"{'all tests':58s} {cpu:8.1f} {idle:8.1f}")
    for pid, c, i, span in workers:
        lines.append(f"worker {pid}: CPU {c:.1f} s, idle {i:.1f} s, first test to last {span:.1f} s")
    return "\n".join(lines)


def save_costs(folder: Path, costs_file: Path) -> dict[str, float]:
    """Write the CPU seconds per unit (a file, or tests/browser) that tests/suite_order.py hands out
    heaviest first; units under 1 s are left out (they count 0.1 s per test there)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from suite_order import scope_of

    units: dict = defaultdict(float)
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("kind") == "test":
                units[scope_of(row["nodeid"])] += row["cpu"]
    if not units:
        raise SystemExit(f"no test records under {folder}")
    costs = {k: round(v, 1) for k, v in sorted(units.items(), key=lambda kv: -kv[1]) if v >= 1}
    note = ("CPU seconds per file (tests/browser/ is one unit), from `python tests/suite_cpu.py DIR --save-costs`"
            f" on a whole-suite record ({time.strftime('%Y-%m-%d', time.gmtime())}); only their order matters")
    costs_file.write_text(json.dumps({"note": note, "cpu_s": costs}, indent=1, ensure_ascii=False) + "\n")
    return costs


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--save-costs"]
    folder = Path(args[0]) if args else _out_dir()
    print(table(folder))
    if "--save-costs" in sys.argv:
        target = Path(__file__).resolve().parent / "suite_costs.json"
        print(f"wrote {len(save_costs(folder, target))} costs to {target}")
