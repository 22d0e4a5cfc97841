"""One rank of a multi-process job: profiles `--cycles` cycles into a shared run (for the tests).

    RANK=r WORLD_SIZE=n python tests/rank_worker.py --tracking-uri URI --out DIR [--run-id ID]
        [--cycles 20] [--all-ranks] [--dist-port P]

Prints one JSON line: what this rank read, delivered and kept.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent / "doubles")]

from torch_neuronx.profiling import NeuronConfig, NeuronProfiler  # noqa: E402  (the test double)
from workloads import profile_rmsnorm  # noqa: E402

from mlflow_neuron import MLflowProfilerCallback  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--run-id")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--all-ranks", action="store_true")
    parser.add_argument("--dist-port", type=int)
    parser.add_argument("--helper", action="store_true", help="start the helper process before the first cycle")
    args = parser.parse_args()
    if args.dist_port:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{args.dist_port}",
            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
        )  # fmt: skip
    config = NeuronConfig(profile_output_dir=args.out)
    callback = MLflowProfilerCallback(
        NeuronProfiler(config).export_trace, run_id=args.run_id, tracking_uri=args.tracking_uri,
        experiment_id="0", all_ranks=args.all_ranks, outbox=Path(args.out).parent / f"outbox_{os.getpid()}",
        retry_wait_s=0.2,
    )  # fmt: skip
    if args.helper and not callback.start_helper(300):
        raise SystemExit("the helper process did not start")
    steps = profile_rmsnorm(callback, steps=4 * args.cycles, wait=1, warmup=1, active=2, experimental_config=config)
    callback.close(timeout=120)
    print(json.dumps({
        "rank": callback.rank.rank, "steps": steps, "run_id": callback.run_id, "cycles_read": callback.cycles_read,
        "delivered": callback.cycles_logged, "kept": [str(p) for p in callback.outbox_records],
    }))  # fmt: skip
    if args.dist_port:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
