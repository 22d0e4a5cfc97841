"""The fault matrix: each fault of tests/test_fault_matrix.py, tests/test_sync_faults.py and
tests/test_end_of_script.py (containers, pipes, kills, ranks sharing an outbox) (against
a real `mlflow server`, or a sqlite store where the network plays no part), one row per fault:
cycles produced, delivered once, kept on the way (held in an outbox folder before a sync), lost
(counted in a warning), and duplicates.

    python benchmarks/fault_matrix.py [-k EXPR]   # pytest's -k, to run some faults only

The tests assert each row (duplicates 0, delivered once + lost = produced); this prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ["tests/test_fault_matrix.py", "tests/test_sync_faults.py", "tests/test_end_of_script.py"]


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("-k", default=None, help="pytest -k expression: run only the faults it selects")
    args = options.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        rows_file = Path(scratch) / "rows.jsonl"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODULES]
        if args.k:
            command += ["-k", args.k]
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "MLFLOW_NEURON_FAULT_MATRIX": str(rows_file)})
        rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    header = ("fault", "produced", "delivered once", "kept", "lost", "duplicates")
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print(f"| {row['fault']} | {row['produced']} | {row['delivered_once']} | {row['kept']} | {row['lost']} | "
              f"{row['duplicates']} |")  # fmt: skip
    print(f"\n{len(rows)} fault(s) with a row; pytest exit {done.returncode}")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
