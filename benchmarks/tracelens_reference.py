"""Regenerate tests/fixtures/tracelens_perf_model.json.gz: TraceLens's bytes and FLOPs per op call.

    git clone https://github.com/AMD-AGI/TraceLens /tmp/TraceLens   # MIT; the commit is recorded
    python benchmarks/tracelens_reference.py /tmp/TraceLens | gzip -9n > tests/fixtures/tracelens_perf_model.json.gz

For every `cpu_op` of the public traces in tests/fixtures/real_traces that records shapes, and
whose name TraceLens has a perf model for (`resolve_perf_model_class`), it builds that class on the
trace event, as TraceLens's `TreePerfAnalyzer.compute_perf_metrics` does, and stores
`[op, External id, bytes(), flops()]` (None where TraceLens raises or returns None). Only
`TraceLens.PerfModel` is imported (its package `__init__`, which pulls plotting and reporting,
is bypassed). A trace recorded without `Input Strides` (the 2022 CUDA step) gets contiguous
strides: TraceLens's classes require the key, and no bytes or FLOPs formula of theirs reads it.

Run once by hand; nothing in the tests or the package imports TraceLens.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import subprocess
import sys
import types
import warnings
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "real_traces"
TRACES = ("tracelens_rocm_mi300_normalization.json.gz", "tracelens_cuda_h100_bert_small.json.gz",
          "hta_rocm62_mi250_minitoy.json.gz", "hta_cuda_trace_diff_control_2022.json.gz")  # fmt: skip


def _resolver(checkout: Path):
    package = types.ModuleType("TraceLens")
    package.__path__ = [str(checkout / "TraceLens")]
    sys.modules["TraceLens"] = package
    from TraceLens.PerfModel.torch_op_mapping import resolve_perf_model_class

    return resolve_perf_model_class


def _contiguous(shape) -> list[int]:
    return [math.prod(shape[i + 1:]) for i in range(len(shape))] if isinstance(shape, list) else []


def _number(value):
    return None if value is None else int(value) if float(value).is_integer() else float(value)


def reference(resolve, trace: Path) -> list[list]:
    with gzip.open(trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    rows = []
    for event in events:
        args = event.get("args", {})
        if event.get("cat") != "cpu_op" or event.get("ph") != "X" or "Input Dims" not in args:
            continue
        model = resolve(event["name"])
        if model is None:
            continue
        if "Input Strides" not in args:
            event = {**event, "args": {**args, "Input Strides": [_contiguous(s) for s in args["Input Dims"]]}}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                found = model(event)
                nbytes, flops = found.bytes(), found.flops()
        except Exception:  # noqa: BLE001 - TraceLens has no number for this call: recorded as None
            nbytes = flops = None
        rows.append([event["name"], args.get("External id"), _number(nbytes), _number(flops)])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tracelens", type=Path, help="a checkout of AMD-AGI/TraceLens")
    checkout = parser.parse_args().tracelens
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()  # fmt: skip
    resolve = _resolver(checkout)
    calls = {name: reference(resolve, FIXTURES / name) for name in TRACES}
    source = (f"AMD-AGI/TraceLens @ {commit or 'unknown commit'}, TraceLens/PerfModel (MIT): each cpu_op's "
              "perf model class (resolve_perf_model_class) built on the trace event, bytes()/flops(); "
              "regenerate with benchmarks/tracelens_reference.py")  # fmt: skip
    print('{"source": ' + json.dumps(source) + ', "calls": {')
    for i, name in enumerate(TRACES):
        body = ",\n".join(json.dumps(row, separators=(",", ":")) for row in calls[name])
        print(f"{json.dumps(name)}: [\n{body}\n]" + ("," if i < len(TRACES) - 1 else ""))
    print("}}")
    return 0 if any(calls.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
