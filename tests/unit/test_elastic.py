"""Elastic size and in-place restarts, from the spec to the pod: the rules at apply, what the Job and torchrun are
given, the accumulation each world size gets, and what a re-formed worker group says about the one before it."""

import json
from pathlib import Path

import pytest

from finetune_operator.api import constants as c
from finetune_operator.api.elastic import accumulation_steps, in_place_restart_limit, restarts_in_place
from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.validation import validate_job
from finetune_operator.render import RenderContext
from finetune_operator.render.workload import pod_set_hash, render_workload
from finetune_trainer import launch
from finetune_trainer.config import elastic_accumulation
from finetune_trainer.training import workers
from tests.builders import make_job
from tests.support.pod_runner import expand

CLAIM = {"spec.output.claimName": "shared"}


def elastic(nodes=3, fewest=2, per_device=1, accumulation=2, **overrides):
    return make_job({"spec.distributed.numNodes": nodes, "spec.distributed.minNodes": fewest,
                     "spec.distributed.gpusPerNode": 0, "spec.training.perDeviceTrainBatchSize": per_device,
                     "spec.training.gradientAccumulationSteps": accumulation, **CLAIM, **overrides})


def errors_of(manifest) -> list[str]:
    try:
        validate_job(manifest)
    except InvalidSpec as exc:
        return [e.path for e in exc.errors]
    return []


# Every range of up to 4 nodes x micro-batch 1-2 x accumulation 1-4: accepted exactly when each size of the range
# gets a whole accumulation that keeps the global batch (counted here by brute force).
RANGES = [(n, m, b, a) for n in range(2, 5) for m in range(1, n) for b in (1, 2) for a in range(1, 5)]


@pytest.mark.parametrize(("nodes", "fewest", "per_device", "accumulation"), RANGES,
                         ids=[f"{m}-{n}nodes-b{b}-a{a}" for n, m, b, a in RANGES])
def test_a_range_is_accepted_exactly_when_every_size_keeps_the_global_batch(nodes, fewest, per_device, accumulation):
    global_batch = nodes * per_device * accumulation
    keeps = all(global_batch % (k * per_device) == 0 for k in range(fewest, nodes + 1))
    found = errors_of(elastic(nodes, fewest, per_device, accumulation))
    assert found == ([] if keeps else ["spec.distributed.minNodes"])
    if keeps:
        spec = validate_job(elastic(nodes, fewest, per_device, accumulation)).spec
        for k in range(fewest, nodes + 1):
            steps = accumulation_steps(spec, k)
            assert steps * k * per_device == global_batch == elastic_accumulation(spec, k) * k * per_device


def test_the_refusal_names_the_sizes_and_a_batch_that_works():
    with pytest.raises(InvalidSpec) as raised:
        validate_job(elastic(4, 2, 1, 1))
    text = raised.value.errors[0].render()
    assert "cannot stay the same on 3 node(s)" in text and "a multiple of 12 (e.g. gradientAccumulationSteps 3)" in text


@pytest.mark.parametrize(("overrides", "path"), [
    ({"spec.distributed.minNodes": 4}, "spec.distributed.minNodes"),
    ({"spec.distributed.strategy": "deepspeed"}, "spec.distributed.minNodes"),
    ({"spec.output.claimName": None}, "spec.output.claimName"),
    ({"spec.checkpoints.saveStrategy": "no"}, "spec.checkpoints.saveStrategy"),
    ({"spec.runPolicy.inPlaceRestarts": 0}, "spec.runPolicy.inPlaceRestarts"),
], ids=["more-than-numNodes", "sharded-optimizer", "no-shared-output", "no-checkpoints", "no-restarts"])
def test_what_an_elastic_job_cannot_do_is_refused_at_apply(overrides, path):
    manifest = elastic(**{k: v for k, v in overrides.items() if v is not None})
    if overrides.get("spec.output.claimName", "") is None:
        manifest["spec"].pop("output")
    assert path in errors_of(manifest)


@pytest.mark.parametrize(("nodes", "fewest", "in_place", "limit"), [
    (1, None, None, 0), (2, None, None, 0), (2, None, 2, 2), (3, 2, None, 3), (3, 2, 5, 5), (3, 3, None, 0)],
    ids=["one-node", "fixed-gang", "fixed-gang-in-place", "elastic", "elastic-more-restarts", "min-equals-max"])
def test_who_restarts_in_place(nodes, fewest, in_place, limit):
    manifest = make_job({"spec.distributed.numNodes": nodes, "spec.distributed.gpusPerNode": 0, **CLAIM,
                         "spec.training.gradientAccumulationSteps": 2})
    if fewest is not None:
        manifest["spec"]["distributed"]["minNodes"] = fewest
    if in_place is not None:
        manifest["spec"]["runPolicy"] = {"inPlaceRestarts": in_place}
    spec = validate_job(manifest).spec
    assert in_place_restart_limit(spec) == limit
    assert restarts_in_place(spec) == (limit > 0 or spec.distributed.elastic)


def rendered(manifest, attempt=1, queue=False):
    if queue:
        manifest["metadata"]["labels"] = {c.LABEL_KUEUE_QUEUE: "team"}
    spec = validate_job(manifest).spec
    labels = manifest["metadata"].get("labels") or {}
    return render_workload(spec, RenderContext(name="test-job", namespace="ns", attempt=attempt, job_labels=labels))


def pod_env(job, index, attempt):
    """The container's variables as the kubelet expands them for the pod of `index`."""
    env: dict[str, str] = {c.ENV_ATTEMPT: str(attempt), c.ENV_PET_NODE_RANK: str(index)}
    for item in job["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
    return env


def test_an_elastic_attempt_runs_the_c10d_rendezvous_and_replaces_pods_alone():
    job = rendered(elastic())
    env = pod_env(job, 2, 1)
    assert env[c.ENV_PET_NNODES] == "2:3" and env[c.ENV_PET_RDZV_BACKEND] == "c10d"
    assert env[c.ENV_PET_RDZV_ID] == "test-job-a1" and env[c.ENV_PET_MAX_RESTARTS] == "3"
    assert env[c.ENV_PET_LOCAL_ADDR] == "test-job-a1-2.test-job.ns.svc"
    spec = job["spec"]
    assert spec["backoffLimit"] > 1000 and spec["podReplacementPolicy"] == "Failed"
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}  # rank 0's: after its final upload
    annotations = job["metadata"]["annotations"]
    assert (annotations[c.ANNOTATION_RESTARTS_IN_PLACE], annotations[c.ANNOTATION_MIN_NODES]) == ("3", "2")
    assert c.ANNOTATION_KUEUE_MIN_PARALLELISM not in annotations
    # Every attempt renders the same pods (the attempt comes from the pod's label): Kueue's admission carries over.
    assert pod_set_hash(job) == pod_set_hash(rendered(elastic(), attempt=2))


def test_kueue_may_admit_an_elastic_attempt_with_min_nodes():
    annotations = rendered(elastic(), queue=True)["metadata"]["annotations"]
    assert annotations[c.ANNOTATION_KUEUE_MIN_PARALLELISM] == "2"
    assert annotations[c.ANNOTATION_KUEUE_COMPLETIONS_EQUAL_PARALLELISM] == "true"


def test_a_fixed_gang_keeps_the_static_rendezvous_and_fails_whole():
    job = rendered(make_job({"spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 0}))
    env = pod_env(job, 1, 1)
    assert env[c.ENV_PET_NNODES] == "2" and not any(k.startswith("PET_RDZV") for k in env)
    assert job["spec"]["backoffLimit"] == 0 and "successPolicy" not in job["spec"]
    assert c.ANNOTATION_RESTARTS_IN_PLACE not in job["metadata"]["annotations"]


@pytest.mark.parametrize("rank", ["0", "1", "7"])
def test_node_zero_hosts_the_rendezvous(rank):
    env = {c.ENV_PET_RDZV_BACKEND: "c10d", c.ENV_PET_NODE_RANK: rank, c.ENV_PET_MASTER_ADDR: "job-a1-0.job",
           c.ENV_PET_MASTER_PORT: "29400", c.ENV_PET_NNODES: "1", c.ENV_PET_NPROC_PER_NODE: "1"}
    child = launch.worker_command("/etc/finetune/trainer.json", env)
    # One process too: the agent is what restarts it; torchrun's, with the trainer's libraries loaded once.
    assert child.name == "torchrun" and child.argv[1:3] == ["-m", "finetune_trainer.agent"]
    assert child.env[c.ENV_PET_RDZV_ENDPOINT] == "job-a1-0.job:29400"
    conf = dict(item.split("=") for item in child.env[c.ENV_PET_RDZV_CONF].split(","))
    assert conf["is_host"] == ("true" if rank == "0" else "false")
    # torch's 60 s for a key another agent writes failed whole groups on busy cores (an agent still stopping); a
    # live agent swept for keep-alives late by 3 s stalled a group: 10 s at least, under torch's 15 s
    assert int(conf["read_timeout"]) >= 300
    assert 10 <= int(conf["keep_alive_max_attempt"]) * int(conf["keep_alive_interval"]) < 15
    assert launch.TORCH_DISABLE_SHARED_STORE in child.env


def result(code, message, step=10, ended="2026-01-01T00:00:10.000Z", reason="Error"):
    return {"exitCode": code, "reason": reason, "message": message, "step": step, "endedAt": ended}


PEER = "RuntimeError: [pair.cc:561] Connection closed by peer [10.0.0.3]:4014"


@pytest.mark.parametrize(("shares", "cause"), [
    ([{"predecessor": None, "restartCount": 0}] * 2, None),
    ([{"predecessor": result(1, PEER), "restartCount": 1}, {"predecessor": None, "restartCount": 1}],
     "1 worker(s) ended without a word (killed: SIGKILL, or the OOM killer), and the others lost them"),
    ([{"predecessor": result(1, PEER), "restartCount": 1}, {"predecessor": result(1, PEER), "restartCount": 1}],
     "a peer went away (a node lost, or its workers)"),
    ([{"predecessor": result(1, PEER, ended="2026-01-01T00:00:09.000Z"), "restartCount": 1},
      {"predecessor": result(1, "ValueError: bad batch", ended="2026-01-01T00:00:11.000Z"), "restartCount": 1}],
     "Error (exit 1): ValueError: bad batch"),
], ids=["first-group", "worker-killed", "node-lost", "own-error-wins"])
def test_a_group_tells_why_the_one_before_it_ended(shares, cause):
    found = workers.describe(shares)
    if cause is None:
        assert found is None
        return
    assert found["cause"].startswith(cause) and found["reached"] == 10
    assert found["failedAt"] == min(workers.parse_iso(s["predecessor"]["endedAt"]) for s in shares
                                    if s["predecessor"])


PEER_MESSAGES = [PEER, "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there "
                      "was a network error, NCCL version 2.21.5",
                 "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer",
                 "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                 "1800000ms for recv operation to complete",
                 "DistStoreError: Socket Timeout", "DistNetworkError: Broken pipe",
                 "DistNetworkError: The client socket has failed to connect to [node-0]:29500 (errno: 111 - "
                 "Connection refused)."]
OWN_MESSAGES = ["ReadTimeout: HTTPSConnectionPool(host='huggingface.co', port=443): Read timed out. (read "
                "timeout=10)",
                "ConnectTimeoutError: Connect timeout on endpoint URL: \"http://minio:9000/bucket\"",
                "ReadTimeoutError: Read timeout on endpoint URL: \"http://minio:9000/bucket?uploads\"",
                "ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded "
                "(Caused by NewConnectionError(\"Failed to establish a new connection: [Errno 111] Connection "
                "refused\"))",
                "OSError: We couldn't connect to 'https://huggingface.co' to load the files: Read timed out",
                "the object store did not answer: Connection reset by peer",  # our own error (its own exit code)
                "ValueError: bad batch"]


@pytest.mark.parametrize("message", PEER_MESSAGES + OWN_MESSAGES)
def test_only_torchs_collectives_and_store_say_a_peer_was_lost(message):
    """A Hub or object-store timeout, or our own error that names a connection, is what ended the group: it is
    reported as the cause, not passed over for a peer that went away."""
    lost = message in PEER_MESSAGES
    assert workers._peer_lost(result(1, message)) is lost
    found = workers.describe([{"predecessor": result(1, message), "restartCount": 1},
                              {"predecessor": result(1, PEER), "restartCount": 1}])
    assert found["cause"].startswith("a peer went away" if lost else "Error (exit 1): " + message[:40]), found


def test_each_worker_takes_its_predecessors_result_once(tmp_path):
    env = {c.ENV_RESULT_DIR: str(tmp_path), c.ENV_LOCAL_RANK: "1"}
    (tmp_path / "result-1.json").write_text(json.dumps(result(1, "boom")))
    assert workers.take_predecessor(env)["message"] == "boom"
    assert workers.take_predecessor(env) is None  # the next one finds none: its predecessor left no word
    assert not (tmp_path / "result-1.json").exists() and (tmp_path / "previous-1.json").exists()


@pytest.fixture
def fresh_worker(monkeypatch):
    """This process as a new worker: no group trained yet, nothing carried."""
    monkeypatch.setitem(workers.TRAINED, "yes", False)
    monkeypatch.setattr(workers, "CARRIED", {})
    monkeypatch.setitem(workers.REACHED, "step", 20)


STOPPED = {"exitCode": 143, "reason": "Interrupted", "message": "stopped by a stop request"}


@pytest.mark.parametrize("first", ["failed", "killed"])
@pytest.mark.parametrize("between", [1, 2])
def test_groups_that_never_trained_pass_on_what_ended_the_last_one_that_did(tmp_path, monkeypatch, fresh_worker,
                                                                            first, between):
    """A crash (a worker's own failure, or a worker killed without a word), then `between` groups stopped before
    their first step (a re-formed group stopped at once for a node that missed the round): the group that trains
    next reports the crash, its time and how far the crashed group got, not the stops."""
    env = {c.ENV_RESULT_DIR: str(tmp_path), c.ENV_LOCAL_RANK: "0", c.ENV_TORCHELASTIC_RESTART_COUNT: "1"}
    monkeypatch.setenv(c.ENV_TORCHELASTIC_RESTART_COUNT, "1")
    crash = result(1, "ValueError: bad batch", step=22)
    if first == "failed":
        (tmp_path / "result-0.json").write_text(json.dumps(crash))
    for _ in range(between):  # a worker that reads its predecessor, is stopped before training, leaves its result
        workers.take_predecessor(env)
        ended = {**STOPPED, "exitCode": 143}
        (tmp_path / "result-0.json").write_text(json.dumps({**ended, **workers.result_fields(ended)}))
    predecessor = workers.take_predecessor(env)
    found = workers.describe([{"predecessor": predecessor, "restartCount": 1}])
    if first == "failed":
        assert predecessor == crash
        assert found["cause"].startswith("Error (exit 1): ValueError: bad batch") and found["reached"] == 22
        assert found["failedAt"] == workers.parse_iso(crash["endedAt"])
    else:
        assert predecessor is None and found["cause"].startswith("1 worker(s) ended without a word (killed")


def test_a_group_that_trained_or_failed_on_its_own_passes_on_its_own_ending(tmp_path, monkeypatch, fresh_worker):
    env = {c.ENV_RESULT_DIR: str(tmp_path), c.ENV_LOCAL_RANK: "0", c.ENV_TORCHELASTIC_RESTART_COUNT: "1"}
    (tmp_path / "result-0.json").write_text(json.dumps(result(1, "ValueError: bad batch")))
    workers.take_predecessor(env)
    own = result(1, "RuntimeError: CUDA error")  # a failure of its own before training: that is the news
    assert "before" not in workers.result_fields(own)
    workers.TRAINED["yes"] = True  # a group that trained: its own stop is what ended it
    assert "before" not in workers.result_fields(dict(STOPPED))


@pytest.mark.parametrize("seconds", [0.0, 0.5, 1795761907.688])
def test_times_round_trip_to_the_millisecond(seconds):
    assert abs(workers.parse_iso(workers.iso(seconds)) - seconds) < 0.001



def test_finetune_run_gives_each_node_an_address_of_this_host(tmp_path):
    from finetune_operator.cli.local_run import node_environment, prepare

    spec = validate_job(elastic())
    _, ctx = prepare(spec, tmp_path)
    env = node_environment(spec, ctx, tmp_path, rank=1, port=29400)
    assert env[c.ENV_PET_LOCAL_ADDR] == "127.0.0.1" and env[c.ENV_PET_RDZV_BACKEND] == "c10d"
    assert not [k for k, v in env.items() if k.startswith("PET_") and "$(" in v]


# Every topology torchrun is given (a fixed gang N, an elastic MIN:MAX) x every group size the rendezvous may report.
QUORUM = [(nnodes, group) for nnodes in ("1", "2", "3", "1:3", "2:3", "3:4") for group in range(1, 5)]


@pytest.mark.parametrize(("nnodes", "group"), QUORUM)
def test_a_group_below_the_jobs_minimum_is_found_whatever_the_topology(nnodes, group):
    from finetune_trainer.agent import below_minimum

    fewest = int(nnodes.split(":")[0])
    env = {c.ENV_PET_NNODES: nnodes, c.ENV_GROUP_WORLD_SIZE: str(group)}
    assert below_minimum(env) == ((group, fewest) if group < fewest else None)


@pytest.mark.parametrize(("group", "trains"), [(1, False), (2, True), (3, True)])
def test_workers_of_a_group_below_min_nodes_never_train(group, trains, monkeypatch, capsys):
    """torch's rendezvous counts the world after a round completes: a participant swept out for missed keep-alives
    in between leaves a group below min_nodes (seen on a busy machine: 1 node of a 3-node job with min 2 trained
    to the end). Its workers wait for the agent to re-form the group, and fail after the join timeout."""
    import sys
    import types

    from finetune_trainer import agent

    called = []
    fake_main = types.ModuleType("finetune_trainer.main")
    fake_main.main = lambda argv: called.append(argv) or 0
    monkeypatch.setitem(sys.modules, "finetune_trainer.main", fake_main)
    monkeypatch.setattr(launch, "RDZV_JOIN_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setenv(c.ENV_PET_NNODES, "2:3")
    monkeypatch.setenv(c.ENV_GROUP_WORLD_SIZE, str(group))
    if trains:
        agent.train("cfg.yaml")
        assert called == [["--config", "cfg.yaml"]]
        return
    with pytest.raises(SystemExit) as exited:
        agent.train("cfg.yaml")
    assert exited.value.code == 1 and called == []
    err = capsys.readouterr().err
    assert "group of 1 node(s), fewer than the job's minimum of 2" in err and "no node joined within 0 s" in err


def test_the_agents_rendezvous_event_names_are_torchs_without_reading_every_frames_source():
    """finetune_trainer.agent.method_name stands in for torch's get_method_name (inspect.stack(), ~13 ms a call with
    the trainer's libraries loaded): the same name for the same caller, at every depth torch asks for."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from finetune_trainer.agent import method_name

    def record(depth):  # as torch's _record calls it: the name of _record's caller
        return method_name(depth), dynamic_rendezvous.get_method_name(depth)

    def join_op():
        return record(1), record(2), record(3)

    for ours, torchs in join_op():
        assert ours == torchs
    assert join_op()[1][0] == "join_op"
    assert method_name(10_000) == dynamic_rendezvous.get_method_name(10_000) == "no_method_name"


FORKED_WORKER = """
import atexit, multiprocessing, os, sys, tempfile, types, weakref
from pathlib import Path
from finetune_trainer import agent

here, code = Path(sys.argv[1]), int(sys.argv[2])
atexit.register(lambda: (here / "agent-handler").write_text("ran"))  # the agent's own, registered before the fork


agent_object = type("Held", (), {})()
weakref.finalize(agent_object, lambda: (here / "agent-finalizer").write_text("ran"))  # the agent's, copied by the fork


def fake(argv):
    atexit.register(lambda: (here / "worker-handler").write_text("ran"))
    global worker_object
    worker_object = type("Held", (), {})()  # alive at exit: its finalizer runs then, as in a process of its own
    weakref.finalize(worker_object, lambda: (here / "worker-finalizer").write_text("ran"))
    global scratch
    scratch = tempfile.TemporaryDirectory(dir=here)
    (here / "temporary").write_text(scratch.name)
    return code


main = types.ModuleType("finetune_trainer.main")
main.main = fake
sys.modules["finetune_trainer.main"] = main
worker = multiprocessing.get_context("fork").Process(target=agent.forked_worker, args=("cfg.yaml",))
worker.start()
worker.join(60)
(here / "exitcode").write_text(str(worker.exitcode))
os._exit(0)  # the agent ends without its handlers: only the worker's are looked for
"""


@pytest.mark.parametrize("code", [0, 65])
def test_a_forked_worker_runs_its_own_exit_handlers_and_not_the_agents(code, tmp_path):
    """torch elastic's fork start method ends a worker with os._exit: without forked_worker, what the trainer
    registers at exit (the output prefix's owner record release) never ran, and a second run on the prefix was
    refused for the lease's 5 minutes. The agent's own handlers, copied by the fork, must not run in the worker.
    (A fresh interpreter forks, as the agent does: not the test process, whose threads a fork would not carry.)"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FORKED_WORKER, str(tmp_path), str(code)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "exitcode").read_text() == str(code)
    assert (tmp_path / "worker-handler").read_text() == "ran"
    assert (tmp_path / "worker-finalizer").read_text() == "ran"
    assert not Path((tmp_path / "temporary").read_text()).exists()  # a TemporaryDirectory left open is removed
    assert not (tmp_path / "agent-handler").exists() and not (tmp_path / "agent-finalizer").exists()
