"""The compiled kernels (trtq/calib/collect/_kernels.c) and the in-graph statistics operator
(trtq/calib/collect/_ingraph.c), one library, built on Linux (GCC or clang) and optional: without
a C compiler, or on another system, the install goes on and trtq runs numpy and exposed outputs
instead (trtq.calib.collect.compiled says which). TRTQ_STRICT_C=1 (CI) turns every warning into
an error. Everything else is in pyproject.toml."""
import os
import sys

from setuptools import Extension, setup

C = "trtq/calib/collect/"
flags = ["-O3"] + (["-Wall", "-Wextra", "-Werror"] if os.environ.get("TRTQ_STRICT_C") == "1" else [])
compiled = Extension("trtq.calib.collect._compiled", [C + "_kernels.c", C + "_ingraph.c", C + "_ingraph_fold.c"],
                     optional=True, depends=[C + "_kernels.h", C + "_ingraph.h"], extra_compile_args=flags)
setup(ext_modules=[compiled] if sys.platform.startswith("linux") else [])
