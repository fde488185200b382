"""kopf wiring, nothing more: settings, watch caches (kopf indexes) and one Controller pass per changed job.

Level-triggered: a pass reads the current state (from the caches) and converges, so missed, repeated or reordered
events are harmless. kopf fills every index from its initial list before any handler runs, so the first pass after
a restart already sees every Job. The Controller (runner.py) lives in kopf's memo and coalesces the passes.
No kopf handler state is persisted, so the operator writes nothing but our own status and children.
Run: python -m finetune_operator.controller --all-namespaces (main.py: health endpoint, leader election, then kopf)
"""

import asyncio
import logging
import os
import socket
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..api import constants as c
from ..api import exit_codes
from . import metrics
from .cache import finetunejob_of_job, slim_finetunejob, slim_workload, slim_workload_kueue
from .health import HEALTH
from .kube import Kube
from .reconcile import EventSink
from .runner import GATHER_SECONDS, INDEXES, Controller, Key
from .settings import settings_from_env, watch_client_timeout

EVENT_MESSAGE_LIMIT = 1024  # what `kubectl describe` shows whole
log = logging.getLogger("finetune_operator")


def event_poster(kube: Kube, instance: str) -> EventSink:
    """Events go through the operator's own (fenced) client, from the pass that decided them."""
    def post(obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            # Cut at a word and marked (a hard cut mid-word hid the end of a remedy); the status keeps it whole.
            kube.post_event(obj, kind, reason, exit_codes.short(message, EVENT_MESSAGE_LIMIT), instance)
        except (ApiException, HTTPError, OSError) as exc:  # an Event helps; it never fails a pass
            log.warning("could not post Event %s about %s/%s: %s", reason, obj["metadata"].get("namespace"),
                        obj["metadata"].get("name"), exc)
    return post


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Level-triggered passes never read kopf's old/new diffs; building one deep-copies every body on every event,
    which was a fifth of the operator's CPU with a thousand gangs starting."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = settings_from_env(os.environ)
    # Our Events tell the story (event_poster); kopf's own would double them, and its poster is a background queue
    # on another client, outside the write fence.
    settings.posting.enabled = False
    # kopf logs every handler call at INFO: tens of thousands of lines a minute for a thousand gangs starting.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = ours.watch_seconds
    # A watch stream on a dead connection (no reset) would stay silent for ever: the client gives up a little
    # after the server would have closed it, and kopf lists and watches again.
    settings.watching.client_timeout = watch_client_timeout(ours.watch_seconds)
    settings.watching.connect_timeout = 30
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase(prefix=c.GROUP)
    kube = Kube.from_environment(connections=ours.workers)
    instance = os.environ.get("POD_NAME") or socket.gethostname()
    memo.controller = Controller(kube, ours, event_poster(kube, instance))
    HEALTH.stuck_pass_seconds, HEALTH.oldest_pass = ours.stuck_pass_seconds, memo.controller.oldest_pass
    if ours.metrics_port:
        metrics.serve(ours.metrics_port)


@kopf.on.startup()
async def tick_for_liveness(**_: Any) -> None:
    """The event loop proves it runs once a second (health.py fails the probe when it stops)."""
    loop = asyncio.get_running_loop()

    def tick() -> None:
        HEALTH.tick()
        loop.call_later(1.0, tick)

    tick()


@kopf.on.cleanup()
def shutdown(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        controller.shutdown()


# --- watch caches: kopf keeps one entry per object and drops it when the object is deleted ----------------------
@kopf.index(c.GROUP, c.VERSION, c.PLURAL)
def finetunejob_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, name): slim_finetunejob(body)}


@kopf.index("batch", "v1", "jobs", labels={c.LABEL_JOB: kopf.PRESENT})
def workload_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, labels[c.LABEL_JOB]): slim_workload(body)}


def _ours(body: kopf.Body, **_: Any) -> bool:
    return any((o.get("kind") == "Job" and finetunejob_of_job(o.get("name"))) or o.get("kind") == c.KIND
               for o in body.get("metadata", {}).get("ownerReferences") or [])


def _finetunejob_of_kueue_workload(slim: dict[str, Any]) -> str | None:
    return finetunejob_of_job(slim["job"]) or slim["holder"]


# Kueue's Workloads of our Jobs (when Kueue is installed: kopf watches the resource once its CRD exists): whether
# Kueue manages an attempt, why it waits, and what deactivates it.
@kopf.index(c.KUEUE_GROUP, c.KUEUE_VERSION, c.KUEUE_WORKLOADS, when=_ours)
def kueue_workload_index(namespace: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    slim = slim_workload_kueue(body)
    return {(namespace, _finetunejob_of_kueue_workload(slim) or ""): slim}


@kopf.on.event(c.KUEUE_GROUP, c.KUEUE_VERSION, c.KUEUE_WORKLOADS, when=_ours)
async def kueue_workload_changed(namespace: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    controller: Controller = memo.controller
    name = _finetunejob_of_kueue_workload(slim_workload_kueue(body))
    if name:
        await controller.reconcile((namespace, name), _indexes(kwargs), gather=GATHER_SECONDS)


# --- any change to a job or its Jobs: one pass for that job. Pods are not watched: a kopf watch is cluster-wide
# (filtered client-side), so it would parse every pod event of the cluster; the Job's status counts our pods.
@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
async def finetunejob_changed(type: str, name: str, namespace: str, memo: kopf.Memo, **kwargs: Any) -> None:
    controller: Controller = memo.controller
    if type == "DELETED":
        controller.deleted((namespace, name), not any(key[0] == namespace for key in kwargs["finetunejob_index"]))
    else:
        await controller.reconcile((namespace, name), _indexes(kwargs))


@kopf.on.event("batch", "v1", "jobs", labels={c.LABEL_JOB: kopf.PRESENT})
async def workload_changed(labels: kopf.Labels, namespace: str, memo: kopf.Memo, **kwargs: Any) -> None:
    controller: Controller = memo.controller
    await controller.reconcile((namespace, labels[c.LABEL_JOB]), _indexes(kwargs), gather=GATHER_SECONDS)


def _indexes(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs[name] for name in INDEXES}
