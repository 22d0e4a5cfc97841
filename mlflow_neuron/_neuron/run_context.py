"""An MLflow run-context plugin: every new run is tagged with the Neuron environment it ran in.

Registered under the ``mlflow.run_context_provider`` entry-point group, so ``mlflow.start_run()``
(and ``MlflowClient.create_run`` through Lightning's logger) picks it up with mlflow-neuron
installed; nothing to call. Tags, each only when known:

- ``mlflow_neuron.env.{torch,torch_neuronx,neuronx_cc,libneuronxla}_version``: installed package
  versions, read from package metadata (the packages are not imported);
- ``mlflow_neuron.env.neuron_rt_visible_cores`` / ``neuron_rt_num_cores``: the environment variables
  that choose this process's NeuronCores;
- ``mlflow_neuron.env.ec2_instance_type``: from the machine's DMI table (Nitro instances name their
  type there); no request to the instance metadata service;
- ``mlflow_neuron.env.cuda_device`` / ``cuda_device_count``: only when this process has already
  initialized CUDA through torch; the plugin never imports torch nor initializes CUDA.

It runs at every run start, so it is cheap (no network, no subprocess; versions and DMI are read
once per process) and never raises: a probe that fails leaves its tag out.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import re
import sys
from pathlib import Path

from mlflow.tracking.context.abstract_context import RunContextProvider

PREFIX = "mlflow_neuron.env."

# Distribution name -> tag; neuronx-cc and libneuronxla come from the Neuron package repository.
PACKAGES = {
    "torch": "torch_version",
    "torch-neuronx": "torch_neuronx_version",
    "neuronx-cc": "neuronx_cc_version",
    "libneuronxla": "libneuronxla_version",
}
ENV_VARS = {
    "NEURON_RT_VISIBLE_CORES": "neuron_rt_visible_cores",
    "NEURON_RT_NUM_CORES": "neuron_rt_num_cores",
}
DMI_DIR = Path("/sys/devices/virtual/dmi/id")
_EC2_VENDOR = "Amazon EC2"
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")  # trn1.32xlarge, inf2.xlarge, p5.48xlarge

_logger = logging.getLogger(__name__)


class NeuronRunContextProvider(RunContextProvider):
    """Tags a run with the torch / Neuron stack, the visible NeuronCores and the EC2 instance type."""

    def in_context(self) -> bool:
        return True

    def tags(self) -> dict[str, str]:
        tags: dict[str, str] = {}
        for probe in (package_versions, neuron_core_settings, ec2_instance_type, cuda_devices):
            try:
                tags.update(probe())
            except Exception as error:  # noqa: BLE001 - a run must start whatever a probe does
                _logger.debug("mlflow-neuron: run context probe %s failed: %s", probe.__name__, error)
        return {PREFIX + name: value for name, value in tags.items()}


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    versions = {}
    for distribution, tag in PACKAGES.items():
        try:
            versions[tag] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def neuron_core_settings() -> dict[str, str]:
    return {tag: os.environ[var] for var, tag in ENV_VARS.items() if os.environ.get(var, "").strip()}


def ec2_instance_type(dmi_dir: Path | None = None) -> dict[str, str]:
    return _ec2_instance_type(str(dmi_dir or DMI_DIR))


@functools.lru_cache(maxsize=4)
def _ec2_instance_type(dmi_dir: str) -> dict[str, str]:
    vendor = _read(Path(dmi_dir, "sys_vendor"))
    product = _read(Path(dmi_dir, "product_name"))
    if vendor == _EC2_VENDOR and product and _INSTANCE_TYPE.match(product):
        return {"ec2_instance_type": product}
    return {}


def cuda_devices() -> dict[str, str]:
    torch = sys.modules.get("torch")  # only a torch the program imported itself
    cuda = getattr(torch, "cuda", None)
    # Not initialized: asking would initialize CUDA (slow, and fatal for CUDA in processes forked later).
    if cuda is None or not cuda.is_initialized():
        return {}
    return {
        "cuda_device": cuda.get_device_name(cuda.current_device()),
        "cuda_device_count": str(cuda.device_count()),
    }


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""
