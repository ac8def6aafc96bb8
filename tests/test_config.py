from pathlib import Path

import pytest

from trtq.config import (
    CalibrateOptions,
    PreprocessOptions,
    TrtqConfig,
    apply_overrides,
    load_config,
    to_dict,
)
from trtq.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_without_file():
    cfg = load_config(None, environ={})
    assert cfg == TrtqConfig(calibrate=CalibrateOptions(method="mse"))
    assert cfg.calibrate.method == "mse" and cfg.calibrate.num_bins == 2048


def test_method_default_depends_on_the_backend_but_a_given_method_stays(tmp_path):
    assert load_config(None, {"calibrate.backend": "tensorrt"}, environ={}).calibrate.method == "entropy"
    p = write(tmp_path, "calibrate: {method: mse}\n")
    # the config's explicit choice is kept (the TensorRT backend then refuses it with a message)
    assert load_config(p, {"calibrate.backend": "tensorrt"}, environ={}).calibrate.method == "mse"
    p = write(tmp_path, "calibrate: {backend: tensorrt}\n")
    assert load_config(p, environ={}).calibrate.method == "entropy"
    assert CalibrateOptions().resolved().method == "mse"


def test_precedence_defaults_yaml_env_flags(tmp_path):
    p = write(tmp_path, "calibrate: {method: max, percentile: 99.9}\ndata: {batch_size: 4, seed: 1}\n")
    cfg = load_config(p, environ={})
    assert (cfg.calibrate.method, cfg.calibrate.percentile, cfg.data.batch_size) == ("max", 99.9, 4)
    cfg = load_config(p, environ={"TRTQ_CALIBRATE_METHOD": "mse", "TRTQ_DATA_BATCH_SIZE": "16"})
    assert (cfg.calibrate.method, cfg.data.batch_size) == ("mse", 16)
    cfg = load_config(
        p,
        {"calibrate.method": "percentile", "data.batch_size": None},
        environ={"TRTQ_CALIBRATE_METHOD": "mse", "TRTQ_DATA_BATCH_SIZE": "16"},
    )
    # a flag wins; an unset flag (None) does not override the environment
    assert (cfg.calibrate.method, cfg.data.batch_size, cfg.data.seed) == ("percentile", 16, 1)


def test_yaml_paths_are_relative_to_the_file(tmp_path):
    sub = tmp_path / "configs"
    sub.mkdir()
    p = write(sub, "model: ../m.onnx\ndata: {inputs: {x: {images: imgs, npy: ['a/*.npy']}}}\n")
    cfg = load_config(p, environ={})
    assert Path(cfg.model) == tmp_path / "m.onnx"  # printed as it is: no configs/../
    src = cfg.data.inputs["x"]
    assert Path(src.images) == sub / "imgs" and Path(src.npy[0]) == sub / "a/*.npy"
    # flags stay relative to the working directory
    cfg = load_config(p, {"model": "other.onnx"}, environ={})
    assert cfg.model == "other.onnx"


def test_nested_preprocess_and_scalar_to_tuple(tmp_path):
    p = write(
        tmp_path,
        """
data:
  inputs:
    x:
      images: imgs
      preprocess:
        resize: {mode: letterbox, size: [384, 640], pad_value: 114, anchor: top_left}
        center_crop: 224
        mean: [0.5]
        color: BGR
""",
    )
    pre = load_config(p, environ={}).data.inputs["x"].preprocess
    assert pre.resize.size == (384, 640) and pre.resize.pad_value == 114.0 and pre.resize.anchor == "top_left"
    assert pre.center_crop == (224,) and pre.mean == (0.5,) and pre.color == "bgr"
    assert isinstance(pre, PreprocessOptions)


@pytest.mark.parametrize(
    "text, where",
    [
        ("data: {inputs: {x: {preprocess: {mena: [1]}}}}", "data.inputs.x.preprocess.mena"),
        ("calibrat: {method: max}", "calibrat"),
        ("build: {profiles: {x: {min: [1], maximum: [2]}}}", "build.profiles.x.maximum"),
    ],
)
def test_unknown_keys_are_named_with_their_path(tmp_path, text, where):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text), environ={})
    assert f"unknown config key '{where}'" in str(e.value)
    assert e.value.exit_code == 2


@pytest.mark.parametrize(
    "text, key",
    [
        ("calibrate: {collect: everywhere}", "calibrate.collect"),
        ("data: {batch_size: 2.5}", "data.batch_size"),
        ("data: {shuffle: 'yes please'}", "data.shuffle"),
        ("calibrate: {percentile: [1, 2]}", "calibrate.percentile"),
        ("data: 5", "data"),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load_config(write(tmp_path, text), environ={})


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml", environ={})
    with pytest.raises(ConfigError, match="line 2 is not valid YAML"):
        load_config(write(tmp_path, "a: 1\n b: 2\n"), environ={})
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(write(tmp_path, "- 1\n- 2\n"), environ={})
    assert load_config(write(tmp_path, ""), environ={}) == load_config(None, environ={})


def test_environment_errors():
    with pytest.raises(ConfigError, match="unknown environment variable TRTQ_CALIBRATE_METOD"):
        load_config(None, environ={"TRTQ_CALIBRATE_METOD": "max"})
    with pytest.raises(ConfigError, match="calibrate.backend"):
        load_config(None, environ={"TRTQ_CALIBRATE_BACKEND": "nonsense"})


def test_environment_variables_read_elsewhere_are_not_config_keys():
    # TRTQ_SIGNAL_GRACE: the CLI's signal watchdog (trtq.cli), not an option
    others = {"TRTQ_SIGNAL_GRACE": "3", "TRTQ_NO_NATIVE": "1"}
    assert load_config(None, environ=others) == load_config(None, environ={})


def test_apply_overrides_and_to_dict():
    cfg = apply_overrides(TrtqConfig(), {"calibrate.tensors": ["a", "b"], "build.fp16": True})
    assert cfg.calibrate.tensors == ("a", "b") and cfg.build.fp16 is True
    with pytest.raises(ConfigError, match="unknown option key 'calibrate.nope'"):
        apply_overrides(cfg, {"calibrate.nope": 1})
    d = to_dict(cfg)
    assert d["calibrate"]["tensors"] == ("a", "b") and d["build"]["fp16"] is True
    assert CalibrateOptions().output == "calibration.cache"
