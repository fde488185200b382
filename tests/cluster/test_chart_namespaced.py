"""A release that manages some namespaces only (watchNamespaces), installed into the real apiserver with no other
release beside it: another release's admission policies (all namespaces) would rightly refuse this one's operator,
whose Jobs run as the trainer identity too."""

import time

import yaml

from tests.cluster.test_chart import CHART, can, helm, watch_phases  # noqa: F401 - helm is a fixture
from tests.conftest import ROOT
from tests.support.operator_process import OperatorProcess


def test_with_watch_namespaces_the_operator_runs_on_roles_alone(helm,  # noqa: F811
                                                                 kubectl, control_plane, namespace):
    """A second release that manages one namespace (watchNamespaces), with every optional cluster-wide right off:
    its operator, under that release's identity, runs a job there and leaves other namespaces alone."""
    release, system = "ftj-team", "finetunejob-team"
    other = f"{namespace[:50]}-other"
    kubectl.run("create", "namespace", other)
    helm("install", release, str(CHART), "--namespace", system, "--create-namespace", "--wait=false",
         "--set", f"watchNamespaces={{{namespace}}}", "--set", "nodeShapeCheck=false",
         "--set", "userRoles.aggregate=false", "--set", "runtimes.readableByAllUsers=false")
    op = None
    try:
        sa = f"system:serviceaccount:{system}:{release}-operator"
        assert can(kubectl, sa, "create", "jobs.batch", namespace=namespace)
        assert not can(kubectl, sa, "create", "jobs.batch", namespace=other)
        assert not can(kubectl, sa, "list", "nodes")
        token = kubectl.run("create", "token", f"{release}-operator", "-n", system, "--duration=1h").stdout.strip()
        config = yaml.safe_load(control_plane.kubeconfig.read_text())
        config["users"] = [{"name": "admin", "user": {"token": token}}]
        scoped = control_plane.work / "operator-team.kubeconfig"
        scoped.write_text(yaml.safe_dump(config))
        op = OperatorProcess(scoped, control_plane.work / "operator-team.log", namespaces=(namespace,),
                             args=("--health-port=0", "--leader-elect", f"--lease-namespace={system}",
                                   f"--lease-name={release}-operator")).start()
        for ns in (namespace, other):
            kubectl.run("apply", "-n", ns, "-f", str(ROOT / "examples" / "tiny-cpu-sft.yaml"))
        phases = watch_phases(kubectl, namespace, "tiny-cpu-sft", until="Running", timeout=90)
        assert phases[-1] == "Running", op.log_tail()
        assert not kubectl.json("get", "ftj", "tiny-cpu-sft", "-n", other).get("status")  # not its namespace
        # The release's own trainer-pods policy (bound to its namespaces) lets the Job controller start the pods.
        deadline = time.monotonic() + 60
        while not [p for p in kubectl.json("get", "pods", "-n", namespace)["items"]
                   if p["spec"].get("serviceAccountName") == "finetunejob-trainer"]:
            assert time.monotonic() < deadline, kubectl.run("get", "events", "-n", namespace).stdout
            time.sleep(0.5)
        refused = op.refusals()
        assert not refused, refused
    finally:
        if op is not None:
            op.stop()
        helm("uninstall", release, "--namespace", system, check=False)
        kubectl.run("delete", "namespace", other, "--wait=false", check=False)
