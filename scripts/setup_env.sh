#!/usr/bin/env bash
# Create ./.venv for the workbench (idempotent).
#  * GPU machine whose python already has a CUDA torch: the venv reuses it (--system-site-packages),
#    so the user's CUDA build is kept.
#  * CPU machine: the CPU wheel torch==2.13.0 is installed first and pinned, so nothing pulls CUDA.
#  * WORKBENCH_EXTRAS (default: none) names the pip extras installed with the package: `make demo` needs none
#    (the runtime only: a cold set-up is the demo's budget too), `make docs` asks for dev (Sphinx), `make test` for
#    dev,team (pytest, Sphinx, and the team tools' PostgreSQL server and driver, optuna-dashboard, MLflow, W&B).
#    Each set of extras has its own stamp, so a venv made by `make demo` gets the others added by the first
#    `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV=.venv
EXTRAS="${WORKBENCH_EXTRAS:-}"
STAMP="$VENV/.workbench-installed-${EXTRAS//,/-}"
TARGET="."; [[ -n "$EXTRAS" ]] && TARGET=".[$EXTRAS]"
if [[ -f "$STAMP" && "$STAMP" -nt pyproject.toml ]]; then exit 0; fi

if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "[setup] CUDA torch found in $PY: keeping it (venv with system site packages)"
  [[ -d "$VENV" ]] || "$PY" -m venv --system-site-packages "$VENV"
  TORCH_PIN=""
else
  [[ -d "$VENV" ]] || "$PY" -m venv "$VENV"
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "[setup] installing CPU torch==2.13.0"
    "$VENV/bin/pip" install -q "torch==2.13.0" \
      || "$VENV/bin/pip" install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
  TORCH_PIN="torch==$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
fi
# Pin the installed torch so no dependency can upgrade it (and drag CUDA wheels in).
CONSTRAINTS="$(mktemp)"; echo "$TORCH_PIN" > "$CONSTRAINTS"
echo "[setup] installing workbench${EXTRAS:+[$EXTRAS]}"
"$VENV/bin/pip" install -q -c "$CONSTRAINTS" -e "$TARGET"
rm -f "$CONSTRAINTS"
touch "$STAMP"
echo "[setup] environment ready in $VENV"
