"""The pod launcher: waits for node 0's DNS name (bounded), then execs torchrun with an argv list."""

import pytest

from finetune_operator.api import constants as c
from finetune_trainer import launch


@pytest.mark.parametrize(("nodes", "processes", "direct"), [
    ("1", "1", True), ("1:1", "1", True), ("1", "8", False), ("2", "1", False), ("2:4", "1", False)])
def test_one_node_of_one_process_runs_the_trainer_without_torchrun(nodes, processes, direct):
    env = {c.ENV_PET_NNODES: nodes, c.ENV_PET_NPROC_PER_NODE: processes, c.ENV_PET_MASTER_ADDR: "job-a1-0.job",
           c.ENV_PET_MASTER_PORT: "29400"}
    child = launch.worker_command("/etc/finetune/trainer.json", env)
    argv, extra = child.argv, child.env
    if not direct:  # torchrun's agent, the libraries imported once; topology from the PET_* env, never flags
        assert (argv[1:], extra, child.name) == (["-m", "finetune_trainer.agent", "--config",
                                                  "/etc/finetune/trainer.json"], {}, "torchrun")
        return
    assert child.name == "the trainer"
    assert argv[1:] == ["-u", "-m", "finetune_trainer", "--config", "/etc/finetune/trainer.json"]
    # What torchrun gives its one worker: the Trainer, accelerate and torch.distributed read these.
    assert {k: extra[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
        "MASTER_ADDR": "job-a1-0.job", "MASTER_PORT": "29400"}


def test_a_child_killed_by_a_signal_exits_as_a_shell_reports_it(tmp_path):
    killed = launch.run_child(["sh", "-c", "kill -KILL $$"], tmp_path)
    assert killed == 137 and launch.aggregate([], killed, ["Killed"], "the trainer") == (
        137, {"reason": launch.exit_codes.reason(137), "message": "the trainer exited with 137: Killed"})
    assert launch.run_child(["sh", "-c", "exit 3"], tmp_path) == 3


def test_waits_until_the_name_resolves():
    answers = iter([OSError("NXDOMAIN"), OSError("NXDOMAIN"), "10.0.0.7"])

    def resolve(host):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert launch.wait_for_dns("job-a1-0.job.ns.svc", timeout=5, resolve=resolve, interval=0.01) >= 0
    with pytest.raises(StopIteration):
        next(answers)  # all three lookups happened


def test_gives_up_with_an_explanation():
    def never(host):
        raise OSError("NXDOMAIN")

    with pytest.raises(launch.DnsTimeout, match="headless Service"):
        launch.wait_for_dns("missing.svc", timeout=0.05, resolve=never, interval=0.01)


def test_main_returns_the_retryable_code_when_dns_never_resolves(monkeypatch):
    monkeypatch.setenv(c.ENV_PET_MASTER_ADDR, "no-such-host.invalid")
    assert launch.main(["--config", "/x", "--dns-timeout", "0"]) == launch.EXIT_DNS_TIMEOUT


def test_real_resolver_on_loopback():
    assert launch.wait_for_dns("localhost", timeout=5) < 5


@pytest.mark.parametrize(("results", "child_code", "expected"), [
    ([{"exitCode": 0, "worldSize": 2}, {"exitCode": 0}], 0, 0),
    ([{"exitCode": 0}, {"exitCode": 65}], 1, 65),
    ([{"exitCode": 1}, {"exitCode": 78}], 1, 78),
    ([{"exitCode": 79}, {"exitCode": 65}], 1, 65),
    ([{"exitCode": 1}], 1, 1),
    ([], -9, -9),
    ([], 1, 1),
], ids=["all-ok", "data-error-wins-over-torchrun-1", "config-wins", "data-before-diverged", "retryable",
        "killed-before-result", "crash-before-result"])
def test_aggregate_keeps_the_contract(results, child_code, expected):
    code, summary = launch.aggregate(results, child_code)
    assert code == expected
    assert "reason" in summary or summary.get("exitCode") == expected


def test_termination_message_is_capped(tmp_path, monkeypatch):
    target = tmp_path / "termination-log"
    monkeypatch.setenv(c.ENV_TERMINATION_LOG, str(target))
    launch.write_termination_message({"exitCode": 0, "reason": "Succeeded", "data": "x" * 10000, "steps": 5})
    text = target.read_text()
    assert len(text) <= launch.MAX_TERMINATION_MESSAGE and '"steps": 5' in text


def test_a_requested_stop_leaves_no_traceback_in_the_pod_log(monkeypatch):
    from finetune_trainer import launch

    monkeypatch.setattr(launch, "STOPS", [15])
    quiet = launch.QuietStop()
    log = ["W agent: Received 15 death signal, shutting down workers\n", "Traceback (most recent call last):\n",
           '  File "torch/distributed/run.py", line 1, in <module>\n', "    main()\n",
           "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15\n",
           "Traceback (most recent call last):\n", '  File "x.py", line 2, in f\n', "RuntimeError: a real crash\n"]
    out = [kept for line in log for kept in quiet.filter(line)] + quiet.flush()
    assert out[0].startswith("W agent") and "a requested stop" in out[1] and "SignalException" not in "".join(out)
    assert out[-3:] == log[-3:]  # any other traceback passes unchanged


def test_without_a_stop_every_traceback_passes(monkeypatch):
    from finetune_trainer import launch

    monkeypatch.setattr(launch, "STOPS", [])
    quiet = launch.QuietStop()
    log = ["Traceback (most recent call last):\n", "  File 'x', line 1\n", "SignalException: x\n"]
    assert [kept for line in log for kept in quiet.filter(line)] == log


@pytest.mark.parametrize(("results", "child_code", "required", "expected"), [
    ([], 0, True, 1),  # the agent left a closed rendezvous without a worker: not a success
    ([], 0, False, 0),  # torchrun without restarts in place: its exit is its workers'
    ([{"exitCode": 0, "worldSize": 2}], 0, True, 0),
    ([{"exitCode": 65}], 1, True, 65),
    ([], 1, True, 1),
], ids=["agent-without-worker", "plain-torchrun", "agent-worker-finished", "agent-worker-failed", "agent-crashed"])
def test_a_pod_succeeds_only_when_one_of_its_workers_trained_to_the_end(results, child_code, required, expected):
    """Any node's success ends an in-place job (its Job's success policy): it must be a worker's."""
    code, summary = launch.aggregate(results, child_code, [], "torchrun", worker_required=required)
    assert code == expected
    if required and not results and child_code == 0:
        assert "left out of the group" in summary["message"]
