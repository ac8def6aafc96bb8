"""Decode a data folder the way trtq calibrates on it and save the samples as one .npy (axis 0 =
samples) for tools that take arrays (ModelOpt's ONNX PTQ in benchmarks/gpu/prepare_engines.sh).

    python benchmarks/gpu/dump_inputs.py MODEL FOLDER OUT.npy --preset yolo [--shape 1x3x640x640] [--limit N]
    python benchmarks/gpu/dump_inputs.py MODEL FOLDER OUT.npy --config run.yaml [--limit N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trtq.config import DataOptions, InputSource, load_config
from trtq.data.batcher import Batcher
from trtq.data.presets import preset
from trtq.model import TensorSpec, input_specs


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("folder")
    ap.add_argument("out")
    ap.add_argument("--preset")
    ap.add_argument("--config")
    ap.add_argument("--shape", help="the input's full shape where the model leaves dims open, e.g. 1x3x640x640")
    ap.add_argument("--limit", type=int)
    a = ap.parse_args(argv)
    spec = input_specs(onnx.load(a.model, load_external_data=False))[0]
    if a.shape:
        spec = TensorSpec(spec.name, tuple(int(d) for d in a.shape.split("x")), spec.dtype)
    if a.config:
        pre = load_config(a.config, environ={}).data.inputs[spec.name].preprocess
    else:
        pre = preset(a.preset, spec.shape)
    shapes = {spec.name: spec.shape} if a.shape else {}
    opts = DataOptions(
        inputs={spec.name: InputSource(images=a.folder, preprocess=pre)},
        batch_size=1,
        workers=0,
        limit=a.limit,
        shapes=shapes,
    )
    x = np.concatenate([b.arrays[spec.name][: b.valid] for b in Batcher(opts, [spec])])
    np.save(a.out, x)
    print(a.out, x.shape, x.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
