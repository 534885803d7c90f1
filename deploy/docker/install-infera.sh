#!/bin/sh
# install-infera.sh WHEEL_DIR DIST==VERSION...  (engine images; runs as root at build time)
# Infera goes into its own venv (INFERA_VENV, default /opt/infera) made with the base image's
# python3, so the vendor's engine environment stays exactly as shipped; the distributions
# come from WHEEL_DIR (built from this repo), their dependencies from the package index.
# /usr/local/bin/infera-engine-python points at that python3: the launcher starts the engine
# with it (INFERA_ENGINE_PYTHON), not with the venv's.
set -eu
[ "$#" -ge 2 ] || { echo "usage: install-infera.sh WHEEL_DIR DIST==VERSION..." >&2; exit 2; }
wheels=$1
shift
venv=${INFERA_VENV:-/opt/infera}
engine_python=$(command -v python3)
ln -sf "$engine_python" /usr/local/bin/infera-engine-python
"$engine_python" -m venv --without-pip "$venv"
"$engine_python" -m pip --python "$venv/bin/python" install --no-cache-dir --find-links "$wheels" "$@"
"$venv/bin/infera-run" --version
