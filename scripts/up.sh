#!/usr/bin/env bash
# Set up the dev environment (first run only) and start the embedded stack.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-dev.sh >/dev/null
exec .venv/bin/infera-run plugins "$@"
