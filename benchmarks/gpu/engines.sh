#!/bin/sh
# GPU host, issue 34's engine table for one model: the implicit INT8 engine from trtq's cache, trtq's
# explicit engine per Q/DQ placement, ModelOpt's explicit engine (its file lowered by build
# --fix-qdq) and FP16, each built BUILDS times at optimization level OPT (one build at a time, all
# in one process: benchmarks/gpu/run_builds.py),
# then one `trtq bench` of every plan (medians side by side) and, with PAGES, detection F1 of
# each variant's first engine against FP32 ONNX Runtime. Run from the repository root after the
# bundle is staged (benchmarks/gpu/steps.sh) and the inputs are copied to the host:
#   NAME=yolo MODEL=m.onnx CACHE=m.cache [MODELOPT=m.modelopt.onnx] [SHAPE="--override-input-shape x=64x3x224x224"] \
#   [PLACEMENTS="standard fused shared"] [PAGES=dir PREPROCESS=yolo (none: PAGES is a .npy) | CONFIG=run.yaml] [COMPARE_ARGS=...] \
#   [ONLY="implicit|fp16"] [BUILDS=3 OPT=0 DURATION=3] [COUNTS="implicit=2 fp16=2"] [DEADLINE=s] [RESUME=1] [TUNED_FROM=tuned.json] \
#   sh benchmarks/gpu/engines.sh
# TUNED_FROM: the --json output of `trtq build --tune-placement` (benchmarks/gpu/tune.sh's tuned.json):
# its kept placement and nodes left float (`trtq quantize --placement-from`, which also reads the
# plan or its .plan.json) become the variant trtq-tuned, built BUILDS times.
# DEADLINE: no build starts after that many seconds of building (the plans built so far are benched
# and scored), so a call under the device's 10-minute limit returns a partial table, not nothing.
# RESUME=1: keep the plans an earlier call on the same (warm) machine built for this NAME and build
# only the missing ones, so two calls finish a table one DEADLINE cut (the table covers all plans).
# A build in its own process took 60-90 s on an H200 (YOLOv8n implicit / FP16; 8 builds passed 470 s);
# in one process 8-17 s after the first for explicit engines (YOLOv8n, EfficientNet-Lite0 b64,
# PP-OCRv4 det at level 0); implicit and FP16 builds stay long (det: 201 s and 90 s). At OPT=3 one
# YOLOv8n explicit build took about 5 minutes and its implicit build more than 5: DEADLINE cannot stop
# a build once started, so leave it room (a call that passes its limit returns nothing).
# Results (build JSON with int8_coverage, logs, bench JSON, compare output, the table) in
# /tmp/engines-out/$NAME, and with $OUT set as $OUT/$NAME.tgz, $NAME.table.txt, $NAME.metric.txt.
set -e
: "${NAME:?}" "${MODEL:?}" "${CACHE:?}"
PY=${PY:-/opt/trtq-rig/bin/python}
export PYTHONPATH=/opt/trtq-rig/site39${PYTHONPATH:+:$PYTHONPATH}
O=/tmp/engines-out/$NAME; W=/tmp/engines/$NAME; mkdir -p "$O" "$W"
BUILDS=${BUILDS:-3}; OPT=${OPT:-0}; PLACEMENTS=${PLACEMENTS:-standard shared}
jobs=$W/jobs.txt; : > "$jobs"
# one line per build: variant, build number, trtq build arguments
for p in $PLACEMENTS; do
  $PY -m trtq quantize --model "$MODEL" --cache "$CACHE" --placement "$p" -o "$W/$p.qdq.onnx" -q
done
if [ -n "$TUNED_FROM" ]; then  # the placement a `build --tune-placement` JSON kept, as variant trtq-tuned
  $PY -m trtq quantize --model "$MODEL" --cache "$CACHE" --placement-from "$TUNED_FROM" -o "$W/tuned.qdq.onnx" -q
  PLACEMENTS="$PLACEMENTS tuned"
fi
for b in $(seq 1 "$BUILDS"); do  # build 1 of every variant first, so a DEADLINE cuts whole rounds
  for p in $PLACEMENTS; do echo "trtq-$p $b --model $W/$p.qdq.onnx --fp16" >> "$jobs"; done
  echo "implicit $b --model $MODEL --cache $CACHE --mode implicit --fp16" >> "$jobs"
  [ -n "$MODELOPT" ] && echo "modelopt $b --model $MODELOPT --fix-qdq --fp16" >> "$jobs"
  echo "fp16 $b --model $MODEL --precision fp16" >> "$jobs"
done
if [ -n "$ONLY" ]; then  # e.g. ONLY="implicit|fp16": those variants alone
  grep -E "^($ONLY) " "$jobs" > "$jobs.only" || true; mv "$jobs.only" "$jobs"
fi
for c in $COUNTS; do  # e.g. COUNTS="implicit=2": fewer builds of a slow variant than BUILDS
  awk -v v="${c%%=*}" -v n="${c#*=}" '$1 != v || $2 <= n' "$jobs" > "$jobs.counts"; mv "$jobs.counts" "$jobs"
done
while read -r v b args; do  # one process runs every build, one after the other (benchmarks/gpu/run_builds.py)
  [ -n "$RESUME" ] && [ -f "$W/$v.$b.plan" ] && continue  # built by an earlier call on this machine
  echo "$v.$b.build build $args --optimization-level $OPT $SHAPE -o $W/$v.$b.plan --json"
done < "$jobs" > "$W/run.txt"
$PY benchmarks/gpu/run_builds.py "$W/run.txt" "$O" ${DEADLINE:+--deadline "$DEADLINE"}
plans=$(ls "$W"/*.plan)
$PY -m trtq bench --duration "${DURATION:-3}" --json $plans > "$O/bench.json" 2> "$O/bench.log" || echo "bench rc $?"
if [ -n "$PAGES" ] || [ -n "$CONFIG" ]; then  # the task metric of each variant's first engine vs FP32 ONNX Runtime
  data="--data $PAGES --preprocess ${PREPROCESS:-yolo}"; [ "$PREPROCESS" = none ] && data="--data $PAGES"
  [ -n "$CONFIG" ] && data="--config $CONFIG"
  for plan in "$W"/*.1.plan; do
    v=$(basename "$plan" .1.plan)
    $PY -m trtq compare --reference "$MODEL" --candidate "$plan" $data $COMPARE_ARGS \
        > "$O/$v.compare.txt" 2>&1 || echo "compare $v rc $?"
    row=$(grep -E -A1 'samples +top-1 agree' "$O/$v.compare.txt" | sed -n 2p)  # the first output's row
    echo "$v: $row $(grep -E 'detection F1' "$O/$v.compare.txt" | head -1)"
  done | tee "$O/metric.txt"
fi
$PY benchmarks/gpu/placement_table.py "$O" "$O/bench.json" $plans | tee "$O/table.txt"
if [ -n "$OUT" ]; then  # few files come back from the host: one archive, and the table
  tar czf "$OUT/$NAME.tgz" -C "$O" . && cp "$O/table.txt" "$OUT/$NAME.table.txt"
  [ -f "$O/metric.txt" ] && cp "$O/metric.txt" "$OUT/$NAME.metric.txt"
fi
