"""What every `mlflow-neuron` command shares: exit codes and argument checks.

A bad value is a usage error (exit 2, one line from argparse), wherever it is given.
"""

from __future__ import annotations

import argparse

EXIT_OK = 0
EXIT_FAILED = 1  # compare: the gate found a regression; sync: deliverable records were kept
EXIT_USAGE = 2  # bad arguments, or a run, experiment, model version or folder that does not exist
EXIT_UNREACHABLE = 3  # the tracking server is down, refuses, or does not answer in time


def non_negative_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 1, "an integer >= 1")


def non_negative_float(text: str) -> float:
    return _checked(text, float, lambda v: v >= 0 and v == v and v != float("inf"), "a number >= 0")


def positive_float(text: str) -> float:
    return _checked(text, float, lambda v: v > 0 and v == v and v != float("inf"), "a number > 0")


def _checked(text: str, kind: type, ok, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value
