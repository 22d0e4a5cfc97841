"""What writing a cycle ahead to the outbox costs the sender, beside what sending it costs.

    python benchmarks/write_ahead_cost.py [--repeats 20] [--upload-mb 64]

One real cycle (the RMSNorm example's: a torch.profiler cycle through MLflowProfilerCallback into
a sqlite store) gives the files and metrics a delivery carries. Then, in one run, median of
`--repeats`, each on a fresh copy of the cycle's files:

- write-ahead: `outbox.put` (hard links, the seal's SHA-256 of every file, record.json, rename)
  plus the record's removal once delivered; what the sender now does for every cycle;
- delivery: `RunLogger.deliver` of the same cycle into a sqlite store (the fastest server there
  is: against an `mlflow server` a delivery takes longer and the ratio is smaller);

and the same with one profile file of `--upload-mb` MiB (the outbox's copy cap: larger files are
kept as paths and neither linked nor hashed), median of a quarter of the repeats (at least 3). Both run on the sender's thread or in the helper
process, never on the training thread.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from mlflow_neuron import MLflowProfilerCallback  # noqa: E402
from mlflow_neuron._delivery import outbox as _outbox  # noqa: E402
from mlflow_neuron._delivery.mlflow_io import RunLogger  # noqa: E402
from mlflow_neuron._record.model import Delivery, RunRef  # noqa: E402


def one_cycle(work: Path) -> tuple[Path, dict[str, float]]:
    """The files and metrics of one profiled cycle of the example's workload."""
    from workloads import profile_rmsnorm

    uri = f"sqlite:///{work / 'source.db'}"
    mlflow.set_tracking_uri(uri)
    callback = MLflowProfilerCallback(tracking_uri=uri, experiment_id="0", process="inline", strict=True,
                                      outbox=work / "unused-outbox")  # fmt: skip
    profile_rmsnorm(callback, steps=4, wait=1, warmup=1, active=2)
    callback.close()
    client = MlflowClient(uri)
    files = Path(client.download_artifacts(callback.run_id, "profiler/step_4", str(work / "cycle")))
    metrics = client.get_run(callback.run_id).data.metrics
    return files, {k: v for k, v in metrics.items() if k.startswith("profiler/")}


def timed(action, repeats: int) -> float:
    times = []
    for index in range(repeats):
        started = time.perf_counter()
        action(index)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(files: Path, metrics: dict, work: Path, repeats: int, upload: Path | None) -> tuple[float, float]:
    uri = f"sqlite:///{work / 'target.db'}"
    run_id = MlflowClient(uri).create_run("0").info.run_id
    logger = RunLogger(RunRef(uri, run_id))

    def delivery(index: int) -> Delivery:
        staged = work / f"staged-{upload is not None}-{index}"
        shutil.copytree(files, staged)
        uploads = ((str(upload), "profiler/step_4/neuron"),) if upload else ()
        return Delivery(step=4 + index, timestamp_ms=int(time.time() * 1000), artifact_dir=f"profiler/step_{4 + index}",
                        metrics=metrics, files_dir=str(staged), uploads=uploads)  # fmt: skip

    prepared = [delivery(i) for i in range(repeats)]
    outbox = work / "outbox"

    def write_ahead(index: int) -> None:
        record = _outbox.put(outbox, prepared[index], logger.run, copy_max_bytes=_outbox.DEFAULT_COPY_MAX_BYTES)
        _outbox.remove(record)

    ahead = timed(write_ahead, repeats)
    sent = timed(lambda index: logger.deliver(prepared[index]), repeats)
    return ahead, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--upload-mb", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.chdir(work)  # the stores' artifacts land here
        files, metrics = one_cycle(work)
        size = sum(p.stat().st_size for p in files.rglob("*") if p.is_file())
        print(f"one cycle of the example: {len(list(files.rglob('*')))} files, {size / 1024:.0f} KiB, "
              f"{len(metrics)} metrics; median of {args.repeats}")  # fmt: skip
        print(f"{'cycle':<36} {'write-ahead ms':>15} {'delivery ms':>12} {'ratio':>7}")
        big = work / "profile" / "big.ntff"
        big.parent.mkdir()
        with open(big, "wb") as f:
            f.write(os.urandom(args.upload_mb * 1024**2 - 1))  # just under the copy cap
        for index, (label, upload) in enumerate((("the example's cycle", None),
                                                 (f"+ one {args.upload_mb} MiB profile file", big))):
            repeats = args.repeats if upload is None else max(3, args.repeats // 4)  # each copies the file
            folder = work / f"case-{index}"
            folder.mkdir()
            ahead, sent = measure(files, metrics, folder, repeats, upload)
            print(f"{label:<36} {ahead * 1000:>15.1f} {sent * 1000:>12.1f} {ahead / sent:>7.2f}")


if __name__ == "__main__":
    main()
