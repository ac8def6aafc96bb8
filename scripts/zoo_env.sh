#!/usr/bin/env bash
# Export the model zoo (tests/zoo, benchmarks/bench_zoo.py) from a throw-away torch venv.
#
#   bash scripts/zoo_env.sh          # the fast subset (what CI tests), into .zoo/
#   bash scripts/zoo_env.sh --full   # every model of scripts/export_zoo.py
#
# torch + torchvision are ~5.6 GB installed: they go into their own venv (.zoo-venv, or $ZOO_VENV),
# never into trtq's, and the venv is deleted afterwards, whatever happened. Any failure prints one
# line and exits 0, so CI goes on: without a zoo the zoo tests skip, with one reason.
set -u
cd "$(dirname "$0")/.." || exit 0
venv=${ZOO_VENV:-.zoo-venv}
out=${ZOO_OUT:-.zoo}
mode=--fast
[ "${1:-}" = "--full" ] && mode=
log=$(mktemp "${TMPDIR:-/tmp}/zoo_env.XXXXXX") || { echo "zoo_env: no temp file; the zoo tests will skip"; exit 0; }
cleanup() { rm -rf "$venv" "$log"; }
trap cleanup EXIT
fail() {
    local last
    last=$(grep -v '^\s*$' "$log" 2>/dev/null | tail -n 1 | cut -c1-200)
    echo "zoo_env: $1${last:+ ($last)}; the zoo tests will skip"
    exit 0
}
start=$(date +%s)
python3 -m venv "$venv" >"$log" 2>&1 || fail "cannot create the venv $venv"
timeout 1800 "$venv/bin/python" -m pip install -q torch==2.14.1 torchvision==0.29.1 timm onnx onnxscript onnxruntime \
    >"$log" 2>&1 || fail "pip install of torch/torchvision/timm/onnx/onnxscript/onnxruntime failed"
timeout 1800 "$venv/bin/python" scripts/export_zoo.py $mode --out "$out" >"$log" 2>&1 \
    || fail "scripts/export_zoo.py $mode did not export every model"
echo "zoo_env: $(tail -n 1 "$log") ($(( $(date +%s) - start )) s with the venv)"
