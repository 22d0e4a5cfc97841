"""Trouble inside a training loop is reported once per kind, never raised, except in strict mode."""

from __future__ import annotations

import logging
import os
import warnings

STRICT_ENV = "MLFLOW_NEURON_STRICT"

logger = logging.getLogger("mlflow_neuron")


class MLflowNeuronWarning(UserWarning):
    """Something in profiling or logging went wrong; training went on."""


def strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


class Reporter:
    """Warns once per kind of trouble; in strict mode re-raises instead, so tests see it."""

    def __init__(self, strict: bool | None = None) -> None:
        self.strict = strict_from_env() if strict is None else strict
        self._reported: set[str] = set()
        self.counts: dict[str, int] = {}

    def problem(self, kind: str, message: str, error: BaseException | None = None) -> None:
        """Record a problem; call from an `except` block to re-raise it in strict mode."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.strict and error is not None:
            raise error
        if kind in self._reported:
            logger.debug("%s (again): %s", kind, message, exc_info=error)
            return
        self._reported.add(kind)
        detail = f": {type(error).__name__}: {error}" if error is not None else ""
        warnings.warn(f"mlflow-neuron: {message}{detail}", MLflowNeuronWarning, stacklevel=3)
        logger.debug("%s", message, exc_info=error)
