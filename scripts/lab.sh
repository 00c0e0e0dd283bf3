#!/usr/bin/env bash
# Open the minillm course in JupyterLab: set up what is missing, then `minillm lab`.
#   bash scripts/lab.sh                  # opens a browser on notebooks/README.ipynb
#   bash scripts/lab.sh --no-browser     # only prints the URL (with its token)
#   bash scripts/lab.sh --port 8888      # a fixed port instead of a free one
#   bash scripts/lab.sh --lang zh        # the Chinese edition: opens notebooks/zh/README.ipynb (中文版)
# Any option is passed to `minillm lab` (see `.venv/bin/minillm lab --help`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
exec "${MINILLM_VENV:-$ROOT/.venv}/bin/minillm" lab "$@"
