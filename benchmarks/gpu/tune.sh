#!/bin/sh
# GPU host, issue 34: `trtq build --tune-placement` on one model (FP16 for the layers left float, as
# the engine table's trtq rows), then, with IMPLICIT=1, TensorRT's implicit INT8 engine from the same
# cache, both timed in one `trtq bench`. Run from the repository root once the bundle is staged:
#   NAME=det MODEL=m.onnx CACHE=m.cache DATA=pages PREPROCESS=imagenet [SHAPE="--shape x=1x3x640x640"] \
#   [CONFIG=run.yaml instead of DATA/PREPROCESS] [BUILDS=8] [OPT=0] [IMPLICIT=1] [LIMIT=N] sh benchmarks/gpu/tune.sh
# Results (build JSON with the search in metadata.tuning, logs, bench JSON) in /tmp/tune-out/$NAME,
# and with $OUT set as $OUT/$NAME.tgz and $OUT/$NAME.txt (the build's text report and the bench table).
set -e
: "${NAME:?}" "${MODEL:?}" "${CACHE:?}"
PY=${PY:-/opt/trtq-rig/bin/python}
export PYTHONPATH=/opt/trtq-rig/site39${PYTHONPATH:+:$PYTHONPATH}
O=/tmp/tune-out/$NAME; mkdir -p "$O"
OPT=${OPT:-0}
data="--data $DATA --preprocess ${PREPROCESS:-imagenet}"; [ "$PREPROCESS" = none ] && data="--data $DATA"  # .npy
[ -n "$CONFIG" ] && data="--config $CONFIG"
limit=""; [ -n "$LIMIT" ] && limit="--limit $LIMIT"
$PY -m trtq build --model "$MODEL" --cache "$CACHE" $data $SHAPE $limit --fp16 --tune-placement \
    --tune-builds "${BUILDS:-8}" --optimization-level "$OPT" -o "$O/tuned.plan" --json \
    > "$O/tuned.json" 2> "$O/tuned.log" || echo "tune rc $?" | tee -a "$O/failures.txt"
$PY -c "import json, sys; sys.path.insert(0, '.'); from trtq.cli.text import tuning_text; \
print(tuning_text(json.load(open('$O/tuned.json'))['metadata']['tuning']))" > "$O/report.txt" 2>&1 || true
plans="$O/tuned.plan"
if [ -n "$IMPLICIT" ]; then
  $PY -m trtq build --model "$MODEL" --cache "$CACHE" $SHAPE --mode implicit --fp16 --optimization-level "$OPT" \
      -o "$O/implicit.plan" --json > "$O/implicit.json" 2> "$O/implicit.log" || echo "implicit rc $?" | tee -a "$O/failures.txt"
  [ -f "$O/implicit.plan" ] && plans="$plans $O/implicit.plan"
fi
[ -f "$O/tuned.plan" ] && $PY -m trtq bench --duration "${DURATION:-3}" $plans >> "$O/report.txt" 2>&1
cat "$O/report.txt"
if [ -n "$OUT" ]; then
  tar czf "$OUT/$NAME.tgz" -C "$O" --exclude='*.plan' . && cp "$O/report.txt" "$OUT/$NAME.txt"
fi
