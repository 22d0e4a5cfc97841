"""The hardware's published limits, for "how close is this op to the machine": bytes per second of
device memory and FLOPs per second by precision. Pure.

Example::

    peak = find_peak("trn2.48xlarge")          # per NeuronCore: the chip's figures / its 8 cores
    peak = find_peak("NVIDIA H100 80GB HBM3")  # a GPU, by the name torch.cuda reports
    peak = load_peak("peaks.json")             # the user's own (MLFLOW_NEURON_PEAKS)

Every line of `PEAKS` names its source: the vendor's published figure, as printed there (dense, not
sparse). Nothing here was measured by this project. A Neuron profile covers one NeuronCore, so a
Neuron chip's figures are divided by its physical cores; where cores are grouped into logical
cores (`NEURON_LOGICAL_NC_CONFIG`), multiply by the group size (`Peak.per_logical_core`). Memory
bandwidth is shared by a chip's cores, so a single core may draw more than its share: a percentage
of the per-core share above 100 means that, not an error.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

PEAKS_ENV = "MLFLOW_NEURON_PEAKS"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
GIB, TB, TFLOPS = 2**30, 1e12, 1e12
_AWS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/"


@dataclass(frozen=True)
class Peak:
    """One device's limits per unit profiled (a NeuronCore, a GPU). FLOPs per second by precision
    class (`bf16` also covers fp16/tf32 where the vendor lists them together)."""

    name: str
    memory_bytes_per_s: float
    flops_per_s: dict  # {"bf16": ..., "fp8": ..., "fp32": ...}, only the published ones
    source: str
    matches: tuple[str, ...] = ()  # lowercase prefixes of an EC2 instance type, or pieces of a GPU name

    def per_logical_core(self, group: int) -> Peak:
        return replace(self, name=f"{self.name} (logical core of {group})", memory_bytes_per_s=self.memory_bytes_per_s
                       * group, flops_per_s={k: v * group for k, v in self.flops_per_s.items()})  # fmt: skip

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "matches"}


def _chip(name: str, cores: int, memory: float, flops: dict, source: str, *matches: str) -> Peak:
    """A Neuron chip's published figures, per physical NeuronCore."""
    return Peak(f"{name} NeuronCore (1/{cores} of a chip)", memory / cores, {k: v / cores for k, v in flops.items()},
                source, matches)  # fmt: skip


PEAKS = (
    _chip("Trainium", 2, 820 * GIB, {"bf16": 190 * TFLOPS, "fp8": 190 * TFLOPS, "fp32": 47.5 * TFLOPS},
          _AWS + "general/arch/neuron-hardware/trainium.html (per chip: 820 GiB/s, 190 BF16 TFLOPS)", "trn1", "trn1n"),
    _chip("Inferentia2", 2, 820 * GIB, {"bf16": 190 * TFLOPS, "fp8": 190 * TFLOPS, "fp32": 47.5 * TFLOPS},
          _AWS + "general/arch/neuron-hardware/inferentia2.html (per chip: 820 GiB/s, 190 BF16 TFLOPS)", "inf2"),
    _chip("Trainium2", 8, 2.9 * TB, {"bf16": 667 * TFLOPS, "fp8": 1299 * TFLOPS, "fp32": 181 * TFLOPS},
          _AWS + "nki/arch/trainium2_arch.html (2.9 TB/s) and about-neuron/arch/neuron-hardware/trainium2.html "
          "(667 BF16, 1,299 FP8 TFLOPS per chip)", "trn2"),
    _chip("Trainium3", 8, 4.9 * TB, {"bf16": 671 * TFLOPS, "fp8": 2517 * TFLOPS, "fp32": 183 * TFLOPS},
          _AWS + "about-neuron/arch/neuron-hardware/trainium3.html (per chip: 4.9 TB/s, 671 BF16, 2,517 MXFP8 "
          "TFLOPS)", "trn3"),
    Peak("NVIDIA H100 SXM", 3.35 * TB, {"bf16": 989.4 * TFLOPS, "fp8": 1978.9 * TFLOPS, "fp32": 66.9 * TFLOPS},
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 3.35 TB/s; dense BF16 989.4, FP8 1,978.9 TFLOPS)",
         ("h100 80gb hbm3", "h100 sxm")),
    Peak("NVIDIA H100 PCIe", 2.0 * TB, {"bf16": 756.5 * TFLOPS, "fp8": 1513 * TFLOPS, "fp32": 51.2 * TFLOPS},
         "NVIDIA H100 Tensor Core GPU datasheet (PCIe: 2 TB/s; dense BF16 756, FP8 1,513 TFLOPS)", ("h100 pcie",)),
    Peak("NVIDIA A100 80GB", 2.039 * TB, {"bf16": 312 * TFLOPS, "fp32": 19.5 * TFLOPS},
         "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM4: 2,039 GB/s; dense BF16 312 TFLOPS)", ("a100-sxm4-80gb",
                                                                                                  "a100 80gb")),
    Peak("NVIDIA A100 40GB", 1.555 * TB, {"bf16": 312 * TFLOPS, "fp32": 19.5 * TFLOPS},
         "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM4: 1,555 GB/s; dense BF16 312 TFLOPS)", ("a100-sxm4-40gb",
                                                                                                  "a100 40gb")),
    Peak("AMD Instinct MI300X", 5.3 * TB, {"bf16": 1307.4 * TFLOPS, "fp8": 2614.9 * TFLOPS, "fp32": 163.4 * TFLOPS},
         "AMD Instinct MI300X data sheet (5.3 TB/s; dense BF16 1,307.4, FP8 2,614.9 TFLOPS)", ("mi300x",)),
)  # fmt: skip


def find_peak(device_name: str | None, table: tuple[Peak, ...] = PEAKS) -> Peak | None:
    """The table's line for an EC2 instance type (`trn2.48xlarge`) or a GPU name; None when unknown."""
    text = (device_name or "").strip().lower()
    if not text:
        return None
    instance_family = text.split(".", 1)[0]
    for peak in table:
        if any(instance_family == m or (" " in m or "-" in m) and m in text or m in text.split() for m in peak.matches):
            return peak
    return None


def load_peak(path: str | os.PathLike | dict, where: str = PEAKS_ENV) -> Peak:
    """A user's peak: a JSON file (or the dict) `{"name", "memory_gbps", "bf16_tflops", "fp8_tflops"?,
    "fp32_tflops"?, "source"}`. Raises ValueError naming what is wrong."""
    data = path
    if not isinstance(path, dict):
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValueError(f"{where}={path}: cannot read it as JSON ({error})") from error
    if not isinstance(data, dict) or not isinstance(data.get("memory_gbps"), (int, float)) or data["memory_gbps"] <= 0:
        raise ValueError(f"{where}={path}: expected an object with memory_gbps > 0 (and bf16_tflops, "
                         "fp8_tflops, fp32_tflops, name, source)")  # fmt: skip
    flops = {k: float(data[f"{k}_tflops"]) * TFLOPS for k in ("bf16", "fp8", "fp32")
             if isinstance(data.get(f"{k}_tflops"), (int, float)) and data[f"{k}_tflops"] > 0}  # fmt: skip
    return Peak(str(data.get("name", "user's peak")), float(data["memory_gbps"]) * 1e9, flops,
                str(data.get("source", f"{where}={path}")))  # fmt: skip


def precision_of(dtype: str) -> str | None:
    """The precision class of a recorded dtype ("float" -> fp32, "c10::BFloat16" -> bf16)."""
    text = dtype.lower()
    if "float8" in text:
        return "fp8"
    if "bfloat16" in text or "half" in text:
        return "bf16"
    if text == "float":
        return "fp32"
    return None
