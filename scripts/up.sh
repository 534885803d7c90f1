#!/usr/bin/env bash
# Set up the dev environment (first run only) and start the embedded stack:
# discovery, the server and 4 sim workers on http://127.0.0.1:8000/v1 (Ctrl-C stops it).
# Any infera-run up flags pass through, e.g. `bash scripts/up.sh --workers 2 --demo -- --speedup 10`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-dev.sh >/dev/null
exec .venv/bin/infera-run up "$@"
