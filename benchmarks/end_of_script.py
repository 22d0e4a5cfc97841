"""The end of a script, with the callback's defaults: is every cycle in MLflow when it ends, and how
long after its last line does it end?

    python benchmarks/end_of_script.py [--hogs 0,2] [--repeats 2]

Each scenario runs tests/test_end_of_script.py's script (the reference loop, one cycle every 4
steps) with the callback's defaults (`flush_timeout_s=10`, the helper process), its output through
pipes as `python train.py 2>&1 | tee log` gives it:

- container, own run: `unshare --pid --fork --mount-proc` (the script is PID 1: when it ends, the
  kernel kills what is left), 6 cycles into the run the callback creates (FINISHED?);
- container, user's run: 12 cycles, a 2 s step, in `mlflow.start_run()`;
- pipe: 6 cycles, no container;
- hung server: a server that accepts connections and never answers, in a container; then
  `mlflow-neuron sync --outbox ... --tracking-uri <sqlite>` from this namespace.

"after last line" is the time from the script's last line to the end of its pipes (for the hung
server, also from the loop's last step, which includes the profiler's stop); "cycles" is
cycles in MLflow, each once, of those profiled. With `--hogs 2`, two busy Python processes run
beside the script (the CPU of a shared node).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fault_scenarios import count_cycles  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from servers import HungServer  # noqa: E402
from test_end_of_script import RANK, SCRIPT, container_available  # noqa: E402

from mlflow_neuron.cli import main as cli_main  # noqa: E402

SLOW_STEP = "import workloads; _n = workloads.rms_norm_naive; workloads.rms_norm_naive = lambda *a: (time.sleep({s}), _n(*a))[1]\n"


@contextmanager
def hogs(count: int):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def scenario(work: Path, uri: str, *, cycles: int, container: bool, user_run: bool = False,
             step_s: float = 0.0) -> dict:  # fmt: skip
    code = SCRIPT.format(tests=str(ROOT / "tests"), uri=uri, budget=10.0, cycles=cycles, user_run=user_run,
                         outbox=str(work / "outbox"))  # fmt: skip
    code = code.replace("from workloads import profile_rmsnorm\n", "from workloads import profile_rmsnorm\n"
                        + (SLOW_STEP.format(s=step_s) if step_s else ""))  # fmt: skip
    code = code.replace("flush_timeout_s=10.0, ", "")  # the default
    command = [sys.executable, "-c", code]
    if container:
        command = ["unshare", "--pid", "--fork", "--mount-proc", *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    ended = time.time()
    last = [float(line.split()[2]) for line in result.stdout.splitlines() if line.startswith("LAST LINE")]
    loop_end = [float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("CYCLE")]
    kept = [line for line in result.stderr.splitlines() if "were not sent to" in line]
    return {"exit": result.returncode, "after": ended - last[0] if last else float("nan"), "kept_line": kept,
            "after_loop": ended - loop_end[-1] if loop_end else float("nan"),
            "stderr": result.stderr}  # fmt: skip


def cycles_in(uri: str, name: str, cycles: int) -> tuple[str, str]:
    client = MlflowClient(uri)
    runs = client.search_runs(["0"], filter_string=f"attributes.run_name = '{name}'")
    if not runs:
        return f"0/{cycles}", "no run"
    present, duplicated = count_cycles(client, runs[0].info.run_id, [4 * (i + 1) for i in range(cycles)])
    return f"{present}/{cycles}" + (f" ({duplicated} twice)" if duplicated else ""), runs[0].info.status


def helpers_rss_kb() -> dict[int, int]:
    """{pid: VmRSS in KiB} of every helper process running now."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"mlflow_neuron._delivery.helper" in (proc / "cmdline").read_bytes():
                rss = [line for line in (proc / "status").read_text().splitlines() if line.startswith("VmRSS:")]
                found[int(proc.name)] = int(rss[0].split()[1]) if rss else 0
        except OSError:
            continue
    return found


def ranks_sharing_an_outbox(ranks: int) -> tuple[int, int, float, int]:
    """(helper processes that lived a second or more, ranks whose helper became the consumer, the
    peak RSS of all helpers together over one helper's peak, cycles in MLflow of those profiled)."""
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "barrier").mkdir()
        code = RANK.format(tests=str(ROOT / "tests"), uri=f"sqlite:///{work / 'mlflow.db'}", outbox=str(work / "outbox"),
                           budget=120, barrier=str(work / "barrier"), ranks=ranks)  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
        procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], cwd=work, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True) for r in range(ranks)]  # fmt: skip
        seen: dict[int, int] = {}  # pid -> samples alive
        peak_sum, peak_one = 0, 0
        while any(p.poll() is None for p in procs):
            now = helpers_rss_kb()
            for pid in now:
                seen[pid] = seen.get(pid, 0) + 1
            peak_sum, peak_one = max(peak_sum, sum(now.values())), max([peak_one, *now.values()])
            time.sleep(0.1)
        reports = [json.loads(p.stdout.read().strip().splitlines()[-1]) for p in procs]
        client, present = MlflowClient(f"sqlite:///{work / 'mlflow.db'}"), 0
        for rank in range(ranks):  # read from MLflow, not the callbacks' counters
            runs = client.search_runs(["0"], filter_string=f"attributes.run_name = 'rank{rank}'")
            present += count_cycles(client, runs[0].info.run_id, [4, 8])[0] if runs else 0
    lived = sum(count >= 10 for count in seen.values())
    return lived, sum(r["became_consumer"] for r in reports), peak_sum / max(peak_one, 1), present


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--hogs", default="0,2", help="CPU hogs beside the script, a comma list (default 0,2)")
    options.add_argument("--repeats", type=int, default=2)
    options.add_argument("--ranks", type=int, default=8, help="ranks sharing one outbox (0: skip)")
    args = options.parse_args()
    if container_available():
        print(f"containers unavailable: {container_available()}")
        return 2
    rows = []
    for count in [int(h) for h in args.hogs.split(",")]:
        for repeat in range(args.repeats):
            for name, kw in (("container, own run", dict(cycles=6, container=True)),
                             ("container, user's run", dict(cycles=12, container=True, user_run=True, step_s=0.5)),
                             ("pipe", dict(cycles=6, container=False))):  # fmt: skip
                with tempfile.TemporaryDirectory() as scratch, hogs(count):
                    work = Path(scratch)
                    uri = f"sqlite:///{work / 'mlflow.db'}"
                    out = scenario(work, uri, **kw)
                    got, status = cycles_in(uri, "user" if kw.get("user_run") else "script", kw["cycles"])
                rows.append((count, name, got, status, f"{out['after']:.1f}", "; ".join(out["kept_line"])[:90] or "-"))
            with tempfile.TemporaryDirectory() as scratch, hogs(count):
                work = Path(scratch)
                with HungServer() as hung:
                    out = scenario(work, hung.uri, cycles=3, container=True)
                store = f"sqlite:///{work / 'mlflow.db'}"
                os.chdir(work)
                with redirect_stdout(io.StringIO()):
                    code = cli_main(["sync", "--outbox", str(work / "outbox"), "--tracking-uri", store])
                os.chdir(ROOT)
                got, status = cycles_in(store, "script", 3)
                rows.append((count, "hung server, then sync", f"{got} (sync exit {code})", status,
                             f"{out['after']:.1f} ({out['after_loop']:.1f} after the loop)",
                             "named" if out["kept_line"] else "NOT NAMED"))  # fmt: skip
    if args.ranks:
        lived, consumers, ratio, delivered = ranks_sharing_an_outbox(args.ranks)
        rows.append((0, f"{args.ranks} ranks, one outbox", f"{delivered}/{2 * args.ranks}", "-",
                     f"helper processes alive >= 1 s: {lived}; consumers: {consumers}; RSS of all helpers / one: "
                     f"{ratio:.2f}x", "-"))  # fmt: skip
    header = ("hogs", "scenario", "cycles in MLflow", "run", "after last line (s)", "kept, named")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
