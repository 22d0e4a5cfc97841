"""Metric keys: legal for MLflow, readable, stable, never shared by two op names."""

import re

import pytest
from mlflow.utils.validation import _validate_metric_name

from mlflow_neuron._record.keys import MAX_OP_KEY_CHARS, OpKeys, metric_key, readable_key

REAL_NAMES = [
    "aten::mul",
    "ProfilerStep*",
    "Optimizer.step#SGD.step",
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::mul_kernel>(int, float*)",
    "Torch-Compiled Region: 0/0",
    "autograd::engine::evaluate_function: MulBackward0",
    "nn.Module: Linear_0",
    "ünïcode⚡op",
    "a..b",
    "..",
    "",
    "x" * 10_000,
]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("aten::mul", "aten.mul"),
        ("aten::_fused_rms_norm", "aten._fused_rms_norm"),
        ("ProfilerStep*", "ProfilerStep_"),
        ("Optimizer.step#SGD.step", "Optimizer.step_SGD.step"),
        ("Torch-Compiled Region: 0/0", "Torch-Compiled_Region__0_0"),
        ("a..b", "a__b"),
    ],
)
def test_readable_key_follows_the_documented_rule(name, key):
    assert readable_key(name) == key


@pytest.mark.parametrize("name", REAL_NAMES)
def test_every_key_is_accepted_by_mlflow(name):
    key = metric_key("self_device_time_us", OpKeys().key(name), rank_prefix="rank_127/")
    _validate_metric_name(key)  # raises MlflowException on an illegal key
    assert re.fullmatch(r"[A-Za-z0-9_.\-/]+", key)
    assert len(key) <= 250


def test_long_names_are_shortened_with_a_hash_that_tells_them_apart():
    a, b = "k" * 300 + "A", "k" * 300 + "B"
    keys = OpKeys()
    assert len(keys.key(a)) == MAX_OP_KEY_CHARS
    assert keys.key(a) != keys.key(b)
    assert readable_key(a) == readable_key(a)  # deterministic across processes: no salted hash()


def test_names_that_would_collide_never_share_a_key():
    keys = OpKeys().keys(["aten::mul", "aten.mul", "aten mul", "aten_mul"])
    assert len(set(keys.values())) == 4
    assert keys["aten::mul"].startswith("aten.mul")
    assert keys["aten mul"].startswith("aten_mul")


def test_keys_are_stable_across_cycles_and_input_order():
    first, second = OpKeys(), OpKeys()
    names = ["aten.mul", "aten::mul", "aten::add"]
    a = first.keys(names)
    b = second.keys(list(reversed(names)))
    assert a == b
    # A later cycle keeps each name's key, whichever names it brings.
    assert first.keys(["aten::mul"]) == {"aten::mul": a["aten::mul"]}
