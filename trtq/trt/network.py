"""The TensorRT network side shared by engine builds and TensorRT's own calibration: parsing an
ONNX model (from memory or a file) with messages that name the node, optimization profiles and the
builder configuration."""

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from trtq.config import BuildOptions
from trtq.errors import ConfigError, ModelError
from trtq.trt import compat

log = logging.getLogger("trtq.trt.build")  # its messages are part of a build (or a TensorRT calibration build)

Shape = tuple[int, ...]


def parser_error(trt: Any, parser: Any, logger: Any, model_path: Path, model: Any) -> ModelError:
    """ModelError with TensorRT's first parser message, the ONNX node it names, and a hint."""
    v = compat.version_of(trt)
    opset = onnx_opset(model) if model is not None else None
    first = ""
    where = ""
    if parser.num_errors:
        err = parser.get_error(0)
        first = str(err.desc())
        node = err.node() if hasattr(err, "node") else -1
        if isinstance(node, int) and node >= 0:
            where = f" at node #{node}"
            if model is not None and node < len(model.graph.node):
                n = model.graph.node[node]
                where += f" ({n.op_type}" + (f" '{n.name}'" if n.name else "") + ")"
    elif logger.errors:
        first = logger.errors[0]
    more = f" (+{parser.num_errors - 1} more)" if parser.num_errors > 1 else ""
    if v.major < 10 and opset is not None and opset > 17:
        hint = f"TensorRT {v} reads ONNX opset <= 17 and this model is opset {opset}: re-export with opset 17"
    elif v.major < 10:
        hint = f"TensorRT {v} reads ONNX opset <= 17; check that every op is supported (run with -v for details)"
    else:
        hint = f"check that every op is supported by TensorRT {v} (run with -v for details)"
    return ModelError(f"TensorRT {v} cannot parse {model_path.name}{where}: {first or 'unknown error'}{more}", hint)


def onnx_opset(model: Any) -> Optional[int]:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return None


def add_conv_kernel_shapes(model: Any) -> int:
    """Set the optional ``kernel_shape`` of Conv/ConvTranspose nodes that lack it; return how many.

    TensorRT's ONNX parser (seen with 8.6) cannot infer a convolution's spatial dims when the
    weight arrives through DequantizeLinear instead of as an initializer, and fails with
    "The input tensor shape misaligns with the input kernel shape". Exporters such as the
    PyTorch dynamo exporter omit the attribute. The weight is followed back through
    Q/DQ/Cast/Identity to its initializer; the attribute is spec-legal and changes no result.
    """
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    passthrough = {"QuantizeLinear", "DequantizeLinear", "Cast", "Identity"}
    fixed = 0
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
            continue
        if any(a.name == "kernel_shape" for a in node.attribute):
            continue
        name, dims = node.input[1], None
        for _ in range(8):
            if name in inits:
                dims = list(inits[name].dims)
                break
            src = producer.get(name)
            if src is None:
                break
            if src.op_type == "Constant":
                for a in src.attribute:
                    if a.name == "value":
                        dims = list(a.t.dims)
                break
            if src.op_type not in passthrough or not src.input:
                break
            name = src.input[0]
        if dims and len(dims) >= 3:
            node.attribute.append(helper.make_attribute("kernel_shape", [int(d) for d in dims[2:]]))
            fixed += 1
    return fixed


def parse_model(trt: Any, parser: Any, logger: Any, model: Any, model_path: Path, work_dir: Path) -> None:
    """Parse an in-memory ONNX ModelProto (via a temporary file when it is over protobuf's 2 GiB)."""
    if add_conv_kernel_shapes(model):
        log.debug("added kernel_shape to convolutions whose weights pass through Q/DQ")
    if model.ByteSize() < (2 << 30) - (1 << 20):
        ok = parser.parse(model.SerializeToString(), str(model_path))
    else:  # pragma: no cover - needs a model over 2 GiB
        import tempfile

        import onnx

        with tempfile.TemporaryDirectory(prefix=".trtq-build-", dir=work_dir) as tmp:
            path = Path(tmp) / "model.onnx"
            onnx.save_model(model, str(path), save_as_external_data=True, location="model.data")
            ok = parser.parse_from_file(str(path))
    if not ok:
        raise parser_error(trt, parser, logger, model_path, model)


def parse_file(trt: Any, parser: Any, logger: Any, model_path: Path) -> None:
    if not parser.parse_from_file(str(model_path)):
        from trtq.model import load_model

        raise parser_error(trt, parser, logger, model_path, load_model(model_path, load_external_data=False))


def network_inputs(network: Any) -> list[tuple[str, Shape]]:
    out = []
    for i in range(network.num_inputs):
        t = network.get_input(i)
        out.append((t.name, tuple(int(d) for d in t.shape)))
    return out


def add_profiles(
    builder: Any, config: Any, network: Any, profiles: Mapping[str, tuple[Shape, Shape, Shape]], calibration: bool
) -> None:
    dynamic = [(n, s) for n, s in network_inputs(network) if any(d < 0 for d in s)]
    if not dynamic:
        return
    profile = builder.create_optimization_profile()
    for name, _ in dynamic:
        if name not in profiles:
            raise ConfigError(
                f"TensorRT sees input {name} as dynamic but no shape is known for it",
                f"set build.profiles.{name} (min/opt/max)",
            )
        lo, opt, hi = profiles[name]
        profile.set_shape(name, lo, opt, hi)
    if config.add_optimization_profile(profile) < 0:
        raise ConfigError("TensorRT rejected the optimization profile", "check build.profiles min <= opt <= max")
    if calibration:
        # the calibration profile must be a single shape: the opt one
        cal = builder.create_optimization_profile()
        for name, _ in dynamic:
            opt = profiles[name][1]
            cal.set_shape(name, opt, opt, opt)
        compat.set_calibration_profile(config, cal)


def configure(trt: Any, config: Any, options: BuildOptions) -> None:
    compat.set_detailed_profiling(trt, config)  # layer precisions and tactics for bench --layers
    if options.workspace_mb is not None:
        compat.set_workspace(trt, config, options.workspace_mb)
    level = options.optimization_level
    if level is not None and not compat.set_optimization_level(config, level):
        log.warning("TensorRT %s has no builder optimization level: ignored", compat.version_of(trt))
    if options.tactic_sources is not None:
        config.set_tactic_sources(compat.tactic_source_mask(trt, options.tactic_sources))
