"""One columnar file per node per cycle for the rank summaries: the node's one consumer sends every
local rank's summary of a cycle in one Parquet file (`_record.node_file`, gathered by
`_delivery.node_parts`), so that more local ranks cost the tracking server next to nothing; a rank
that dies mid-run holds nobody up and is missing only from the cycles it did not reach; runs logged
before (one JSON file per rank per cycle) are read as before, beside node files.

Real jobs are `examples/ranks_straggler.py` under torchrun (gloo, CPU), into a real `mlflow
server` on 127.0.0.1 behind a proxy that counts its requests (`http_faults.FaultProxy`: one
request a connection), or into a sqlite store. The rule that decides when a node's file is made is
also checked on its own, in this process, with parts made from chosen summaries.
"""

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, artifact_files
from http_faults import FaultProxy
from mlflow.tracking import MlflowClient
from rank_shapes import Job
from servers import MlflowServer, free_port

from mlflow_neuron._analysis.ranks.frames import FRAME_COLUMNS, collectives_frame
from mlflow_neuron._delivery import entries, node_parts
from mlflow_neuron._delivery import outbox as outbox_records
from mlflow_neuron._readback.ranks import read_ranks
from mlflow_neuron._record import node_file
from mlflow_neuron._record.model import RANK_SUMMARY_FILE, Delivery, RunRef, node_file_of

EXAMPLE = ROOT / "examples" / "ranks_straggler.py"
CYCLES = 2  # the example's default: cycles end at steps 6 and 12 (wait 1, warmup 1, active 4)
MORE_PER_CYCLE = 2  # what three more local ranks may cost the tracking server a cycle, in all


def torchrun(cwd: Path, ranks: int, uri: str, *args: str, env: dict | None = None) -> list[dict]:
    """One job of `ranks` ranks of the example; each rank's JSON line, in rank order."""
    cwd.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(EXAMPLE),
               "--tracking-uri", uri, "--experiment-id", "0", "--flush-timeout-s", "120", *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return sorted(lines, key=lambda line: line["rank"])


def node_files(client: MlflowClient, run_id: str) -> list[str]:
    return sorted(p for p in artifact_files(client, run_id, "profiler/ranks"))


# ---------------------------------------------------------------- what more local ranks cost


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("server")) as running:
        yield running


def counted_job(server, proxy: FaultProxy, ranks: int, cwd: Path) -> tuple[str, list[tuple[str, str]]]:
    """A job of `ranks` ranks through the counting proxy into a run made for it beforehand (so that
    neither job creates or ends one: the requests are the cycles'); (its run id, its requests)."""
    run_id = MlflowClient(server.uri).create_run("0").info.run_id
    before = len(proxy.seen)
    torchrun(cwd, ranks, proxy.uri, env={"MLFLOW_RUN_ID": run_id})
    return run_id, [(method, path.split("?")[0]) for _, method, path, _ in proxy.seen[before:]]


def _by_kind(requests: list[tuple[str, str]]) -> Counter:
    """Requests counted by method and path; an artifact's path cut to its folder, ids left out."""
    def kind(path: str) -> str:
        path = re.sub(r"/[0-9a-f]{32}/|/tr-[0-9a-f]{32}/", "/<id>/", path)
        return path.rsplit("/", 1)[0] if "/artifacts/" in path else path

    return Counter(f"{m} {kind(p)}" for m, p in requests)


def test_three_more_local_ranks_cost_the_tracking_server_at_most_two_requests_a_cycle(server, tmp_path):
    with FaultProxy(server.port, lambda *_: None) as proxy:
        one_run, one = counted_job(server, proxy, 1, tmp_path / "one")
        four_run, four = counted_job(server, proxy, 4, tmp_path / "four")
    more = len(four) - len(one)
    print(f"1 rank: {len(one)} requests, 4 ranks: {len(four)}")
    assert more <= MORE_PER_CYCLE * CYCLES, (f"1 rank: {len(one)} requests, 4 ranks: {len(four)}; by kind, 4 ranks "
                                             f"less 1: {_by_kind(four) - _by_kind(one)}, 1 less 4: "
                                             f"{_by_kind(one) - _by_kind(four)}")  # fmt: skip
    client = MlflowClient(server.uri)
    read = read_ranks(four_run, server.uri)
    assert len(read.cycles) == CYCLES and read.notes == []
    assert {(s["rank"], s["cycle_step"]) for s in read.summaries} == {(r, c) for r in range(4) for c in read.cycles}
    files = node_files(client, four_run)
    assert sorted(node_file_of(f.removeprefix("profiler/ranks/"))[1:] for f in files) == [(c, 0) for c in read.cycles], files
    # the other ranks upload nothing of their own: no folder of theirs under the cycles
    assert not [p for p in artifact_files(client, four_run, "profiler") if "/rank_" in p], four_run
    assert len(read_ranks(one_run, server.uri).summaries) == CYCLES


# ---------------------------------------------------------------- a rank that dies mid-run


def test_a_rank_that_dies_mid_run_holds_nobody_up_and_is_missing_only_from_the_cycles_it_did_not_reach(tmp_path):
    """Rank 2 of 4 vanishes at step 9 (os._exit, no close()), inside the second cycle: the first
    cycle holds every rank, the second the three others, each cycle one file; no close() waited
    for the dead rank's part, and nothing is left in the outbox."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lines = torchrun(tmp_path, 4, uri, "--exit-rank", "2", "--exit-at", "9")
    assert [line["rank"] for line in lines] == [0, 1, 3], lines
    assert max(line["close_s"] for line in lines) < node_parts.NODE_WAIT_S / 3, lines
    run_id = lines[0]["run_id"]
    read = read_ranks(run_id, uri)
    first, second = read.cycles
    assert {(s["rank"], s["cycle_step"]) for s in read.summaries} == \
        {(r, first) for r in range(4)} | {(r, second) for r in (0, 1, 3)}  # fmt: skip
    assert read_ranks(run_id, uri, step=first).report.missing == []
    assert read_ranks(run_id, uri, step=second).report.missing == [2]
    files = node_files(MlflowClient(uri), run_id)
    assert len(files) == CYCLES, files  # each cycle once, in one file
    outbox = tmp_path / "mlflow-neuron-outbox"
    assert not outbox.exists() or not entries.listed(outbox) and not list(outbox.glob(".ranks-*/cycle_*")), \
        sorted(p.name for p in outbox.rglob("*"))  # fmt: skip


# ---------------------------------------------------------------- a server that does not answer


OFFLINE_RANK = """
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback

callback = MLflowProfilerCallback(run_id={run_id!r}, tracking_uri={uri!r}, outbox={outbox!r}, retry_wait_s=0.01,
                                  flush_timeout_s=5)
profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
callback.close()
"""


def test_while_the_server_is_dead_the_node_files_are_kept_named_and_sent_by_one_sync(tmp_path, dead_server,
                                                                                     monkeypatch):
    """Two ranks of a node (RANK 0 and 1, one outbox) profile 2 cycles into a run while its server
    does not answer: one closing warning names both cycles kept (rank 0's, carrying their node
    files, or the node files of their own); one `sync` into a live store sends both cycles, one
    file each holding both ranks, and leaves nothing behind."""
    from mlflow_neuron._delivery.sync import sync_outbox

    monkeypatch.chdir(tmp_path)  # the store keeps its artifacts under ./mlruns
    live = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = MlflowClient(live).create_run("0").info.run_id
    outbox = tmp_path / "outbox"
    script = OFFLINE_RANK.format(run_id=run_id, uri=dead_server, outbox=str(outbox))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "WORLD_SIZE": "2"}
    ranks = [subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]  # fmt: skip
    said = [rank.communicate(timeout=300) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], said
    # rank 0 names its cycles (carrying their node files where rank 0's summary came last); the last
    # rank to leave names the node files that are entries of their own, if any
    kept = [line for _, err in said for line in err.splitlines() if "were not sent" in line]
    assert kept and all("(steps 4, 8)" in line and f"sync --outbox {outbox}" in line for line in kept), said
    result = sync_outbox(str(outbox), tracking_uri=live)
    assert result.kept == 0 and not result.unreachable, result
    read = read_ranks(run_id, live)
    assert {(s["rank"], s["cycle_step"]) for s in read.summaries} == {(r, c) for r in (0, 1) for c in (4, 8)}
    assert len(node_files(MlflowClient(live), run_id)) == 2
    assert not entries.listed(outbox) and not list(outbox.glob(".ranks-*/cycle_*"))


# ---------------------------------------------------------------- runs logged before


def test_runs_logged_as_one_json_file_per_rank_stay_readable_beside_node_files(tmp_path):
    """The recorded store's 4-rank run (one JSON file per rank per cycle, cycles 10 and 20), then
    a node file of a third cycle logged into it: every summary of both kinds is read, rank 2 named."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_recorded_output import IDS, restore

    uri, run_id = restore(tmp_path / "store"), json.loads(IDS.read_text())["ranks"]
    before = read_ranks(run_id, uri)
    assert len(before.summaries) == 8 and before.cycles == [10, 20] and before.notes == []
    assert before.report.straggler["rank"] == 2, before.report.sentence
    third = Job(world_size=4, slow_rank=2, delay_us=30_000.0, hosts=["ip-10-0-0-0"] * 4).cycle(30, range(21, 29))
    path = tmp_path / "cycle_30_rank_0.parquet"
    node_file.write([{"summary": s, "manifest": None} for s in third], path, host="ip-10-0-0-0", cycle_step=30)
    MlflowClient(uri).log_artifact(run_id, str(path), "profiler/ranks/node_ip-10-0-0-0")
    after = read_ranks(run_id, uri)
    assert after.cycles == [10, 20, 30] and len(after.summaries) == 12 and after.notes == []
    assert after.report.straggler["rank"] == 2 and len(after.report.steps) > len(before.report.steps)


# ---------------------------------------------------------------- the node file and the rule, on their own


def _summary_v2(rank: int, cycle: int) -> dict:
    """A rank summary as a rank writes it now: its records' groups as indexes into `member_sets`."""
    return {"format": "mlflow-neuron/rank-summary", "version": 2, "rank": rank, "world_size": 2, "host": "h",
            "cycle_step": cycle, "timeline": "cpu", "collective_source": "backend_spans", "pid": 7,
            "steps": [{"step": 5, "step_us": 100.0}], "groups": [], "device": None, "member_sets": [[0, 1]],
            "collectives": [
                {"name": "all_reduce", "group": "0", "members": 0, "desc": "default_pg", "seq": 3, "step": 5,
                 "start_us": 1796633136911000.125, "end_us": 1796633136911012.5, "bytes": 4096, "peer": None,
                 "peer_index": None, "lane": 12},
                {"name": "send", "group": None, "members": None, "desc": None, "seq": None, "step": None,
                 "start_us": 1.5, "end_us": 2.5, "bytes": None, "peer": 1 - rank, "peer_index": 1, "lane": None}]}  # fmt: skip


def test_a_node_file_holds_the_summaries_and_their_collectives_as_the_analysis_reads_them(tmp_path):
    summaries = [_summary_v2(0, 6), _summary_v2(1, 6)]
    node_file.write([{"summary": s, "manifest": {"rank": s["rank"]}} for s in summaries], tmp_path / "n.parquet",
                    host="h", cycle_step=6)  # fmt: skip
    read, frame = node_file.read(tmp_path / "n.parquet")
    assert frame.columns.tolist() == FRAME_COLUMNS  # the analysis's table, as it is
    assert read == [{k: v for k, v in s.items() if k not in ("collectives", "member_sets")} for s in summaries]
    expected = collectives_frame(summaries)
    assert frame["members"].tolist() == expected["members"].tolist() == [(0, 1), None, (0, 1), None]
    pd.testing.assert_frame_equal(frame.drop(columns="members").astype(object).where(frame.notna(), None),
                                  expected.drop(columns="members").astype(object).where(expected.notna(), None),
                                  check_dtype=False)  # fmt: skip



def test_a_gloo_job_read_from_its_node_files_gives_the_same_report_as_its_summaries(tmp_path):
    """Two nodes of two ranks each: read back as one table (a worker thread's id and a peer index
    with gaps come as floats; beside an all-null column, as floats in an object column), the
    collectives are placed in their groups as from the summaries themselves."""
    from test_ranks_3d import gloo_job

    from mlflow_neuron._analysis.ranks.analysis import analyze
    from mlflow_neuron._readback.rank_files import parse_folder

    summaries = gloo_job("gloo_3d_slow")
    (tmp_path / "node_h").mkdir()
    for first in (0, 2):
        node_file.write([{"summary": s, "manifest": None} for s in summaries[first:first + 2]],
                        tmp_path / "node_h" / f"cycle_8_rank_{first}.parquet", host="h", cycle_step=8)  # fmt: skip
    read, table, notes = parse_folder(tmp_path)
    assert notes == [] and len(read) == 4 and table["lane"].dtype.kind == "f"
    from_lists = analyze(summaries)
    assert from_lists.unmatched == [] and from_lists.straggler["rank"] == 2
    for collectives in (table, table.astype({"lane": object, "peer_index": object})):
        assert analyze(read, collectives=collectives).to_json() == from_lists.to_json()


def test_each_group_is_written_once_a_file_and_a_version_1_file_is_still_read(tmp_path):
    """Version 2 writes a group's ranks once a file (an index a record, an index a process group);
    version 1 wrote them on every record and in every rank's process groups. Both read the same."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    summaries = [{**_summary_v2(r, 6), "groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1]}]} for r in (0, 1)]
    node_file.write([{"summary": s, "manifest": None} for s in summaries], tmp_path / "v2.parquet", host="h", cycle_step=6)
    table = pq.read_table(tmp_path / "v2.parquet")
    meta = json.loads(table.schema.metadata[node_file.METADATA_KEY])
    assert meta["version"] == 2 and meta["member_sets"] == [[0, 1]] and table.column("members").to_pylist() == [0, None] * 2
    assert [r["summary"]["groups"][0]["ranks"] for r in meta["ranks"]] == [0, 0]
    old = {**meta, "version": 1, "ranks": [{**r, "summary": {**r["summary"], "groups": s["groups"]}}
                                           for r, s in zip(meta["ranks"], summaries)]}  # fmt: skip
    old.pop("member_sets")
    listed = pa.array([[0, 1], None] * 2, pa.list_(pa.int64()))
    v1 = table.set_column(table.column_names.index("members"), "members", listed)
    pq.write_table(v1.replace_schema_metadata({node_file.METADATA_KEY: json.dumps(old)}), tmp_path / "v1.parquet")
    (read_2, frame_2), (read_1, frame_1) = node_file.read(tmp_path / "v2.parquet"), node_file.read(tmp_path / "v1.parquet")
    assert read_1 == read_2 == [{k: v for k, v in s.items() if k not in ("collectives", "member_sets")} for s in summaries]
    pd.testing.assert_frame_equal(frame_1, frame_2)
    assert frame_2["members"].tolist() == [(0, 1), None, (0, 1), None] and frame_2["members"][0] is frame_2["members"][2]


def _give(outbox: Path, area: str, rank: int, cycle: int, job: Job | None = None, run: RunRef | None = None) -> None:
    """A rank's part of a cycle, handed over as the drain hands it (`node_parts.take`)."""
    entry = outbox / f"{time.time_ns():020d}-1-{rank:06d}"
    (entry / "files").mkdir(parents=True)
    summary = (job or Job(world_size=4)).cycle(cycle, range(cycle - 2, cycle))[rank]
    (entry / "files" / RANK_SUMMARY_FILE).write_text(json.dumps(summary), encoding="utf-8")
    delivery = Delivery(step=cycle, timestamp_ms=0, artifact_dir="profiler", files_dir=str(entry / "files"),
                        rank_part=(RANK_SUMMARY_FILE, None))  # fmt: skip
    left = node_parts.take(entry, delivery, run or RunRef("http://x", "run1"), node_parts.run_folder(outbox, area))
    assert left.rank_part is None and not list((entry / "files").iterdir())
    entries.remove(entry)  # its entry is settled: it held nothing else


@pytest.fixture
def node(tmp_path):
    """An outbox with four local ranks present in run1's parts area (each holds its lock)."""
    outbox = tmp_path / "outbox"
    outbox.mkdir(mode=0o700)
    present = {r: node_parts.Presence(outbox, "run1", r) for r in range(4)}
    yield outbox, present
    for presence in present.values():
        presence.leave()


def test_a_cycle_waits_for_every_present_local_rank_then_goes_once_in_one_file(node):
    outbox, _ = node
    for rank in (0, 1, 2):
        _give(outbox, "run1", rank, 6)
    assert node_parts.due(outbox) == ([], 1)
    _give(outbox, "run1", 3, 6)
    ready, waiting = node_parts.due(outbox)
    assert waiting == 0 and [step for _, step in ready] == [6]
    entry = node_parts.make_entry(outbox, ready[0][0], 6, outbox_records.DEFAULT_COPY_MAX_BYTES)
    delivery, run = outbox_records.load(entry)
    [(name, artifact)] = delivery.placed
    assert artifact == "profiler/ranks/node_ip-10-0-0-0/cycle_6_rank_0.parquet" and run.run_id == "run1"
    summaries, frame = node_file.read(Path(delivery.files_dir) / name)
    assert [s["rank"] for s in summaries] == [0, 1, 2, 3] and sorted(set(frame["rank"])) == [0, 1, 2, 3]
    assert node_parts.due(outbox) == ([], 0) and node_parts.pending(outbox, "run1") == [6]  # the parts are gone


def test_a_cycle_does_not_wait_for_a_rank_that_is_gone_or_past_it_nor_past_the_longest_wait(node, monkeypatch):
    outbox, present = node
    for rank in (0, 1):
        _give(outbox, "run1", rank, 6)
    _give(outbox, "run1", 2, 12)  # rank 2 has none of cycle 6 (its trace could not be read) but one of 12
    assert node_parts.due(outbox) == ([], 2)  # 6 waits for rank 3; 12 for ranks 0, 1, 3
    present[3].leave()  # rank 3 closed, or died: the kernel frees its lock
    queued = outbox / f"{time.time_ns():020d}-1-000009"
    (queued / "files").mkdir(parents=True)
    (queued / "job.json").write_text("{}", encoding="utf-8")
    assert node_parts.due(outbox) == ([], 2)  # a gone rank's last cycle may wait in the queue: not yet
    entries.remove(queued)
    ready, waiting = node_parts.due(outbox)
    assert [step for _, step in ready] == [6] and waiting == 1
    monkeypatch.setattr(node_parts, "NODE_WAIT_S", 0.0)  # a rank that lives on and never sends one: hung
    assert sorted(step for _, step in node_parts.due(outbox)[0]) == [6, 12]


class _Killed(BaseException):
    """The process that prepares an entry, ended there (a kill): nothing after it runs."""


class _Preparer:
    """`_record.prepare.Preparer` as the drain uses it, for rank 0's cycle 6: sent anyway (a
    metric), its summary staged for its node's file while its trace is there to read."""

    trace_left = True

    def __init__(self, reporter, **settings) -> None:
        self.last_profile = None

    def absorb(self, data: dict) -> None:
        pass

    def export(self) -> dict:
        return {}

    def with_run_summary(self, delivery: Delivery) -> Delivery:
        return delivery

    def prepare(self, job) -> Delivery:
        part = None
        if _Preparer.trace_left:  # read once: a preparation read its trace and removed it
            (job.staged_dir / RANK_SUMMARY_FILE).write_text(json.dumps(Job(world_size=4).cycle(6, range(4, 6))[0]))
            part, _Preparer.trace_left = (RANK_SUMMARY_FILE, None), False
        return Delivery(step=6, timestamp_ms=0, artifact_dir="profiler/step_6", files_dir=str(job.staged_dir),
                        metrics={"profiler/step_time_us": 1.0}, rank_part=part)  # fmt: skip


def _node_summaries(outbox: Path, entry: Path) -> dict[str, list[int]]:
    """{artifact path: its ranks} of every node file of the outbox: in the entry's record, and in
    the node entries its parts still make."""
    files = {}
    for ready, step in node_parts.due(outbox)[0]:
        node_parts.make_entry(outbox, ready, step, outbox_records.DEFAULT_COPY_MAX_BYTES)
    for each in entries.listed(outbox):
        delivery, _ = outbox_records.load(each)
        for name, artifact in delivery.placed:
            files[artifact] = [s["rank"] for s in node_file.read(Path(delivery.files_dir) / name)[0]]
    return files


def test_a_drain_killed_after_its_cycle_took_the_node_s_file_loses_none_of_the_other_ranks_summaries(node,
                                                                                                    monkeypatch):
    """Rank 0's part completes cycle 6 and its node's file rides in rank 0's entry; the drain
    preparing it is killed before the entry's record is written. The next drain prepares it again
    (its trace read already: no summary of its own now): every rank's summary of the cycle is
    still sent, in one file, and nothing is sent at a path of the cycle's own."""
    from types import SimpleNamespace

    from mlflow_neuron._delivery import preparing
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._record import prepare

    outbox, _ = node
    for rank in (1, 2, 3):
        _give(outbox, "run1", rank, 6)
    monkeypatch.setattr(prepare, "Preparer", _Preparer)
    monkeypatch.setattr(_Preparer, "trace_left", True)
    held = entries.create(outbox)
    job = SimpleNamespace(staged_dir=held.path / "files", problems=[])
    drain = Drain(outbox, SimpleNamespace(problem=lambda *args: None))
    write_record = outbox_records.write_record

    def killed(*args, **kwargs):
        raise _Killed()

    monkeypatch.setattr(preparing._outbox, "write_record", killed)
    with pytest.raises(_Killed):
        drain.prepare(held.path, job, RunRef("http://x", "run1"), {"top_k": 1}, parts="run1")
    monkeypatch.setattr(preparing._outbox, "write_record", write_record)
    Drain(outbox, SimpleNamespace(problem=lambda *args: None)).prepare(held.path, job, RunRef("http://x", "run1"),
                                                                       {"top_k": 1}, parts="run1")  # fmt: skip
    held.release()
    assert _node_summaries(outbox, held.path) == {"profiler/ranks/node_ip-10-0-0-0/cycle_6_rank_0.parquet": [0, 1, 2, 3]}
    delivery, _ = outbox_records.load(held.path)
    assert not list(Path(delivery.files_dir).iterdir())  # no node file left at profiler/step_6/


def test_a_node_file_that_cannot_be_written_costs_nothing_else_and_is_said(node, monkeypatch):
    """A rank's summary holds a number past 64 bits: rank 0's cycle, which would carry the node's
    file, is prepared without it, and the drain says the file could not be made and keeps the parts
    (it never raises into the process that drains: the helper, or a training process at close)."""
    from types import SimpleNamespace

    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._record import prepare

    outbox, _ = node
    for rank in (1, 2, 3):
        _give(outbox, "run1", rank, 6)
    part = node_parts.run_folder(outbox, "run1") / "cycle_6" / "rank_3.json"
    data = json.loads(part.read_text())
    data["summary"]["collectives"][0]["bytes"] = 2**64
    part.write_text(json.dumps(data))
    monkeypatch.setattr(prepare, "Preparer", _Preparer)
    monkeypatch.setattr(_Preparer, "trace_left", True)
    said = []
    drain = Drain(outbox, SimpleNamespace(problem=lambda kind, message, error=None: said.append((kind, message))))
    held = entries.create(outbox)
    drain.prepare(held.path, SimpleNamespace(staged_dir=held.path / "files", problems=[]), RunRef("http://x", "run1"),
                  {"top_k": 1}, parts="run1")  # fmt: skip
    held.release()
    assert outbox_records.load(held.path)[0].placed == ()  # its metrics go; the node's file is not with them
    drain.once(sends=lambda entry: False)  # sends nothing: the file is made (or not) at the pass's start
    assert {kind for kind, _ in said} == {"node_file"} and "step 6" in said[0][1], said  # the reporter says it once
    assert node_parts.pending(outbox, "run1") == [6]  # kept: `sync` tries again, the closing warning names them


def test_a_run_is_ended_only_once_its_node_files_went(node, tracking_uri):
    """Rank 0 created the run and closed (its end queued) while ranks 1-3 live on with cycle 6 to
    give: the run stays RUNNING, its end queued, until cycle 6's file is sent; then it is ended."""
    from types import SimpleNamespace

    from mlflow_neuron._delivery.drain import Drain

    outbox, _ = node
    client = MlflowClient(tracking_uri)
    run = RunRef(tracking_uri, client.create_run("0").info.run_id, run_key="key1")
    _give(outbox, "run1", 0, 6, run=run)
    held = entries.create(outbox)  # as `Producer._queue_end` queues it
    entries.write_json(held.path / entries.END, {"format": entries.FORMAT, "run": vars(run), "parts": "run1"})
    held.release()
    drain = Drain(outbox, SimpleNamespace(problem=lambda *args: None))
    done = drain.once()
    assert done.waiting == 1 and entries.state(held.path) == entries.ENDING
    assert client.get_run(run.run_id).info.status == "RUNNING"  # not ended before its node's files went
    for rank in (1, 2, 3):
        _give(outbox, "run1", rank, 6, run=run)
    drain.once()
    assert node_files(client, run.run_id) == ["profiler/ranks/node_ip-10-0-0-0/cycle_6_rank_0.parquet"]
    assert client.get_run(run.run_id).info.status == "FINISHED" and not entries.listed(outbox)


def test_the_rank_that_created_the_run_closes_within_its_wait_and_leaves_the_end_to_a_rank_that_lives_on(
        tmp_path, tracking_uri, monkeypatch):  # fmt: skip
    """Rank 0 closes while rank 1 lives on, cycle 6 still to give: rank 0's close() waits for it
    `FIRST_WAIT_S`, not its whole timeout, and says nothing is left (rank 1 sends the file and
    ends the run: its drain, here, once it gave its part and left)."""
    from types import SimpleNamespace

    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.producer import Producer

    monkeypatch.setattr(node_parts, "FIRST_WAIT_S", 0.5)
    outbox, client, said = tmp_path / "outbox", MlflowClient(tracking_uri), []
    run = RunRef(tracking_uri, client.create_run("0").info.run_id, run_key="key1")
    producer = Producer(run, SimpleNamespace(problem=lambda kind, message, error=None: said.append((kind, message))),
                        preparer={"rank": 0}, outbox=outbox, helper=False, background=False)  # fmt: skip
    area = producer.parts_area
    other = node_parts.Presence(outbox, area, 1)
    _give(outbox, area, 0, 6, Job(world_size=2), run=run)
    started = time.monotonic()
    producer.close(30.0, end_run=True)
    assert time.monotonic() - started < 10.0 and said == []
    assert client.get_run(run.run_id).info.status == "RUNNING" and len(entries.listed(outbox)) == 1  # its end
    _give(outbox, area, 1, 6, Job(world_size=2), run=run)
    other.leave()
    Drain(outbox, SimpleNamespace(problem=lambda *args: None)).once()
    assert node_files(client, run.run_id) == ["profiler/ranks/node_ip-10-0-0-0/cycle_6_rank_0.parquet"]
    assert client.get_run(run.run_id).info.status == "FINISHED" and not entries.listed(outbox)


def _end_then_a_file_only_a_pass_s_end_can_make(outbox: Path, client: MlflowClient, gone: tuple) -> RunRef:
    """A run whose end is queued (rank 0 left it), ranks 0 and 1 of 3 with their parts of cycle 6
    in, rank 2 gone without one, and behind the end an entry still to prepare (damaged): cycle 6's
    file can be made only once that one is, after a pass met the end. The ranks `gone` came and left."""
    run = RunRef(client.tracking_uri, client.create_run("0").info.run_id, run_key="key1")
    area = node_parts.area_name(run)
    present = [node_parts.Presence(outbox, area, rank) for rank in gone]
    for rank in (0, 1):
        _give(outbox, area, rank, 6, Job(world_size=3), run=run)
    for queued in (entries.END, entries.JOB):  # the run's end, then an entry still to prepare
        held = entries.create(outbox)
        entries.write_json(held.path / queued, {"format": entries.FORMAT, "run": vars(run), "parts": area})
        held.release()
    for presence in present:
        presence.leave()
    return run


def test_the_last_local_rank_to_leave_ends_the_run_another_rank_queued_the_end_of(tmp_path, tracking_uri):
    """Rank 1 closes last, after the pass that met the run's end (rank 0's): its close() sends
    the node's file and still ends the run."""
    from types import SimpleNamespace

    from mlflow_neuron._delivery.producer import Producer

    outbox, client, said = tmp_path / "outbox", MlflowClient(tracking_uri), []
    run = _end_then_a_file_only_a_pass_s_end_can_make(outbox, client, gone=(0, 2))
    producer = Producer(run, SimpleNamespace(problem=lambda kind, message, error=None: said.append(kind)),
                        preparer={"rank": 1}, outbox=outbox, helper=False, background=False, first=False)  # fmt: skip
    producer.close(30.0, end_run=False)
    assert node_files(client, run.run_id) == ["profiler/ranks/node_ip-10-0-0-0/cycle_6_rank_0.parquet"]
    assert client.get_run(run.run_id).info.status == "FINISHED" and not entries.listed(outbox), said


def test_one_sync_sends_a_node_file_it_can_make_only_at_its_pass_s_end_and_then_ends_the_run(tmp_path, tracking_uri):
    """Every rank is gone: one `sync` sends cycle 6's file and ends the run (its one pass met the
    end before it could make the file)."""
    from mlflow_neuron._delivery.sync import sync_outbox

    outbox, client = tmp_path / "outbox", MlflowClient(tracking_uri)
    run = _end_then_a_file_only_a_pass_s_end_can_make(outbox, client, gone=(0, 1, 2))
    sync_outbox(str(outbox), tracking_uri=tracking_uri)
    assert node_files(client, run.run_id) == ["profiler/ranks/node_ip-10-0-0-0/cycle_6_rank_0.parquet"]
    assert client.get_run(run.run_id).info.status == "FINISHED" and not entries.listed(outbox)
