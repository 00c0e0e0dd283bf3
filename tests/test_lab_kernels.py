"""minillm lab does not let finished notebooks' kernels pile up (each holds the engine, ~750 MB):
closing a notebook shuts its kernel down, and the server culls kernels idle with no notebook open."""

from __future__ import annotations

import json

import pytest

from minillm.apps import lab


@pytest.mark.parametrize("lang", lab.LANGS)
def test_closing_a_notebook_shuts_its_kernel_down(lang):
    settings = json.loads((lab.LAB_SETTINGS_DIRS[lang] / "overrides.json").read_text(encoding="utf-8"))
    assert settings["@jupyterlab/notebook-extension:tracker"]["kernelShutdown"] is True


def test_the_server_culls_idle_kernels_of_closed_notebooks(tmp_path):
    cmd = lab.jupyter_command(port=12345, notebook_dir=tmp_path)
    options = dict(a[2:].split("=", 1) for a in cmd if a.startswith("--MappingKernelManager."))
    assert 60 <= int(options["MappingKernelManager.cull_idle_timeout"]) <= 1800
    assert int(options["MappingKernelManager.cull_interval"]) > 0
    # an open notebook keeps its kernel (cull_connected is False unless set)
    assert options.get("MappingKernelManager.cull_connected", "False") == "False"
