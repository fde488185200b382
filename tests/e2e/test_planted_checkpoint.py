"""A checkpoint planted in a job's output (whoever can write the claim or the bucket prefix) runs no code in the
trainer: DeepSpeed's resume unpickled it with weights_only=False, beside whatever credentials a runtime lends the
job. The run ends InvalidConfig (not retried: the same file would be met again), saying which checkpoint holds what,
and the planted command never ran."""

import json
import os
import pickle

from finetune_operator.api import exit_codes
from tests.e2e.test_trainer_runs import job
from tests.support.trainer_run import run_nodes


class Evil:
    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def test_a_planted_deepspeed_checkpoint_is_refused_and_runs_nothing(tiny_model_dir, tmp_path):
    sentinel = tmp_path / "the-planted-code-ran"
    step = tmp_path / "output" / "checkpoint-2" / "global_step2"
    step.mkdir(parents=True)
    # Laid out as DeepSpeed and the Trainer write one, complete, so the run resumes from it.
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        (step / name).write_bytes(pickle.dumps(Evil(sentinel), protocol=2))
    (step.parent / "latest").write_text("global_step2")
    state = {"global_step": 2, "train_batch_size": 4, "max_steps": 4}
    (step.parent / "trainer_state.json").write_text(json.dumps(state))
    (step.parent / "FINETUNE_COMPLETE").write_text("{}")
    doc = job(tiny_model_dir, **{"spec.distributed": {"numNodes": 1, "gpusPerNode": 0, "strategy": "deepspeed",
                                                      "deepspeed": {"zeroStage": 2}},
                                 "spec.training.maxSteps": 4})
    (result,) = run_nodes(doc, tmp_path)
    assert not sentinel.exists(), "the planted checkpoint's code ran"
    assert result.returncode == exit_codes.CONFIG_ERROR, result.log[-3000:]
    assert result.summary["reason"] == "InvalidConfig"
    message = result.summary["message"]
    assert "checkpoint-2" in message and "posix.system" in message and "nothing in it ran" in message, message
