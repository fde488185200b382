"""Each training process's threads come from the container's CPU limit (cgroup v2 or v1), divided among the node's
processes; a value already set, or no limit at all, leaves the environment alone."""

import pytest

from finetune_trainer.cpu_threads import cpu_limit, thread_env
from finetune_trainer.launch import Child


def cgroup(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(("files", "limit"), [
    ({"cpu.max": "250000 100000\n"}, 2.5),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.5),
    ({"cpu,cpuacct/cpu.cfs_quota_us": "400000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 4.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu.max": "garbage\n"}, None),
    ({}, None),
])
def test_the_limit_is_read_from_either_cgroup_version(tmp_path, files, limit):
    root = cgroup(tmp_path / "sys", files)
    (tmp_path / "self").write_text("0::/\n")  # a cgroup namespace: the container's own group is the root
    assert cpu_limit(root, tmp_path / "self") == limit


@pytest.mark.parametrize(("files", "limit"), [
    ({"kubepods/pod1/ctr/cpu.max": "150000 100000\n", "kubepods/pod1/cpu.max": "max 100000\n"}, 1.5),
    ({"kubepods/pod1/ctr/cpu.max": "max 100000\n", "kubepods/pod1/cpu.max": "100000 100000\n"}, 1.0),  # the pod's
    ({"kubepods/pod1/ctr/cpu.max": "400000 100000\n", "kubepods/cpu.max": "200000 100000\n"}, 2.0),
    ({"kubepods/pod1/ctr/cpu.max": "max 100000\n"}, None),
])
def test_without_a_cgroup_namespace_the_processs_own_group_and_those_above_it_count(tmp_path, files, limit):
    """cgroup v2 seen whole (no cgroup namespace): /sys/fs/cgroup is the host's root, which has no cpu.max; the
    process's group is the line "0::/PATH" of /proc/self/cgroup."""
    root = cgroup(tmp_path / "sys", files)
    (tmp_path / "self").write_text("0::/kubepods/pod1/ctr\n")
    assert cpu_limit(root, tmp_path / "self") == limit


@pytest.mark.parametrize(("env", "limit", "cpus", "threads"), [
    ({}, 2.0, 64, "2"),
    ({}, 2.5, 64, "2"),  # a fraction of a CPU would be throttled: floor
    ({}, 0.5, 64, "1"),
    ({"PET_NPROC_PER_NODE": "4"}, 8.0, 64, "2"),
    ({"PET_NPROC_PER_NODE": "4"}, 2.0, 64, "1"),
    ({"PET_NPROC_PER_NODE": "8"}, 96.0, 128, "12"),
    ({"PET_NPROC_PER_NODE": "8"}, 16.0, 192, "2"),  # a GPU node: 8 processes in a pod of 16 CPUs
    ({}, 2.0, 1, "1"),  # a limit above the CPUs it may run on (a cpuset of one): not 2 threads on one core
    ({"PET_NPROC_PER_NODE": "8"}, 64.0, 16, "2"),  # a limit above the node's cores
    ({"PET_NPROC_PER_NODE": "2", "FINETUNE_NODES_SHARING_CPUS": "2"}, 8.0, 64, "2"),  # finetune run: 2 nodes here
    ({"FINETUNE_NODES_SHARING_CPUS": "3"}, 2.0, 64, "1"),
    ({}, None, 64, None),  # no limit: torch's own choice
    ({"OMP_NUM_THREADS": "6"}, 2.0, 64, None),  # the user's (spec env) is kept
    ({"PET_NPROC_PER_NODE": "auto"}, 8.0, 64, None),
])
def test_each_process_gets_its_share_of_the_limit(env, limit, cpus, threads):
    assert thread_env(env, limit, cpus) == ({} if threads is None else {"OMP_NUM_THREADS": threads})


def test_the_launcher_gives_its_child_the_threads_and_keeps_the_childs_own_variables(monkeypatch, tmp_path):
    """main() builds the child's environment from both: what the launcher worked out wins over nothing, never over
    a variable the child needs (a single process's ranks)."""
    import finetune_trainer.launch as launch

    seen: list[Child] = []
    monkeypatch.setattr(launch, "cpu_limit", lambda: 3.0)
    monkeypatch.setattr(launch, "usable_cpus", lambda: 64)
    monkeypatch.setattr(launch, "supervise", lambda child, worker_required: seen.append(child) or 0)
    for name in ("OMP_NUM_THREADS", "PET_MASTER_ADDR", "PET_NNODES", "PET_NPROC_PER_NODE", "PET_RDZV_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    assert launch.main(["--config", str(tmp_path / "trainer.json")]) == 0
    assert seen[0].env["OMP_NUM_THREADS"] == "3" and seen[0].env["WORLD_SIZE"] == "1"
    monkeypatch.setenv("PET_NPROC_PER_NODE", "2")
    launch.main(["--config", str(tmp_path / "trainer.json")])
    assert seen[1].env["OMP_NUM_THREADS"] == "1" and seen[1].name == "torchrun"


def test_finetune_run_tells_each_nodes_launcher_how_many_share_this_machines_limit(tmp_path, monkeypatch):
    """Every node of a local run is a launcher on this machine, in the same cgroup: each divides the limit by all."""
    from finetune_operator.api import constants as c
    from finetune_operator.api.validation import validate_job
    from finetune_operator.cli.local_run import node_environment, prepare
    from tests.builders import make_job

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    job = validate_job(make_job({"spec.distributed": {"numNodes": 2, "gpusPerNode": 0, "cpuProcessesPerNode": 2}}))
    _, ctx = prepare(job, tmp_path)
    env = node_environment(job, ctx, tmp_path, rank=1, port=29400)
    assert (env[c.ENV_NODES_SHARING_CPUS], env[c.ENV_PET_NPROC_PER_NODE]) == ("2", "2")
    assert thread_env(env, 8.0, 64) == {"OMP_NUM_THREADS": "2"}  # 4 processes in a limit of 8, not 4 each
