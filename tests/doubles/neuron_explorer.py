"""A stand-in `neuron-explorer`, for tests: it writes what the Neuron 2.34 documentation describes,
and misbehaves on request. Not the real tool; no value here was measured on a Trainium.

    view -d <session> --output-format parquet --output-file <dir>   Summary.parquet + Metadata.parquet
    view -d <session> --output-format summary-json                  log lines, then {"<model>": {...}}

`install(tmp_path, monkeypatch, **config)` puts it first on PATH as `neuron-explorer` and returns
the file where it appends each call's arguments (one JSON list a line). Config:

- `models`: {model: summary fields} (default: one model, `SHAPE_2_34`); `metadata`: the Metadata row;
- `split`: write the Summary table as `Summary_0.parquet` (a large table's numbered parts);
- `layout`: "flat" (one model: the tables in the --output-file folder itself) or "per_profile"
  (one sub-folder per model; the real layout of several device profiles is undocumented);
- `behaviour`: "normal", "serve_ui" (ignores --output-file and serves until killed), "into_capture"
  (writes its tables into the -d folder), "nothing" (exits 0, writes nothing), "fail" (exits 3),
  "wait_for" (waits until the file named by `release` exists, or 60 s, and records which).

Shapes (field names from the Profile Parquet Schema Reference, schema 7.4.0, and the Neuron 2.34
notice; values are stand-ins, `*_percent` as fractions as `summary-json` reports them). The notice
says `hbm_mbu_estimated_percent` holds the value of the deprecated `mbu_estimated_percent`; here
the two differ on purpose (0.176 and 0.184, both stand-ins, neither measured), so a test can tell
which of them was read:
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

SCHEMA_7_4 = {  # a subset of the documented schema 7.4 Summary fields, with stand-in values
    "total_time": 0.25, "event_count": 42,
    "mfu_estimated_percent": 0.110, "mbu_estimated_percent": 0.184,
    "mfu_max_achievable_estimated_percent": 1.3,  # a ratio that may pass 1: it must not flip the scale
    "tensor_engine_active_time_percent": 0.1675, "scalar_engine_active_time_percent": 0.383,
    "gpsimd_engine_active_time_percent": 0.563, "dma_active_time_percent": 0.476,
    "hbm_read_bytes": 4096, "hbm_write_bytes": 2048,
    "static_dma_size": 1024, "software_dynamic_dma_size": 512, "hardware_dynamic_dma_size": 256,
    "dma_transfer_average_bytes": 0, "dma_transfer_time": 0, "dma_transfer_count": 0, "dma_transfer_total_bytes": 0,
    "cc_op_time": 0.002, "cc_op_active_time": 0.0015, "cc_op_count": 3,
}  # fmt: skip
NEW_2_34 = {  # the six fields Neuron 2.34 adds; hbm_mbu = the old mbu, instruction_hbm_* = the old hbm_*
    # 0.176, not the 0.184 of mbu above: apart on purpose (module docstring), both stand-ins
    "hbm_mbu_estimated_percent": 0.176, "dma_mbu_estimated_percent": 0.091,
    "instruction_hbm_read_bytes": 4096, "instruction_hbm_write_bytes": 2048,
    "packet_hbm_read_bytes": 4608, "packet_hbm_write_bytes": 2304,
}  # fmt: skip
SHAPE_2_34 = {**SCHEMA_7_4, **NEW_2_34}
DEPRECATED = ("mbu_estimated_percent", "hbm_read_bytes", "hbm_write_bytes", "dma_transfer_average_bytes",
              "dma_transfer_time", "dma_transfer_count", "dma_transfer_total_bytes")  # fmt: skip
FUTURE = {k: v for k, v in SHAPE_2_34.items() if k not in DEPRECATED}  # a later release, deprecated fields gone
# `profile_schema_version` is the documented Metadata field (2.33's version here: 2.34's is not
# documented); the other column names are unverified, and every value is a stand-in.
METADATA = {"profile_schema_version": "12.0.1", "explorer_version": "stand-in-explorer-a",
            "compiler_version": "stand-in-compiler-a", "runtime_version": "stand-in-runtime-a",
            "driver_version": "stand-in-driver-a", "instance_type": "trn2.48xlarge"}  # fmt: skip
CONFIG_ENV = "NEURON_EXPLORER_STAND_IN"
LOG_LINES = "INFO loading profile\nWARNING some cores have empty traces {not json\n"


def install(tmp_path: Path, monkeypatch, **config) -> Path:
    bin_dir = tmp_path / "stand-in-bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "explorer-calls.jsonl"
    config_file = tmp_path / "explorer-stand-in.json"
    config_file.write_text(json.dumps({"calls": str(calls), **config}))
    tool = bin_dir / "neuron-explorer"
    tool.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_path({__file__!r}, run_name='__main__')\n")
    tool.chmod(0o755)
    monkeypatch.setenv(CONFIG_ENV, str(config_file))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    return calls


def calls_of(calls: Path) -> list[list[str]]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def write_tables(folder: Path, summary: dict | None, metadata: dict | None, split: bool = False) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    if summary is not None:
        pq.write_table(pa.table({k: [v] for k, v in summary.items()}), folder / ("Summary_0.parquet" if split
                                                                                  else "Summary.parquet"))  # fmt: skip
    if metadata is not None:
        pq.write_table(pa.table({k: [v] for k, v in metadata.items()}), folder / "Metadata.parquet")


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def main(argv: list[str]) -> int:
    config = json.loads(Path(os.environ[CONFIG_ENV]).read_text())
    with open(config["calls"], "a") as calls:
        calls.write(json.dumps(argv) + "\n")
    models = config.get("models") or {"n_5eed1e55": SHAPE_2_34}
    metadata = config.get("metadata", METADATA)
    behaviour, session = config.get("behaviour", "normal"), Path(_option(argv, "-d") or ".")
    form = _option(argv, "--output-format") or "parquet"
    if behaviour == "fail":
        print("ERROR: stand-in failure", file=sys.stderr)
        return 3
    if behaviour == "wait_for":
        deadline = time.monotonic() + 60
        while not Path(config["release"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(config["calls"], "a") as calls:
            calls.write(json.dumps(["released" if Path(config["release"]).exists() else "timed out"]) + "\n")
    if form == "summary-json":
        print(LOG_LINES + json.dumps(models, indent=2))
        return 0
    if behaviour == "serve_ui":
        print("Serving the UI on http://localhost:3001 (stand-in)", flush=True)
        time.sleep(3600)
    if behaviour == "nothing":
        return 0
    out = session if behaviour == "into_capture" else Path(_option(argv, "--output-file") or ".")
    if config.get("layout", "flat") == "flat" and len(models) == 1:
        write_tables(out, next(iter(models.values())), metadata, config.get("split", False))
    else:
        for name, fields in models.items():
            write_tables(out / name, fields, metadata, config.get("split", False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
