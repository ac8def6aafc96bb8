#!/bin/sh
# CPU side of the PP-OCRv4 rec engine rows (benchmarks/README.md, "PP-OCRv4 rec on Chinese text
# lines"): the 200 evaluation lines and 64 calibration lines of bench_rec_lines.py (same seeds),
# trtq's mse cache for TensorRT 8.6.0 and five Q/DQ models from it (mse; gptq + 16 float layers; both
# with --equalize; --equalize + gptq + 24 float layers), and the model, in four transfer-sized
# folders (r1 ~32 MB, r2 ~36 MB, r3 ~22 MB, r4 ~11 MB) for `steps.sh rec`.
#   sh benchmarks/gpu/prepare_rec.sh [STAGE]   (default .gpu-stage; needs pip install --no-deps
#                                               rapidocr-onnxruntime cvttf-notosanscjk-regular)
set -e
STAGE=${1:-.gpu-stage}
W=${BENCH_WORK:-.bench}/rec-gpu
mkdir -p $W $STAGE/r1 $STAGE/r2 $STAGE/r3 $STAGE/r4
M=$(python -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_rec_lines as B; \
print(B._package_file('rapidocr_onnxruntime', 'models/ch_PP-OCRv4_rec_infer.onnx'))")
python - "$M" "$W" <<'PY'
import sys
import numpy as np
import onnx
sys.path.insert(0, "benchmarks")
import bench_rec_lines as B
model, work = sys.argv[1], sys.argv[2]
font = B._package_file("cvttf_NotoSansCJK_Regular", "NotoSansCJKtc-Regular.otf")
meta = {p.key: p.value for p in onnx.load(model, load_external_data=False).metadata_props}
chars = [c for c in meta.get("character", "").split("\n") if len(c) == 1 and 0x4E00 <= ord(c) <= 0x9FFF]
np.save(f"{work}/reclines.npy", B.render(chars, font, 200, seed=1))
np.save(f"{work}/calib.npy", B.render(chars, font, 64, seed=0))
PY
trtq calibrate --model $M --data $W/calib.npy --trt-version 8.6.0 -o $W/rec.mse.cache -q
trtq quantize --model $M --cache $W/rec.mse.cache -o $W/rec.mse.qdq.onnx -q
trtq quantize --model $M --cache $W/rec.mse.cache --data $W/calib.npy --weight-rounding gptq --float-layers 16 \
    -o $W/rec.gbf16.qdq.onnx -q
trtq quantize --model $M --cache $W/rec.mse.cache --data $W/calib.npy --equalize -o $W/rec.emse.qdq.onnx -q
trtq quantize --model $M --cache $W/rec.mse.cache --data $W/calib.npy --equalize --weight-rounding gptq \
    --float-layers 16 -o $W/rec.egbf16.qdq.onnx -q
trtq quantize --model $M --cache $W/rec.mse.cache --data $W/calib.npy --equalize --weight-rounding gptq \
    --float-layers 24 -o $W/rec.egbf24.qdq.onnx -q
cp $M $STAGE/r1/rec.onnx
cp $W/rec.mse.qdq.onnx $W/rec.gbf16.qdq.onnx $STAGE/r1/
cp $W/reclines.npy $STAGE/r2/
cp $W/rec.emse.qdq.onnx $W/rec.egbf16.qdq.onnx $STAGE/r3/
cp $W/rec.egbf24.qdq.onnx $STAGE/r4/
du -sh $STAGE/r1 $STAGE/r2 $STAGE/r3 $STAGE/r4
