"""Issue #10's closing figures: what a user sees when the server is down, refuses or hangs.

    python benchmarks/edges.py            # about 2 minutes

1. every command against a dead (port 9), refusing (free port) and hung (accepts, never answers)
   server: exit code, seconds, lines of output;
2. the shutdown budget against a hung server (default flush_timeout_s=10), with and without close();
3. a callback whose run does not exist, then `mlflow-neuron sync` twice.

Everything runs on 127.0.0.1, in fresh interpreters, as a user would run it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from servers import HungServer, MlflowServer, free_port  # noqa: E402
from shutdown_budget import budget_script, moments  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
ENV.pop("MLFLOW_TRACKING_URI", None)
CLI = [sys.executable, "-m", "mlflow_neuron.cli"]
NO_SUCH_RUN = "0123456789abcdef0123456789abcdef"


def timed(argv: list[str], cwd: Path) -> tuple[int, float, str, str]:
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)
    return result.returncode, time.monotonic() - started, result.stdout, result.stderr


def unreachable(work: Path) -> None:
    print("## 1. unreachable servers\n\n| server | command | exit | seconds | lines | output |\n|---|---|---|---|---|---|")
    hung = HungServer(lifetime_s=600)
    (work / "outbox").mkdir()
    commands = {
        "compare": ["compare", "--experiment", "rmsnorm-variants", "--fail-if-slower", "10"],
        "annotate": ["annotate", "--model", "rmsnorm", "--version", "1", "--run", NO_SUCH_RUN],
        "ingest": ["ingest", str(ROOT / "tests")],
        "sync": ["sync", "--outbox", str(work / "outbox")],
    }
    servers = {"dead :9": "http://127.0.0.1:9", "refusing": f"http://127.0.0.1:{free_port()}", "hung": hung.uri}
    for label, uri in servers.items():
        for name, argv in commands.items():
            code, seconds, out, err = timed(CLI + argv + ["--tracking-uri", uri], work)
            lines = (out + err).strip().splitlines()
            print(f"| {label} | {name} | {code} | {seconds:.1f} | {len(lines)} | `{lines[-1] if lines else ''}` |")
    hung.close()


def budget(work: Path) -> None:
    print("\n## 2. shutdown against a hung server, flush_timeout_s=10 (default)\n")
    print("| cycles processed | close() | profiler exit | close() | to last atexit | to process exit | records in outbox |")
    print("|---|---|---|---|---|---|---|")
    hung = HungServer(lifetime_s=600)
    for helper, close in ((False, True), (False, False), (True, True), (True, False)):
        outbox = work / f"outbox-{close}-{helper}"
        result = subprocess.run([sys.executable, "-c", budget_script(hung.uri, str(outbox), close, helper=helper)],
                                capture_output=True, text=True, env=ENV, cwd=work, timeout=480)  # fmt: skip
        exited = time.time()
        t = moments(result.stdout)
        if "helper_not_started" in t:
            print(f"| helper process | {'yes' if close else 'no'} | the helper did not start within 300 s | | | | |")
            continue
        start = t["loop_end"]
        closed = f"{t['closed'] - t['profiler_exited']:.2f} s" if close else "-"
        records = len([p for p in outbox.iterdir() if not p.name.startswith(".")]) if outbox.is_dir() else 0
        print(f"| {'helper process' if helper else 'in-process'} | {'yes' if close else 'no'} | "
              f"{t['profiler_exited'] - start:.2f} s | {closed} | "
              f"{t['last_atexit'] - start:.2f} s | {exited - start:.2f} s | {records} |")  # fmt: skip
    hung.close()


REJECTED_SCRIPT = """
import time, warnings
from mlflow_neuron import MLflowProfilerCallback
from workloads import profile_rmsnorm
started = time.monotonic()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    callback = MLflowProfilerCallback(run_id=RUN, tracking_uri=URI, outbox=OUTBOX)
    profile_rmsnorm(callback)
    callback.close()
print(f"callback: {time.monotonic() - started:.2f} s, warnings from mlflow-neuron:")
for w in caught:
    if "mlflow-neuron" in str(w.message):
        print("  ", w.message)
"""


def rejected(work: Path) -> None:
    print("\n## 3. a run that does not exist, then sync twice\n")
    with MlflowServer(work / "server") as server:
        server.start()
        outbox = work / "outbox-rejected"
        code = f"RUN = {NO_SUCH_RUN!r}\nURI = {server.uri!r}\nOUTBOX = {str(outbox)!r}\n" + REJECTED_SCRIPT
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=work,
                                timeout=300)  # fmt: skip
        print("```\n" + result.stdout.strip())
        for record in sorted((outbox / "rejected").iterdir()):
            print(f"{record.relative_to(work)}/reason: {(record / 'reason').read_text().strip()}")
        for attempt in (1, 2):
            code_, seconds, out, err = timed(CLI + ["sync", "--outbox", str(outbox)], work)
            print(f"$ mlflow-neuron sync --outbox {outbox.name}   # try {attempt}: exit {code_}, {seconds:.1f} s")
            print((out + err).strip())
        target = subprocess.run(
            [sys.executable, "-c", f"from mlflow import MlflowClient; print(MlflowClient({server.uri!r})"
             ".create_run('0').info.run_id)"], capture_output=True, text=True, env=ENV).stdout.strip()  # fmt: skip
        code_, seconds, out, err = timed(CLI + ["sync", "--outbox", str(outbox), "--retry-rejected", "--run-id", target],
                                         work)  # fmt: skip
        print(f"$ mlflow-neuron sync --outbox {outbox.name} --retry-rejected --run-id {target}   # exit {code_}, "
              f"{seconds:.1f} s")  # fmt: skip
        print((out + err).strip() + "\n```")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="mlflow-neuron-edges-") as tmp:
        unreachable(Path(tmp))
        budget(Path(tmp))
        rejected(Path(tmp))
