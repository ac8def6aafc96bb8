#!/bin/sh
# GPU host side of the engine accuracy table; run from the repo root after staging (device tool):
#   bundle parts .gpu-bundle/00..09, then .gpu-stage/m, ev, c, q1..q4 (benchmarks/gpu/prepare.sh),
#   each copied with `cp -r FOLDER/* /tmp/stage/`, then `sh /tmp/stage/finish.sh`.
#   sh /tmp/stage/steps.sh STEP [ARGS]      results and logs under $OUT
# Steps (each fits the 10-minute call limit; plans are kept in /tmp/eng and copied to $OUT, so a
# lost machine can be given them back by staging $OUT/plans-K as /tmp/stage/plans-K):
#   tests                        the GPU test suite
#   refs K                       K = e (torchscript export) or d (dynamo): TensorRT's own calibration
#                                (EntropyCalibration2, 160 crops) + the implicit INT8 engine, ~230-300 s
#   qdq K NAME...                explicit engines of /tmp/stage/K.NAME.qdq.onnx, 27-40 s each
#   bench K NAME...              latency (3 runs) + top-1/SQNR on 2000 crops next to ONNX Runtime, ~250 s
#   layers K NAME...             trtq bench --layers: per-layer time and precision of the implicit engine
#                                and each named explicit one (built before), ~20 s per plan
#   shard                        benchmarks/bench_shard.py on this host's cores
#   yolo                         YOLOv8n DocLayNet (stage .gpu-stage/y: the model, trtq's mse cache and
#                                Q/DQ model, 64 rendered pages): FP16, explicit and implicit INT8 engines,
#                                detection F1 against FP32 ONNX Runtime (trtq compare), latency, ~3 min
#                                at YOLO_OPT=0 (the default; builds at level 3 do not fit a call)
#   rec                          PP-OCRv4 rec (stage .gpu-stage/r1-r4: benchmarks/gpu/prepare_rec.sh): FP16
#                                and five explicit INT8 engines at 8x3x48x320, sequence agreement with FP32
#                                ONNX Runtime on 200 Chinese lines (trtq compare --task ctc), latency
S=/tmp/stage; E=/tmp/eng; PY=/opt/trtq-rig/bin/python
export PYTHONPATH=/opt/trtq-rig/site39${PYTHONPATH:+:$PYTHONPATH}  # for subprocesses started with sys.executable
mkdir -p $E/e $E/d "$OUT"
for k in e d; do [ -d $S/plans-$k ] && cp -n $S/plans-$k/* $E/$k/; done
model() { [ "$1" = e ] && echo $S/efficientnet_lite0.onnx || echo $S/efficientnet_lite0_dynamo.onnx; }
common() { echo --model $(model $1) --config $S/run.yaml --calib $S/calib512 --eval $S/eval2000 --opt-level 3 --calib-images 160 --no-fp16 --out $E/$1; }
qdqs() { k=$1; shift; for n in "$@"; do echo --qdq $n=$S/$k.$n.qdq.onnx; done; }
step=$1; shift
case $step in
  tests)
    $PY -m pytest -m gpu tests -q -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1; echo "rc $?"; tail -3 "$OUT/gpu-tests.log";;
  refs)
    k=$1; $PY benchmarks/bench_engines.py $(common $k) --reuse --build-only > "$OUT/refs-$k.log" 2>&1; echo "rc $?"
    tail -3 "$OUT/refs-$k.log"; mkdir -p $OUT/plans-$k; cp $E/$k/* $OUT/plans-$k/;;
  qdq)
    k=$1; shift; $PY benchmarks/bench_engines.py $(common $k) --reuse --build-only --no-reference $(qdqs $k "$@") \
        > "$OUT/qdq-$k-$1.log" 2>&1; echo "rc $?"; tail -4 "$OUT/qdq-$k-$1.log"
    mkdir -p $OUT/plans-$k; for n in "$@"; do cp $E/$k/$n.plan* $OUT/plans-$k/; done;;
  bench)
    k=$1; shift; $PY benchmarks/bench_engines.py $(common $k) --reuse --repeats 3 --duration 2 --eval-images 2000 \
        --no-int8-kernels $(qdqs $k "$@") > "$OUT/bench-$k.log" 2>&1; echo "rc $?"
    cp $E/$k/bench_engines.json "$OUT/bench-$k.json"; tail -14 "$OUT/bench-$k.log";;
  layers)
    k=$1; shift; plans=$E/$k/int8-implicit.plan; for n in "$@"; do plans="$plans $E/$k/$n.plan"; done
    $PY -m trtq bench --duration 1 --layers 45 $plans > "$OUT/layers-$k.txt" 2>&1; echo "rc $?"
    $PY -m trtq bench --duration 1 --layers --json $plans > "$OUT/layers-$k.json" 2>/dev/null; head -5 "$OUT/layers-$k.txt";;
  shard)
    $PY benchmarks/bench_shard.py --work /tmp/shardwork --samples 4096 --shards 4,8,16 --method entropy "$@" \
        > "$OUT/shard.log" 2>&1; echo "rc $?"; tail -12 "$OUT/shard.log";;
  yolo)
    # builds in parallel at YOLO_OPT (default 0): at TensorRT's default level 3 the FP16 build took
    # 455 s and the INT8 ones did not finish in 16 minutes on an H200 (level 2: 227 / 333 s)
    M=$S/yolov8n-doclaynet.onnx; Y=/tmp/eng/y; O="--opt-level ${YOLO_OPT:-0}"; mkdir -p $Y
    [ -f $Y/fp16.plan ] || $PY -m trtq build --model $M --precision fp16 $O -o $Y/fp16.plan -q &
    [ -f $Y/explicit.plan ] || $PY -m trtq build --model $S/yolo.mse.qdq.onnx --fp16 $O -o $Y/explicit.plan -q &
    [ -f $Y/implicit.plan ] || $PY -m trtq build --model $M --cache $S/yolo.mse.cache --mode implicit --fp16 $O \
        -o $Y/implicit.plan -q &
    wait
    for e in fp16 explicit implicit; do
      $PY -m trtq compare --reference $M --candidate $Y/$e.plan --data $S/ypages --preprocess yolo \
          > "$OUT/yolo-$e.txt" 2>&1; echo "$e rc $?"; grep -E "detection F1|detections" "$OUT/yolo-$e.txt"
    done
    $PY -m trtq compare --reference $M --candidate $S/yolo.mse.qdq.onnx --data $S/ypages --preprocess yolo \
        > "$OUT/yolo-qdq-ort.txt" 2>&1; grep "detection F1" "$OUT/yolo-qdq-ort.txt"
    $PY -m trtq bench --duration 3 $Y/fp16.plan $Y/implicit.plan $Y/explicit.plan > "$OUT/yolo-bench.txt" 2>&1
    echo "bench rc $?"; tail -6 "$OUT/yolo-bench.txt";;
  rec)
    # PP-OCRv4 rec (stage .gpu-stage/r1 to r4 from benchmarks/gpu/prepare_rec.sh): an FP16 engine
    # and explicit INT8 engines of the Q/DQ models (mse, gptq + 16 float layers, each also with
    # --equalize: emse, egbf16; and --equalize + gptq + 24 float layers: egbf24), all at 8x3x48x320 and
    # REC_OPT (default 0: at level 3 the three parallel builds did not finish in a 10-minute call;
    # level 0 took 170 s with the scoring); sequence agreement with FP32 ONNX Runtime on 200 lines
    M=$S/rec.onnx; R=/tmp/eng/r; O="--opt-level ${REC_OPT:-0} --override-input-shape x=8x3x48x320"; mkdir -p $R
    [ -f $R/fp16.plan ] || $PY -m trtq build --model $M --precision fp16 $O -o $R/fp16.plan -q > $OUT/rec-build-fp16.log 2>&1 &
    for n in mse gbf16 emse egbf16 egbf24; do
      [ -f $R/$n.plan ] || $PY -m trtq build --model $S/rec.$n.qdq.onnx --fp16 $O -o $R/$n.plan > $OUT/rec-build-$n.log 2>&1 &
    done
    wait
    for e in fp16 mse gbf16 emse egbf16 egbf24; do
      $PY -m trtq compare --reference $M --candidate $R/$e.plan --data $S/reclines.npy --task ctc --batch-size 8 \
          > "$OUT/rec-$e.txt" 2>&1; echo "$e rc $?"; grep -E "sequence agreement" "$OUT/rec-$e.txt" | head -1
    done
    for n in mse gbf16 emse egbf16 egbf24; do
      $PY -m trtq compare --reference $M --candidate $S/rec.$n.qdq.onnx --data $S/reclines.npy --task ctc --batch-size 8 \
          > "$OUT/rec-$n-ort.txt" 2>&1; echo "$n ORT rc $?"; grep -E "sequence agreement" "$OUT/rec-$n-ort.txt" | head -1
    done
    $PY -m trtq bench --duration 3 $R/fp16.plan $R/mse.plan $R/gbf16.plan $R/emse.plan $R/egbf16.plan $R/egbf24.plan > "$OUT/rec-bench.txt" 2>&1
    echo "bench rc $?"; tail -5 "$OUT/rec-bench.txt";;
  *) echo "unknown step $step"; exit 2;;
esac
