"""The public warning and the strict-mode switch: what a user catches, filters or sets.

Example::

    import warnings
    from mlflow_neuron import MLflowNeuronWarning

    warnings.simplefilter("error", MLflowNeuronWarning)   # or MLFLOW_NEURON_STRICT=1: errors raise

Every layer reports trouble with this class (`_delivery.report.Reporter`, once per kind), so it is
defined here, beside the public API, in a module that imports nothing of the package.
"""

from __future__ import annotations

import os

STRICT_ENV = "MLFLOW_NEURON_STRICT"  # "1": errors inside the training loop raise instead of warning once


class MLflowNeuronWarning(UserWarning):
    """Something in profiling or logging went wrong; training went on."""


def strict_from_env() -> bool:
    """Strict mode, as `STRICT_ENV` sets it."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}
