"""The command line's words: its parser, the checks on every value, and its exit codes.

A bad value is a usage error (exit 2, one line from argparse, pointing at the command's own
`--help`), wherever it is given. Standard library only: a usage error is reported before torch
or MLflow is imported.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from .. import __version__
from .._delivery.outbox import DEFAULT_OUTBOX
from .._record.capture_request import DEFAULT_STEPS, MAX_STEPS, PLAN_TAG, POLL_S, REQUEST_TAG, check_steps
from .._record.model import NO_STRAGGLER, RANKS_SKEW_METRIC, RANKS_STRAGGLER_METRIC, RANKS_WAIT_METRIC, neuron_dir

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
EXIT_OK = 0
EXIT_FAILED = 1  # compare: the gate found a regression; sync: records were kept or found damaged
EXIT_USAGE = 2  # bad arguments, or a run, experiment, model version or folder that does not exist
EXIT_UNREACHABLE = 3  # the tracking server is down, refuses, or does not answer in time; nothing was changed
EXIT_INCONCLUSIVE = 4  # compare --fail-if-inconclusive: host time of runs that saw different host load
EXIT_BUSY = 5  # sync: another sync is delivering this outbox; nothing was done
EXIT_INTERNAL = 70  # an error of mlflow-neuron itself (sysexits' EX_SOFTWARE): a bug, never read as a regression


def non_negative_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 1, "an integer >= 1")


def non_negative_float(text: str) -> float:
    return _checked(text, float, lambda v: v >= 0 and v == v and v != float("inf"), "a number >= 0")


def positive_float(text: str) -> float:
    return _checked(text, float, lambda v: v > 0 and v == v and v != float("inf"), "a number > 0")


def run_id(text: str) -> str:
    """A run id as MLflow makes them: 32 hexadecimal digits (a run name is not looked up here)."""
    if not _RUN_ID.match(text):
        raise argparse.ArgumentTypeError(f"expected a run id (32 hexadecimal digits), got {text!r}")
    return text


def _checked(text: str, kind: type, ok, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


TRACKING_URI_HELP = ("MLflow tracking server or store, e.g. http://127.0.0.1:5000 or sqlite:///mlflow.db "
                     "(default: MLFLOW_TRACKING_URI, else ./mlflow.db)")  # fmt: skip


class CommandParser(argparse.ArgumentParser):
    """Usage errors in one line (exit 2), pointing at --help instead of printing the usage."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _outbox_folder(text: str) -> str:
    """An outbox given explicitly must be an existing folder: a typo is not an empty outbox."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist (the outbox is a folder the callback writes)")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder (the outbox is a folder the callback writes)")
    return text


def parser() -> CommandParser:
    root = CommandParser(prog="mlflow-neuron", description="PyTorch profiler results as MLflow data.",
                     epilog="exit codes: 0 done, 1 regression found (compare) or records kept or damaged (sync), "
                     "2 usage error or unknown run/experiment/model version (or a run without what the command reads), 3 tracking server unreachable "
                     "(nothing changed), 4 inconclusive (compare --fail-if-inconclusive), 5 another sync is "
                     "delivering the outbox, 70 an internal error (a bug in mlflow-neuron)")  # fmt: skip
    root.add_argument("--version", action="version", version=f"mlflow-neuron {__version__}")
    root.add_argument("-v", "--verbose", action="store_true", help="show MLflow's own INFO messages")
    commands = root.add_subparsers(dest="command", required=True)
    sync_cmd = commands.add_parser(
        "sync",
        help="send cycles kept in the outbox to their runs",
        description="Send profiler cycles kept in the outbox to their MLflow runs, then remove them.\n"
        "Records the server refused for good (the run does not exist or was deleted, permission denied,\n"
        "an invalid value) wait in <outbox>/rejected/ with a reason file; --retry-rejected sends them again.\n"
        "Each record's files are checked against the size and SHA-256 taken when it was written; a damaged\n"
        "record is never sent: it waits in <outbox>/damaged/ with a reason file (--retry-damaged).\n"
        "Queued cycles (a training process that ended, was killed, or ran in a container that ended) are\n"
        "read from their saved traces and sent; a run the callback created is ended once its cycles are in.\n"
        "One consumer at a time per outbox: while a training job's helper or another sync delivers it,\n"
        "sync says which process holds it and exits 5.\n\n"
        "example: mlflow-neuron sync --outbox ./mlflow-neuron-outbox\n"
        "         mlflow-neuron sync --retry-rejected --run-id 0123abcd...   # refused records, into another run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sync_cmd.add_argument("--outbox", type=_outbox_folder,
                          help=f"outbox folder (default: ./{DEFAULT_OUTBOX}, if there is one)")  # fmt: skip
    sync_cmd.add_argument("--tracking-uri", help="send to this tracking server or store instead of the one each "
                          "record names, e.g. http://127.0.0.1:5000 or sqlite:///mlflow.db")  # fmt: skip
    sync_cmd.add_argument("--retry-rejected", action="store_true",
                          help="send the records in <outbox>/rejected/ again (nothing else)")  # fmt: skip
    sync_cmd.add_argument("--retry-damaged", action="store_true",
                          help="check the records in <outbox>/damaged/ again (after restoring their files) "
                          "and send those that are whole (nothing else)")  # fmt: skip
    sync_cmd.add_argument("--run-id", help="with --retry-rejected: send them into this run instead")

    cmp = commands.add_parser(
        "compare",
        help="per-op comparison of profiled runs; a CI gate with --fail-if-slower",
        description="Compare profiled runs op by op against a baseline.\n\n"
        "More than 8 runs: a table of every run from the summary metrics logged with it (median per step,\n"
        "its 95% interval, n, ratio of medians to the baseline), then in detail, from their per-step\n"
        "samples, only the baseline, runs named with --detail, the 5 runs that moved most (those whose\n"
        "summaries differ beyond the noise first) and, with --fail-if-slower, every run whose\n"
        "summaries cannot rule out the line. The gate judges only the runs shown in detail.\n\n"
        "example: mlflow-neuron compare --experiment rmsnorm-variants --baseline naive --fail-if-slower 10",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmp.add_argument("--experiment", help="experiment name: its latest variants, and where run names are looked up")
    cmp.add_argument("--runs", nargs="+", help="run ids, run names, parent runs, or models:/NAME/VERSION")
    cmp.add_argument("--baseline", help="run name or id to compare against (default: the first run)")
    cmp.add_argument("--metric", default="self_device_time_us",
                     choices=["self_device_time_us", "self_cpu_time_us", "peak_memory_bytes"],
                     help="what to compare: device time (default; every run is compared on self CPU time "
                     "instead when one has no device time, and the output says so), self CPU time, or each "
                     "step's peak memory (profile_memory=True)")
    cmp.add_argument("--region", metavar="NAME",
                     help="compare this record_function range: its time with everything it runs, per step, with "
                     "the same statistics and gate as the total; the rows are the ops inside it")
    cmp.add_argument("--step", type=non_negative_int,
                     help="only the profiler cycle logged at this step (default: the steps of every cycle)")
    cmp.add_argument("--skip-steps", type=non_negative_int, default=0, metavar="K",
                     help="leave out each run's first K profiled steps (default: %(default)s)")
    cmp.add_argument("--noise-pct", type=non_negative_float, default=2.0, metavar="PCT",
                     help="changes smaller than this are 'no change' (default: %(default)s)")
    cmp.add_argument("--top", type=positive_int, default=15, help="ops shown in table/markdown (default: %(default)s)")
    cmp.add_argument("--format", default="table", choices=["table", "markdown", "csv", "json"],
                     help="table (default) or markdown for people; csv and json keep every field and whole op names")
    cmp.add_argument("--fail-if-slower", type=non_negative_float, metavar="PCT",
                     help="exit 1 if the whole 95%% interval of an op or the total is above +PCT%% (host time: "
                          "only runs of one interleaved() call, over 5-7 or more cycles each, at "
                          "1 - 0.05/rows; docs/cli.md)")
    cmp.add_argument("--fail-if-inconclusive", action="store_true",
                     help="exit 4 when host time was not judged because the host was busy or the runs saw "
                     "different host load (a CI job can retry on a quieter host); a proven regression still exits 1")
    cmp.add_argument("--host-load-threshold", type=non_negative_float, default=0.5, metavar="CORES",
                     help="host time is inconclusive when the runs' cores busy with other processes differ by "
                     "more than this (default: %(default)s)")
    cmp.add_argument("--host-busy-share", type=non_negative_float, default=0.25, metavar="SHARE",
                     help="host time is inconclusive when other processes kept more than this share of either "
                     "run's CPUs busy (default: %(default)s, half a core on 2 CPUs)")
    cmp.add_argument("--min-time-us", type=non_negative_float, default=0.0, metavar="US",
                     help="the gate ignores ops below this median in both runs (the total is always checked)")
    cmp.add_argument("--detail", nargs="+", metavar="RUN",
                     help="with more than 8 runs: also show these runs in detail (run names or ids)")
    cmp.add_argument("--tables", action="store_true",
                     help="with more than 8 runs: read every run's tables and show each in detail, as for a few runs, "
                     "instead of an overview from the summary metrics logged with each run (slower: a few hundred ms "
                     "a run through a server; the gate then judges every run)")
    cmp.add_argument("--log-to", metavar="RUN_ID", help="attach the table, a PNG chart and an HTML report to this run")
    cmp.add_argument("--tracking-uri", help=TRACKING_URI_HELP)

    ing = commands.add_parser(
        "ingest",
        help="log a Neuron profile folder, a tensorboard trace folder or a chrome trace into a run",
        description="Log profiles taken elsewhere, with the same metrics and layout as the callback.\n\n"
        "A folder of one trace a rank (a torchrun job's): the lowest rank's cycle is logged in full, and\n"
        "the other ranks' summaries as Parquet files by host and cycle, read by a pool of processes\n"
        "(one a CPU, at most 8); `mlflow-neuron ranks RUN` then reads them.\n\n"
        "example: mlflow-neuron ingest ./neuron_profile --experiment trn2-runs --run-name llama-step",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ing.add_argument("path", help="Neuron profile output folder, tensorboard trace folder, or one trace file")
    target = ing.add_mutually_exclusive_group()
    target.add_argument("--run-id", help="log into this existing run")
    target.add_argument("--experiment", help="create a run in this experiment (created if missing)")
    ing.add_argument("--run-name", help="name of the created run (default: the folder's name)")
    ing.add_argument("--top-k", type=non_negative_int, default=50,
                     help="ops that get per-op metrics (default: %(default)s); ops.json keeps every op")  # fmt: skip
    ing.add_argument("--max-file-mb", type=non_negative_float,
                     help="larger files are listed, not uploaded (default: no cap)")  # fmt: skip
    ing.add_argument("--no-timeline", dest="timeline", action="store_false",
                     help="do not log each cycle as an MLflow trace (its timeline)")  # fmt: skip
    ing.add_argument("--timeline-max-spans", type=positive_int, default=2000,
                     help="spans per cycle trace at most (default: %(default)s)")  # fmt: skip
    ing.add_argument("--tracking-uri", help=TRACKING_URI_HELP)

    opn = commands.add_parser(
        "open",
        help="download a cycle's Neuron session folder and open it in Neuron Explorer",
        description=f"Download a profiled cycle's Neuron files ({neuron_dir('<N>')}/, layout kept) and run\n"
        "`neuron-explorer view -d <session>`; without neuron-explorer installed, print that command.\n\n"
        "example: mlflow-neuron open 0123abcd... --step 4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    opn.add_argument("run", help="the profiled run's id")
    opn.add_argument("--step", type=non_negative_int,
                     help="profiler cycle (default: the last with Neuron files)")
    opn.add_argument("--dest", help="download folder (default: ./mlflow-neuron-open/<run id>/step_<N>)")
    opn.add_argument("--no-launch", action="store_true", help="download and print the command, do not run it")
    opn.add_argument("--tracking-uri", help=TRACKING_URI_HELP)

    ann = commands.add_parser(
        "annotate",
        help="put a run's profile on a registered model version (perf.* tags, description table)",
        description="Annotate a registered model version with the profile of a run.\n\n"
        "example: mlflow-neuron annotate --model rmsnorm --version 3 --run 0123abcd...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ann.add_argument("--model", required=True)
    ann.add_argument("--version", required=True)
    ann.add_argument("--run", required=True, help="the profiled run's id")
    ann.add_argument("--step", type=non_negative_int, help="profiler cycle (default: the run's last)")
    ann.add_argument("--baseline", metavar="RUN_ID", help="also state the verdict against this run (perf.verdict)")
    ann.add_argument("--skip-steps", type=non_negative_int, default=0, metavar="K",
                     help="leave out the first K profiled steps of each run (default: %(default)s)")
    ann.add_argument("--tracking-uri", help=TRACKING_URI_HELP)

    _history_parser(commands)
    _ranks_parser(commands)
    _capture_parser(commands)
    for command in commands.choices.values():  # -v also after the command name
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="show MLflow's own INFO messages")  # fmt: skip
    root.commands = commands.choices  # each command's own parser, for its own usage errors
    return root


def usage_error(args: argparse.Namespace, root: CommandParser, extra: list[str]) -> None:
    """Exits 2 with one line, pointing at the command's own --help, for what argparse cannot see
    by itself: arguments the command does not take, and arguments that go only together."""
    command = root.commands[args.command]
    if extra:
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "compare" and not (args.runs or args.experiment):
        command.error("name the runs to compare (--runs RUN ...) or an experiment (--experiment NAME)")
    if args.command == "sync" and args.run_id and not args.retry_rejected:
        command.error("--run-id goes with --retry-rejected")
    if args.command == "sync" and args.retry_rejected and args.retry_damaged:
        command.error("--retry-rejected and --retry-damaged go one at a time")
    if args.command == "history" and args.metric == "wait_us" and (args.region or args.op):
        command.error("--metric wait_us is the wait of the whole step: it takes no --region or --op")
    if args.command == "ingest" and not Path(args.path).exists():
        command.error(f"{args.path} does not exist")


def _history_parser(commands) -> None:
    his = commands.add_parser(
        "history",
        help="an experiment's runs in start order, and where the series changed (a CI gate with --fail-on-change)",
        description="Find the runs where a series of profiled runs (a nightly profile, one run per commit) got\n"
        "slower or faster: change points of the runs' per-step samples, each confirmed by the ratio of\n"
        "the two segments with its 95% interval.\n\n"
        "example: mlflow-neuron history --experiment nightly --run-name llama-step --fail-on-change 10",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    his.add_argument("--experiment", required=True, help="the experiment holding the series")
    his.add_argument("--run-name", help="only runs of this name")
    his.add_argument("--filter", metavar="FILTER", help="an MLflow search filter, such as \"tags.branch = 'main'\"")
    his.add_argument("--metric", default="self_device_time_us",
                     choices=["self_device_time_us", "self_cpu_time_us", "peak_memory_bytes", "wait_us"],
                     help="as in compare (default: %(default)s; self CPU time where a run has no device time); "
                     "wait_us: each step's wait in collectives, the median over the ranks, from the runs' rank "
                     "summaries (runs without them are left out)")
    subject = his.add_mutually_exclusive_group()
    subject.add_argument("--region", metavar="NAME", help="a record_function region's time, not the whole step's")
    subject.add_argument("--op", metavar="NAME", help="one op's time (its name as ops.json has it)")
    his.add_argument("--noise-pct", type=non_negative_float, default=2.0, metavar="PCT",
                     help="a change must have its whole 95%% interval beyond +-PCT%% (default: %(default)s)")
    his.add_argument("--fail-on-change", type=non_negative_float, metavar="PCT",
                     help="exit 1 when the latest segment is slower than the one before, its whole 95%% interval "
                     "above +PCT%%")
    his.add_argument("--format", default="table", choices=["table", "markdown", "csv", "json"],
                     help="table (default) or markdown for people; csv is one row per run; json adds the changes")
    his.add_argument("--tables", action="store_true",
                     help="read every run's per-step tables, not the summary metrics logged with it (slower: "
                     "a few hundred ms a run through a server)")
    his.add_argument("--log-to", metavar="RUN_ID", help="attach history.png, history.html and history.json to this run")
    his.add_argument("--tracking-uri", help=TRACKING_URI_HELP)


def _ranks_parser(commands) -> None:
    rks = commands.add_parser(
        "ranks",
        help="every rank of a distributed run: its step, its time in collectives, the wait, and the straggler",
        description="One row per rank of a profiled torchrun job, from the rank summaries each rank logged:\n"
        "its step time (median per step, with its 95% interval), time in collectives and the wait inside\n"
        "them for the last member of their process group (medians per step, microseconds), a pipeline's\n"
        "receives' wait (its bubble) where there are any, exposed communication % and idle % of the step,\n"
        "and its host; then one sentence naming the straggler (the rank whose own time made its group wait,\n"
        "found among ranks doing the same work) with its group, or saying that none stands out.\n"
        "Clocks are aligned from the collectives where hosts' clocks differ. From 65 ranks the picture\n"
        "(--log-to) is a heat map of the wait by node. A run without rank summaries exits 2.\n\n"
        "example: mlflow-neuron ranks 0123abcd... --log-to 0123abcd...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rks.add_argument("run", type=run_id, help="the profiled run's id")
    rks.add_argument("--step", type=non_negative_int,
                     help="only the profiler cycle logged at this step (default: every cycle)")
    rks.add_argument("--format", default="table", choices=["table", "markdown", "json"],
                     help="table (default) or markdown for people; json for programs (times in microseconds)")
    rks.add_argument("--log-to", metavar="RUN_ID", type=run_id,
                     help="attach ranks/ranks.png and ranks.json to this run, and log the run-level metrics "
                     f"{RANKS_STRAGGLER_METRIC} ({NO_STRAGGLER}: none), {RANKS_SKEW_METRIC.rsplit('/', 1)[-1]} and "
                     f"{RANKS_WAIT_METRIC.rsplit('/', 1)[-1]}")
    rks.add_argument("--tracking-uri", help=TRACKING_URI_HELP)


def _capture_parser(commands) -> None:
    cap = commands.add_parser(
        "capture",
        help="ask a running job to profile its next steps (callback.schedule() reads the request)",
        description="Ask the job that writes a RUNNING run to profile its next N steps: a run tag\n"
        f"({REQUEST_TAG}) that the helper of each of the job's nodes reads within {POLL_S:.0f} s.\n"
        "Rank 0 plans the capture at a step every rank starts it at, and answers on the run\n"
        f"({PLAN_TAG}: the steps, when, why). The job must profile with callback.schedule().\n"
        "The same tag set by hand in the MLflow UI, to a number of steps, does the same.\n\n"
        "example: mlflow-neuron capture 0123abcd... --steps 6",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cap.add_argument("run", type=run_id, help="the running job's run id")
    cap.add_argument("--steps", type=request_steps, default=DEFAULT_STEPS,
                     help=f"steps to profile, after one warm-up step (default: %(default)s; at most {MAX_STEPS})")
    cap.add_argument("--tracking-uri", help=TRACKING_URI_HELP)


def request_steps(text: str) -> int:
    try:
        return check_steps(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_STEPS}, not {text!r}") from None
