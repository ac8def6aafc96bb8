"""The conformance machinery on its own (no binding needed): the pybind11 signature parser, the
static scan and the check, the stub libraries."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.trt import binding_harness as harness
from tests.trt.binding_check import Surface, check
from tests.trt.binding_introspect import doc_signatures
from tests.trt.binding_scan import Scanner


def test_pybind11_signatures_are_parsed():
    doc = textwrap.dedent("""\
        set_input_shape(*args, **kwargs)
        Overloaded function.

        1. set_input_shape(self: tensorrt.tensorrt.IExecutionContext, name: str, shape: tuple) -> bool

            Set shape.

        2. set_input_shape(self: tensorrt.tensorrt.IExecutionContext, name: str, shape: Dict[str, int] = {}, *, \
fast: bool = False) -> bool
        """)
    sigs = doc_signatures("set_input_shape", doc)
    assert len(sigs) == 2 and sigs[0]["returns"] == "bool"
    assert [(p["name"], p["type"], p["kind"]) for p in sigs[0]["params"]] == [
        ("self", "tensorrt.tensorrt.IExecutionContext", "pos"),
        ("name", "str", "pos"),
        ("shape", "tuple", "pos"),
    ]
    shape, fast = sigs[1]["params"][2:]
    assert shape["type"] == "Dict[str, int]" and shape["default"] and fast["kind"] == "kwonly"


def _cls(members, bases=(), enum=None):
    e = {"kind": "class", "bases": list(bases), "members": members}
    if enum is not None:
        e["enum"] = enum
    return e


def _m(*params, returns="None"):
    """A method with one signature: params as (name, type[, default])."""
    ps = [{"name": p[0], "type": p[1], "default": len(p) > 2, "kind": "pos"} for p in params]
    return {"kind": "method", "signatures": [{"params": ps, "returns": returns}]}


T = "tensorrt.tensorrt."
SURFACE = {
    "version": "99.0.0",
    "module": {
        "__version__": {"kind": "value", "type": "str", "value": "99.0.0"},
        "Builder": _cls(
            {
                "__init__": _m(("self", T + "Builder"), ("logger", T + "ILogger")),
                "create_builder_config": _m(("self", T + "Builder"), returns=T + "IBuilderConfig"),
            }
        ),
        "IBuilderConfig": _cls(
            {
                "set_flag": _m(("self", T + "IBuilderConfig"), ("flag", T + "BuilderFlag")),
                "set_timing_cache": _m(
                    ("self", T + "IBuilderConfig"), ("cache", T + "ITimingCache"), ("ignore", "bool")
                ),
                "flags": {"kind": "property", "readonly": True, "type": "int"},
                "level": {"kind": "property", "readonly": False, "type": "typing.SupportsInt"},
            }
        ),
        "ITimingCache": _cls({}),
        "ILogger": _cls(
            {
                "__init__": _m(("self", T + "ILogger")),
                "log": _m(("self", T + "ILogger"), ("severity", "int"), ("msg", "str")),
            }
        ),
        "BuilderFlag": _cls({"FP16": {"kind": "value", "type": "BuilderFlag", "value": 0}}, enum={"FP16": 0}),
    },
    "exercised": {"predicates": {"has_new_api": False}, "recipes": {}},
}


def _scan(source):
    s = Scanner({"trtq.trt.mod": textwrap.dedent(source)}, outside_refs=set())
    return s.run()


def _problems(source, surface=SURFACE):
    result = _scan(source)
    return check(result.uses, Surface(surface)).problems + result.unseen


def test_scan_accepts_what_the_binding_has():
    assert (
        _problems("""
        def build(trt, logger):
            builder = trt.Builder(logger)
            config = builder.create_builder_config()
            config.set_flag(trt.BuilderFlag.FP16)
            config.level = 3
            return trt.__version__
        """)
        == []
    )


@pytest.mark.parametrize(
    "body,expected",
    [
        ("config.set_flags(trt.BuilderFlag.FP16)", "unknown name IBuilderConfig.set_flags"),
        ("config.set_flag(trt.BuilderFlag.INT8)", "unknown name BuilderFlag.INT8"),
        ("config.set_flag()", "missing flag"),
        ("config.set_flag(trt.BuilderFlag.FP16, True)", "takes 1 positional arguments, trtq passes 2"),
        ("config.set_flag(flags=trt.BuilderFlag.FP16)", "no parameter 'flags'"),
        ("config.set_flag(1)", "argument 'flag' wants BuilderFlag, trtq passes int"),
        ("config.set_timing_cache(config, False)", "argument 'cache' wants ITimingCache, trtq passes config"),
        ("config.set_timing_cache(b'', False)", "argument 'cache' wants ITimingCache, trtq passes bytes"),
        ("config.flags = 3", "IBuilderConfig.flags is read-only"),
        ("config.level = 'high'", "wants typing.SupportsInt, trtq sets str"),
        ("trt.Runtime(None)", "unknown name trt.Runtime"),
        ("getattr(trt.BuilderFlag, name.upper())", "getattr(trt.BuilderFlag, <name.upper()>)"),
        ("getattr(trt.BuilderFlag, name)", "names for build(name=...) come from outside the scanned calls"),
    ],
)
def test_scan_reports_what_the_binding_lacks(body, expected):
    problems = _problems(f"""
        def build(trt, config, name):
            {body}
        """)
    assert any(expected in p for p in problems), problems


def test_probes_and_guards_need_nothing():
    assert (
        _problems("""
        def build(trt, config):
            if hasattr(config, "set_new"):
                config.set_new(getattr(trt, "NewFlag", None))
            if not hasattr(trt, "Other"):
                return
            trt.Other.thing()
        """)
        == []
    )


def test_predicate_guards_follow_the_real_module():
    source = """
        from trtq.trt import compat

        def build(trt, config):
            if compat.has_new_api(trt):
                config.new_call()
        """
    files = {
        "trtq.trt.mod": textwrap.dedent(source),
        "trtq.trt.compat": "def has_new_api(trt) -> bool:\n    return hasattr(trt, 'X')\n",
    }
    uses = Scanner(files, outside_refs=set()).run().uses
    assert check(uses, Surface(SURFACE)).problems == []  # has_new_api is false there
    on = dict(SURFACE, exercised={"predicates": {"has_new_api": True}})
    assert any("IBuilderConfig.new_call" in p for p in check(uses, Surface(on)).problems)


def test_overrides_take_what_tensorrt_passes():
    problems = _problems("""
        def make_logger(trt):
            class Logger(trt.ILogger):
                def __init__(self):
                    trt.ILogger.__init__(self)

                def log(self, severity):
                    pass

                def helper(self):
                    pass

            return Logger()
        """)
    assert any("log takes 2 positional parameters" in p for p in problems), problems
    assert any("helper overrides nothing in ILogger" in p for p in problems), problems


def test_conventional_names_must_hold_their_class():
    problems = _problems("""
        def build(trt, logger):
            config = trt.Builder(logger)
        """)
    assert any("trtq's name for it means IBuilderConfig" in p for p in problems), problems


@pytest.mark.skipif(not all(shutil.which(t) for t in ("gcc", "nm", "readelf")), reason="needs gcc and binutils")
def test_stub_libraries_satisfy_a_binding(tmp_path):
    """A small stand-in binding links two TensorRT-named libraries and imports three symbols (and
    libc's dlopen): its stubs export exactly those, and it loads on them."""
    libs = tmp_path / "libs"
    libs.mkdir()
    for lib in ("libnvinfer.so.99", "libnvinfer_plugin.so.99"):
        (libs / "empty.c").write_text("int placeholder_symbol;\n")
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(libs / lib), str(libs / "empty.c"), f"-Wl,-soname,{lib}"], check=True
        )
    src = tmp_path / "binding.c"
    src.write_text(
        "#include <dlfcn.h>\nvoid *createInferBuilder_INTERNAL(void *, int);\n"
        "int initLibNvInferPlugins(void *, const char *);\nvoid *getPluginRegistry(void);\n"
        'void *use(void) { initLibNvInferPlugins(0, ""); getPluginRegistry(); dlopen("x", 0);\n'
        "  return createInferBuilder_INTERNAL(0, 0); }\n"
    )
    so = tmp_path / "binding.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(so),
            str(src),
            f"-L{libs}",
            "-Wl,--no-as-needed",
            "-l:libnvinfer.so.99",
            "-l:libnvinfer_plugin.so.99",
        ],
        check=True,
    )
    stubs = tmp_path / "stubs"
    plan = harness.build_stubs(so, stubs)
    assert plan == {
        "libnvinfer.so.99": ["createInferBuilder_INTERNAL", "getPluginRegistry"],
        "libnvinfer_plugin.so.99": ["initLibNvInferPlugins"],
    }
    for lib, names in plan.items():
        assert harness.exported(stubs / lib) == names
    code = f"import ctypes; ctypes.CDLL({str(so)!r}); print('loaded')"
    # the interpreter's own library path stays (a relocated Python finds its libffi through it)
    base = dict(os.environ)
    paths = [str(stubs)] + [p for p in [base.get("LD_LIBRARY_PATH")] if p]
    ok = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(base, LD_LIBRARY_PATH=os.pathsep.join(paths)),
    )
    assert ok.stdout.strip() == "loaded", ok.stderr
    bare = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=base)
    assert bare.returncode != 0 and "libnvinfer" in bare.stderr  # without the stubs it cannot load
