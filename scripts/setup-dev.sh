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
for d in native/*/ plugins/*/ examples/*/; do
  [ -f "$d/pyproject.toml" ] && plugins+=(-e "$d")
done
# bytecode up front: with PYTHONDONTWRITEBYTECODE set (as on our machines) every process
# would otherwise recompile each module it imports (~1.2 s more per `infera-run` start)
uv pip install -q --compile-bytecode -p .venv/bin/python -e . "${plugins[@]}" -r requirements-dev.txt
.venv/bin/python -m compileall -q -j 0 infera_core plugins examples >/dev/null
echo "dev environment ready: .venv"
