"""Never stall, never lose: a real `mlflow server` on 127.0.0.1 that dies, restarts and crawls."""

import tempfile
import warnings

import pytest
from fault_scenarios import (
    dead_before_the_run,
    killed_mid_upload_and_restarted,
    outbox_on_a_read_only_path,
    slow_server,
)

from mlflow_neuron import MLflowNeuronWarning


@pytest.fixture(autouse=True)
def quiet_outbox_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MLflowNeuronWarning)
        yield


@pytest.fixture(params=[False, True], ids=["inline", "helper"])
def helper(request):
    """Every scenario twice: cycles processed in the training process, and in the helper process."""
    return request.param


def assert_nothing_lost(outcome, cycles, helper):
    assert outcome.steps_completed == 4 * cycles  # the training loop ran to the end
    assert outcome.cycles_sent == cycles
    assert outcome.present_after_sync == cycles
    assert outcome.duplicated == 0


def test_server_dead_before_the_run(tmp_path, helper):
    outcome = dead_before_the_run(tmp_path, cycles=3, helper=helper)
    assert_nothing_lost(outcome, 3, helper)
    assert outcome.delivered_live == 0 and outcome.kept_in_outbox == 3


def test_server_killed_mid_upload_and_restarted(tmp_path, helper):
    outcome = killed_mid_upload_and_restarted(tmp_path, cycles=6, helper=helper)
    assert_nothing_lost(outcome, 6, helper)
    # how many went through before the kill depends on the machine's speed (a busy runner may send
    # none): the promise is that each cycle was delivered or kept, and counted so
    assert outcome.delivered_live + outcome.kept_in_outbox >= 6


def test_slow_server(tmp_path, helper):
    outcome = slow_server(tmp_path, cycles=3, delay_s=0.3, helper=helper)
    assert_nothing_lost(outcome, 3, helper)


def test_outbox_on_a_read_only_path(tmp_path, helper, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the helper process's temp folder too
    (tmp_path / "tmp").mkdir()
    outcome = outbox_on_a_read_only_path(tmp_path, cycles=2, helper=helper)
    assert_nothing_lost(outcome, 2, helper)
    assert outcome.kept_in_outbox == 2
