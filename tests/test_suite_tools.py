"""The suite's own tools: tests/suite_cpu.py's per-file record turned into the costs that
tests/suite_order.py hands the files out by (heaviest first, tests/browser/ as one unit)."""

from __future__ import annotations

import json

import suite_cpu
import suite_order


def test_a_record_becomes_the_costs_the_scheduler_orders_by(tmp_path):
    rows = [("tests/test_a.py::t1", 3.0), ("tests/test_a.py::t2", 4.5), ("tests/browser/test_x.py::t", 20.0),
            ("tests/browser/test_y.py::t", 30.0), ("tests/test_tiny.py::t", 0.2), ("tests/test_b.py::t", 9.0)]
    lines = [{"kind": "start", "cpu": 0, "time": 0}]
    lines += [{"kind": "test", "nodeid": n, "cpu": c, "wall": c, "idle": 0.0, "t0": i} for i, (n, c) in enumerate(rows)]
    (tmp_path / "1.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    out = tmp_path / "costs.json"
    costs = suite_cpu.save_costs(tmp_path, out)
    assert costs == {"tests/browser": 50.0, "tests/test_b.py": 9.0, "tests/test_a.py": 7.5}  # < 1 s left out
    assert list(json.loads(out.read_text())["cpu_s"]) == list(costs)
    assert "tests/test_a.py" in suite_cpu.table(tmp_path)


def test_the_committed_costs_load_and_unlisted_files_count_per_test():
    assert suite_order.COST and all(v > 0 for v in suite_order.COST.values())
    assert all((suite_order.REPO / k).exists() for k in suite_order.COST), "a listed file no longer exists"
    assert suite_order.cost("tests/test_not_listed.py", 30) == 30 * suite_order.PER_TEST
    assert suite_order.scope_of("tests/browser/test_lab_ui.py::test_x[1]") == "tests/browser"
