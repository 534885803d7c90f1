#!/bin/sh
# install-infera.sh WHEEL_DIR DIST==VERSION...  (engine images; runs as root at build time)
# Infera goes into its own venv (INFERA_VENV, default /opt/infera) made with the base image's
# python3, so the vendor's engine environment stays exactly as shipped. Each DIST==VERSION
# is installed from its wheel (or sdist: infera-kv-native, a C extension compiled here for
# the base's Python, pure Python without a compiler) in WHEEL_DIR, built from this repo
# (never a same-named package from an index), its dependencies from the package index, with uv when the base
# image has it, else pip (the Dockerfiles set UV_NO_CACHE and PIP_NO_CACHE_DIR). INFERA_ENGINE_PYTHON_LINK (default
# /usr/local/bin/infera-engine-python) then points at that python3: the launcher starts the
# engine with it (INFERA_ENGINE_PYTHON), not with the venv's.
set -eu
[ "$#" -ge 2 ] || { echo "usage: install-infera.sh WHEEL_DIR DIST==VERSION..." >&2; exit 2; }
wheels=$1
shift
venv=${INFERA_VENV:-/opt/infera}
link=${INFERA_ENGINE_PYTHON_LINK:-/usr/local/bin/infera-engine-python}
engine_python=$(command -v python3)
files=""
for spec in "$@"; do
  name=$(printf '%s' "${spec%%==*}" | tr - _)
  version=${spec#*==}
  file=$(find "$wheels" -maxdepth 1 \( -name "${name}-${version}-*.whl" -o -name "${name}-${version}.tar.gz" \) | head -n 1)
  [ -n "$file" ] || { echo "install-infera.sh: no wheel or sdist for $spec in $wheels" >&2; exit 1; }
  files="$files $file"
done
"$engine_python" -m venv --without-pip "$venv"
# shellcheck disable=SC2086 # $files: wheel paths without spaces, split on purpose
if command -v uv >/dev/null 2>&1; then
  uv pip install --python "$venv/bin/python" $files
else
  "$engine_python" -m pip --python "$venv/bin/python" install $files
fi
ln -sf "$engine_python" "$link"
"$venv/bin/infera-run" --version
