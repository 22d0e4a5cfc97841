"""mlflow-neuron: PyTorch profiler results on AWS Trainium (and CUDA, and CPU) as MLflow data.

The extraction layer (`extract_cycle`, `CycleProfile`, device helpers) imports without MLflow;
the MLflow-facing names load MLflow on first use.
"""

from importlib import import_module
from typing import Any

from . import _render as render
from ._compare import RunProfile, compare, regressions
from ._devices import ProfilingSetup, compile_backend, pick_device, profiling_setup, synchronize
from ._extract import CycleProfile, OpStats, extract_cycle
from ._keys import readable_key
from ._report import STRICT_ENV, MLflowNeuronWarning

__version__ = "0.1.0"

_MLFLOW_FACING = {
    "MLflowProfilerCallback": "._callback",
    "DEFAULT_MAX_FILE_BYTES": "._callback",
    "compare_runs": "._mlflow_runs",
    "attach_comparison": "._mlflow_runs",
    "annotate_model_version": "._registry",
}

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "STRICT_ENV",
    "CycleProfile",
    "MLflowNeuronWarning",
    "MLflowProfilerCallback",
    "OpStats",
    "ProfilingSetup",
    "RunProfile",
    "__version__",
    "annotate_model_version",
    "attach_comparison",
    "compare",
    "compare_runs",
    "compile_backend",
    "extract_cycle",
    "pick_device",
    "profiling_setup",
    "readable_key",
    "regressions",
    "render",
    "synchronize",
]


def __getattr__(name: str) -> Any:
    module = _MLFLOW_FACING.get(name)
    if module is None:
        raise AttributeError(f"module 'mlflow_neuron' has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)
