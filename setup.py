"""The compiled kernels (trtq/calib/_native.c) and the in-graph statistics operator
(trtq/calib/_ingraph.c), one library, are optional: without a C compiler the install goes on and
trtq uses numba or numpy, and exposed outputs, instead (trtq.calib.native says which). Everything
else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("trtq.calib._native", ["trtq/calib/_native.c", "trtq/calib/_ingraph.c",
                                                   "trtq/calib/_ingraph_fold.c"], optional=True,
                             depends=["trtq/calib/_native.h", "trtq/calib/_ingraph.h"],
                             extra_compile_args=["-O3"])])
