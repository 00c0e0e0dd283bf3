"""``scripts/gpu_check.sh --dry-run``: the GPU check's plan run on the CPU (float32, tiny
sizes), so the first minutes of a lent GPU are not spent finding out the script is broken.
Every part must be reached and end "ok", and the report must hold each part's numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PARTS = ("env", "parity", "flex", "sync_sampler", "graphs", "bench")


#: what the GPU machine's python3 does not have: the dry run must not need any of them
ABSENT_ON_THE_GPU_MACHINE = ("fastapi", "uvicorn", "ipywidgets", "nbval", "matplotlib", "jupyterlab")

BLOCKER = """
import importlib.abc, sys
ABSENT = {absent!r}
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU machine)")
        return None
sys.meta_path.insert(0, Absent())
"""


def test_dry_run_reaches_every_part_and_writes_one_report(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(absent=ABSENT_ON_THE_GPU_MACHINE))
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "MINILLM_GPU_CHECK_SCALE": "0.05",
           "MINILLM_DRY_RUN_SLACK": "6",  # a shared CPU is slow: the limits here are the GPU's x 6
           "PYTHONPATH": str(site)}  # (the script puts the tree first)
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True)
    report = json.loads((out / "gpu_check.json").read_text())
    assert done.returncode == 0, (done.stdout[-3000:], {k: p.get("error") for k, p in report["parts"].items()})
    assert report["status"] == "ok" and tuple(report["parts"]) == PARTS
    parts = report["parts"]
    assert all(p["status"] == "ok" and p["device"] == "cpu" for p in parts.values())
    assert parts["env"]["auto_backend"] in ("gather", "kernel") and "flex" in parts["env"]["backends"]
    assert parts["env"]["minillm"].startswith(str(REPO))  # the tree's, not an installed copy
    assert all(parts["env"]["packages"][name] is None for name in ("fastapi", "uvicorn", "ipywidgets", "nbval"))
    assert parts["parity"]["tests"]["passed"] > 0 and parts["parity"]["tests"]["failed"] == 0
    flex = parts["flex"]["flex_vs_gather"]
    assert flex["eager"]["tokens_equal_gather"] and flex["graphs"]["tokens_equal_gather"]
    kv = parts["flex"]["kv_bytes"]
    assert kv["flex_copied_bytes_per_step"] == 0 and kv["flex_read_bytes_per_step"] <= kv["paged_read_bytes_per_step"]
    assert parts["sync_sampler"]["sampler_host"]["unseeded_shared_noise"]["exponential_launches"] == 1
    assert parts["graphs"]["graphs"]["tokens_equal_eager"] and parts["graphs"]["graphs"]["captured_while_serving"] == 0
    assert parts["bench"]["bench"]["batch_1"]["minillm_tok_s"] > 0


def test_without_a_usable_python_it_says_so_and_installs_nothing(tmp_path):
    env = {**os.environ, "PY": str(tmp_path / "no-python"), "OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          cwd=tmp_path)
    if done.returncode != 2 and "no python" not in done.stdout:
        pytest.skip("this machine's own python3 has a CUDA torch: the check ran instead")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no python with a CUDA torch" in done.stdout
    assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "no python"
