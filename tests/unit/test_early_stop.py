"""A stop signal while the trainer loads or tokenizes (a suspend right after the pods start) must stop it: found by
suspending a 2-node job at random moments (tests/e2e/cluster_training.py), where a library's
`except Exception` around model loading swallowed the stop and the gang trained on until SIGKILL."""

import signal
from types import SimpleNamespace

import pytest

from finetune_trainer import errors
from finetune_trainer.main import _stop_before_training
from finetune_trainer.training.callbacks import GracefulStop


@pytest.fixture(autouse=True)
def no_early_stops():
    errors.EARLY_STOPS.clear()
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield
    errors.EARLY_STOPS.clear()
    signal.signal(signal.SIGTERM, previous[0])
    signal.signal(signal.SIGINT, previous[1])


def test_a_library_catching_exception_does_not_swallow_the_stop():
    def loading_weights():
        try:
            _stop_before_training(signal.SIGTERM, None)
        except Exception:  # what a library might do around a download or a load
            return "swallowed"

    with pytest.raises(errors.StopRequested):
        loading_weights()
    code, summary, unexpected = errors.outcome(loading_weights)
    assert code == 143 and "before training started" in summary["message"] and unexpected is None


def test_a_stop_lost_before_training_stops_the_gang_at_its_first_step_end():
    with pytest.raises(errors.StopRequested):
        _stop_before_training(signal.SIGTERM, None)
    stop = GracefulStop()
    args = SimpleNamespace(save_strategy="steps", device="cpu")
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    stop.on_train_begin(args, None, control)
    stop.on_step_end(args, None, control)
    assert stop.requested == signal.SIGTERM and control.should_save and control.should_training_stop
