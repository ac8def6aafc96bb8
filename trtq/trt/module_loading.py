"""CUDA module loading for engine builds.

With lazy loading (the CUDA 12.2+ default) a kernel's module is loaded the first time the kernel
runs. TensorRT times its tactics by running them, so in a process's first build the tactics it
times are the ones paying their load, and it picks layouts it does not pick once the modules are
in memory (docs/decisions.md D39). ``trtq build`` asks for eager loading before CUDA starts, unless
the user chose a mode, and the plan's metadata records the mode the builder ran under.
"""

import os
from collections.abc import MutableMapping
from typing import Any, Optional

from trtq.errors import EnvironmentMissing
from trtq.trt import compat

ENV = "CUDA_MODULE_LOADING"
EAGER = "EAGER"


def prefer_eager(environ: Optional[MutableMapping[str, str]] = None) -> str:
    """Set ``CUDA_MODULE_LOADING=EAGER`` unless it is set; the value in force. CUDA reads it when it
    initialises, so it counts only in a process that has not used CUDA yet (:func:`mode` says what
    CUDA made of it)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV, "").strip()
    if not value:
        env[ENV] = value = EAGER
    return value


def mode(driver: Any = None) -> Optional[str]:
    """``"eager"`` or ``"lazy"``, as the CUDA driver reports for this process (after CUDA has
    started); None where cuda-python or the driver cannot say."""
    if driver is None:
        try:
            driver = compat.import_cudriver()
        except EnvironmentMissing:
            return None
    try:
        err, loading = driver.cuModuleGetLoadingMode()
    except Exception:  # an older driver or binding without the call
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    names = {
        driver.CUmoduleLoadingMode.CU_MODULE_EAGER_LOADING: "eager",
        driver.CUmoduleLoadingMode.CU_MODULE_LAZY_LOADING: "lazy",
    }
    return names.get(loading)
