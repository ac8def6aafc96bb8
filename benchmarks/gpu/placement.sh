#!/bin/sh
# GPU host: standard vs fused Q/DQ placement (trtq quantize --placement) on TensorRT, run from the
# repository root after the bundle is staged as for steps.sh and benchmarks/gpu/prepare_placement.sh
# wrote STAGE (default .gpu-stage/p; carry it, ~21 MB):
#   sh benchmarks/gpu/placement.sh yolo [STAGE]    YOLOv8n DocLayNet, batch 1
#   sh benchmarks/gpu/placement.sh zoo [STAGE]     shufflenet_v2_x0_5 and unet_small, batch 64 at 64x64
# Per model and placement: the Q/DQ file (quantize on this host), BUILDS (default 2) engine builds
# at optimization level OPT (default 0) with --fp16 and --json, each build's int8_coverage (share
# of layers and of profiled time in INT8, conversions, reformats, float fallbacks), one trtq bench
# run of all plans (medians side by side) and, for YOLO, detection F1 vs FP32 ONNX Runtime on the
# staged pages (first build of each). Results and logs under $OUT (else /tmp/placement-out).
set -e
what=${1:-yolo}; S=${2:-.gpu-stage/p}; PY=${PY:-/opt/trtq-rig/bin/python}
export PYTHONPATH=/opt/trtq-rig/site39${PYTHONPATH:+:$PYTHONPATH}
O=${OUT:-/tmp/placement-out}; W=/tmp/placement; mkdir -p $O $W
BUILDS=${BUILDS:-2}; OPT=${OPT:-0}
case $what in
  yolo) models="yolov8n-doclaynet";;
  zoo) models="shufflenet_v2_x0_5 unet_small";;
  *) echo "usage: placement.sh yolo|zoo [STAGE]" >&2; exit 2;;
esac
plans=""
for name in $models; do
  if [ $what = yolo ]; then cache=$S/yolo.mse.cache; shape=""; else cache=$S/$name.mse.cache; shape="--override-input-shape input=64x3x64x64"; fi
  for p in standard fused; do
    $PY -m trtq quantize --model $S/$name.onnx --cache $cache --placement $p -o $W/$name.$p.qdq.onnx -q
    for b in $(seq 1 $BUILDS); do
      $PY -m trtq build --model $W/$name.$p.qdq.onnx --fp16 --optimization-level $OPT $shape \
          -o $W/$name.$p.$b.plan --json > $O/$name.$p.$b.build.json 2> $O/$name.$p.$b.build.log &
      plans="$plans $W/$name.$p.$b.plan"
    done
  done
done
wait
$PY -m trtq bench --duration 3 --json $plans > $O/$what-bench.json 2> $O/$what-bench.log || echo "bench rc $?"
if [ $what = yolo ]; then
  for p in standard fused; do
    $PY -m trtq compare --reference $S/yolov8n-doclaynet.onnx --candidate $W/yolov8n-doclaynet.$p.1.plan \
        --data $S/ypages --preprocess yolo > $O/yolo-$p-compare.txt 2>&1 || echo "compare $p rc $?"
    echo "$p: $(grep -E 'detection F1' $O/yolo-$p-compare.txt | head -1)"
  done
fi
$PY benchmarks/gpu/placement_table.py $O $O/$what-bench.json $plans | tee $O/$what-table.txt
