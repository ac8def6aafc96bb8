"""What the ONNX -> torch converter's op modules share: the torch imports (made on first use),
small readers of attribute and tensor values, ONNX -> torch dtypes, the hint of a refusal."""

from __future__ import annotations

from typing import Any, Callable

import onnx

from trtq.errors import ModelError

Fn = Callable[..., Any]
# what a model the converter cannot run takes instead
UNSUPPORTED_HINT = "drop --reconstruct for this model (--weight-rounding gptq --bias-correction need no converter)"


def torch_module():
    import torch

    return torch


def functional():
    import torch.nn.functional as F

    return F


def ints(t) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_dtype(onnx_type: int):
    torch = torch_module()
    table = {
        onnx.TensorProto.FLOAT: torch.float32,
        onnx.TensorProto.DOUBLE: torch.float64,
        onnx.TensorProto.FLOAT16: torch.float16,
        onnx.TensorProto.INT64: torch.int64,
        onnx.TensorProto.INT32: torch.int32,
        onnx.TensorProto.INT8: torch.int8,
        onnx.TensorProto.UINT8: torch.uint8,
        onnx.TensorProto.BOOL: torch.bool,
    }
    if onnx_type not in table:
        raise ModelError(
            f"reconstruct: tensor type {onnx.TensorProto.DataType.Name(onnx_type)} is not supported", UNSUPPORTED_HINT
        )
    return table[onnx_type]
