#!/usr/bin/env bash
# Create .venv with infera-core, every in-repo plugin (editable) and the dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v uv >/dev/null 2>&1; then
  "$PY" -m pip install -q uv
fi
if [ ! -x .venv/bin/python ]; then
  uv venv -q .venv -p "$PY"
fi
plugins=()
for d in plugins/*/ examples/*/; do
  [ -f "$d/pyproject.toml" ] && plugins+=(-e "$d")
done
uv pip install -q -p .venv/bin/python -e . "${plugins[@]}" -r requirements-dev.txt
echo "dev environment ready: .venv"
