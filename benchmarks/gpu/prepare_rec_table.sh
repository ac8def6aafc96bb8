#!/bin/sh
# CPU side of the PP-OCRv4 rec row of issue 34's engine table (benchmarks/gpu/engines.sh): the FP32
# model fixed at 8x3x48x320, trtq's mse cache for TensorRT 8.6.0 from the 64 calibration lines of
# bench_rec_lines.py (seed 0), NVIDIA ModelOpt 0.47's INT8 PTQ on the same lines, and the 200
# evaluation lines (seed 1) the task metric (ctc: lines decoded as FP32 decodes them) is read on,
# in STAGE/e/ocr_rec (~22 MB, one transfer):
#   sh benchmarks/gpu/prepare_rec_table.sh [STAGE]   (default .gpu-stage; needs pip install --no-deps
#   rapidocr-onnxruntime cvttf-notosanscjk-regular, and nvidia-modelopt 0.47 with CPU onnxruntime)
# Then on the GPU host (bundle staged, the folder copied to S):
#   NAME=rec MODEL=$S/model.onnx CACHE=$S/mse.cache MODELOPT=$S/modelopt.onnx PAGES=$S/reclines.npy \
#   PREPROCESS=none COMPARE_ARGS="--task ctc --batch-size 8" BUILDS=3 DEADLINE=300 sh benchmarks/gpu/engines.sh
set -e
STAGE=${1:-.gpu-stage}/e/ocr_rec
W=${BENCH_WORK:-.bench}/rec-table
TRTQ=${TRTQ:-python -m trtq}
mkdir -p $STAGE $W
M=$(python -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_rec_lines as B; \
print(B._package_file('rapidocr_onnxruntime', 'models/ch_PP-OCRv4_rec_infer.onnx'))")
python - "$M" "$W" "$STAGE" <<'PY'
import sys
import numpy as np
import onnx
sys.path.insert(0, "benchmarks")
import bench_rec_lines as B
model, work, stage = sys.argv[1:4]
font = B._package_file("cvttf_NotoSansCJK_Regular", "NotoSansCJKtc-Regular.otf")
m = onnx.load(model)
meta = {p.key: p.value for p in m.metadata_props}
chars = [c for c in meta.get("character", "").split("\n") if len(c) == 1 and 0x4E00 <= ord(c) <= 0x9FFF]
np.save(f"{stage}/reclines.npy", B.render(chars, font, 200, seed=1))
np.save(f"{work}/calib.npy", B.render(chars, font, 64, seed=0))
for d, v in zip(m.graph.input[0].type.tensor_type.shape.dim, (8, 3, 48, 320)):  # the table's shape
    d.Clear()
    d.dim_value = v
onnx.save(m, f"{stage}/model.onnx")
PY
$TRTQ calibrate --model $STAGE/model.onnx --data $W/calib.npy --trt-version 8.6.0 -o $STAGE/mse.cache -q
python - $STAGE/model.onnx $W/calib.npy $STAGE/modelopt.onnx <<'PY'
import shutil
import sys
import tempfile
from pathlib import Path
import numpy as np
import onnx
import modelopt.onnx.quantization as q
model, npy, out = sys.argv[1:4]
with tempfile.TemporaryDirectory() as tmp:  # ModelOpt rewrites the file it reads: it gets a copy
    copy = str(Path(tmp) / Path(model).name)
    shutil.copyfile(model, copy)
    name = onnx.load(copy, load_external_data=False).graph.input[0].name
    x = np.load(npy)
    q.quantize(copy, quantize_mode="int8", calibration_data={name: x[: len(x) // 8 * 8]}, calibration_eps=["cpu"],
               output_path=out, log_level="ERROR")
PY
du -sh $STAGE
