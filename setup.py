"""The compiled kernels (trtq/calib/collect/_kernels.c) and the in-graph statistics operator
(trtq/calib/collect/_ingraph.c), one library, are optional: without a C compiler the install goes
on and trtq uses numba or numpy, and exposed outputs, instead (trtq.calib.collect.compiled says
which). Everything else is in pyproject.toml."""
from setuptools import Extension, setup

C = "trtq/calib/collect/"
setup(ext_modules=[Extension("trtq.calib.collect._compiled", [C + "_kernels.c", C + "_ingraph.c", C + "_ingraph_fold.c"],
                             optional=True, depends=[C + "_kernels.h", C + "_ingraph.h"],
                             extra_compile_args=["-O3"])])
