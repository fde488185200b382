"""The worker group's record (workers.jsonl) counts its nodes from torchrun's variables, and without them (a trainer
started by hand, by a debugger) from the processes on this node."""

import json
import time
from types import SimpleNamespace

import pytest

from finetune_trainer.training.worker_report import WorkerGroupReport
from finetune_trainer.training.workers import WORKERS_FILE


@pytest.mark.parametrize(("env", "world", "nodes"), [
    ({"GROUP_WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2"}, 6, 3),
    ({"LOCAL_WORLD_SIZE": "2"}, 4, 2),
    ({"LOCAL_WORLD_SIZE": "4"}, 4, 1),
    ({}, 1, 1),
    ({}, 2, 2),  # no torchrun: each process counts as a node of one
])
def test_the_record_counts_the_groups_nodes_with_or_without_torchruns_variables(tmp_path, monkeypatch, env, world,
                                                                                  nodes):
    for name in ("GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report = WorkerGroupReport(tmp_path, None, None, 1, {"started": time.time()})
    args = SimpleNamespace(world_size=world, gradient_accumulation_steps=2, per_device_train_batch_size=3)
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    report.on_train_begin(args, state, None)
    state.global_step = 1
    report.on_step_end(args, state, None)
    record = json.loads((tmp_path / WORKERS_FILE).read_text())
    assert (record["nodes"], record["worldSize"], record["globalBatchSize"]) == (nodes, world, 3 * 2 * world)
    assert record["resumedStep"] == 0 and set(record["at"]) == {"workersStarted", "checkpointLoaded", "firstStep"}
