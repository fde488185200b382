"""A job that started before any runtime covered its namespace runs on without one while it runs what it started
with; an edit of what it runs (every spec field but suspend and runPolicy) starts it anew under the runtimes that
cover it now, at the operator as at admission (tests/cluster/test_runtimes.py)."""

import copy
from typing import Any

import pytest

from finetune_operator.api import constants as c
from finetune_operator.api.validation import validate_job
from finetune_operator.controller.runtimes import edited_since_started, resolve
from finetune_operator.render.workload import attempt_spec_hash, started_spec_digest
from tests.builders import make_job

DEFAULT = {"apiVersion": c.API_VERSION, "kind": c.CLUSTER_RUNTIME_KIND, "metadata": {"name": "default-1gpu"},
           "spec": {"default": True, "template": {}, "limits": {"maxGpusPerJob": 1}}}


class Runtimes:
    """What the operator reads about runtimes (controller/kube.py's three reads), from a list."""

    def __init__(self, *runtimes: dict[str, Any]):
        self.runtimes = runtimes

    def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return next((r for r in self.runtimes if r["kind"] == kind and r["metadata"]["name"] == name), None)

    def default_runtimes(self, namespace: str):
        return [], [r for r in self.runtimes if r["spec"].get("default")]

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        return {}


def started(**spec: Any) -> tuple[dict, list[dict]]:
    """A 1-GPU job that started with no runtime, and its attempt 1's Job (the spec digest it was rendered from)."""
    job = make_job({"metadata.name": "fiona", "metadata.namespace": "team-a", "spec.distributed.numNodes": 1,
                    "spec.distributed.gpusPerNode": 1, **spec})
    job["metadata"]["labels"] = {c.LABEL_KUEUE_QUEUE: "team-a-low"}
    spec = validate_job(job).spec
    job["status"] = {"startTime": "2026-11-29T00:00:00Z", "attempt": 1, "phase": "Running",
                     "startedSpecDigest": started_spec_digest(spec, job["metadata"]["labels"])}
    attempt = {"metadata": {"name": "fiona-a1", "labels": {c.LABEL_ATTEMPT: "1"},
                            "annotations": {c.ANNOTATION_ATTEMPT_SPEC_HASH: attempt_spec_hash(spec)}}}
    return job, [attempt]


# What an edit may change, and whether that changes what runs.
EDITS = {
    "suspend": ({"suspend": True}, False),
    "runPolicy": ({"runPolicy": {"backoffLimit": 5}}, False),
    "nodes and GPUs": ({"distributed": {"numNodes": 2, "gpusPerNode": 4}}, True),
    "GPUs only": ({"distributed": {"numNodes": 1, "gpusPerNode": 2}}, True),
    "the learning rate": ({"training": {"learningRate": 0.01}}, True),
    "the image": ({"pod": {"image": "registry.local/other:1"}}, True),
}


# The Kueue labels that reach the next attempt's Job: which queue (and so whose quota), which priority.
RELABELS = {
    "the queue": {c.LABEL_KUEUE_QUEUE: "prod-high"},
    "the priority": {c.LABEL_KUEUE_PRIORITY: "urgent"},
    "the time limit": {c.KUEUE_MAX_EXEC_TIME: "86400"},
}
EDITS.update({name: ({"metadata.labels": labels}, True) for name, labels in RELABELS.items()})


def edit(job: dict, change: dict) -> dict:
    edited = copy.deepcopy(job)
    for key, value in change.items():
        if key == "metadata.labels":
            edited["metadata"]["labels"].update(value)
        elif isinstance(value, dict):
            edited["spec"].setdefault(key, {}).update(value)
        else:
            edited["spec"][key] = value
    return edited


@pytest.mark.parametrize("what", EDITS)
def test_an_edit_of_what_runs_is_judged_by_the_default_that_covers_it_now(what):
    job, attempts = started()
    change, runs_otherwise = EDITS[what]
    edited = edit(job, change)
    assert edited_since_started(edited, attempts) is runs_otherwise
    resolved = resolve(Runtimes(DEFAULT), edited, attempts)
    if not runs_otherwise:
        assert resolved.snapshot is None and not resolved.errors  # unlimited as it started: not capped later
        return
    assert resolved.snapshot is not None and resolved.snapshot["name"] == "default-1gpu"
    too_many = what in ("nodes and GPUs", "GPUs only")
    assert any("maxGpusPerJob" in e.message for e in resolved.errors) is too_many, resolved.errors


@pytest.mark.parametrize("attempts_seen", ["its attempt's Job", "no Job (suspended, a failed create)"])
@pytest.mark.parametrize("what", EDITS)
def test_the_digest_recorded_at_start_judges_an_edit_with_or_without_an_attempt(what, attempts_seen):
    job, attempts = started()
    change, runs_otherwise = EDITS[what]
    seen = attempts if attempts_seen.startswith("its") else []
    assert resolve(Runtimes(DEFAULT), job, seen).snapshot is None  # unedited: stays without a runtime
    assert (resolve(Runtimes(DEFAULT), edit(job, change), seen).snapshot is not None) is runs_otherwise


def test_the_digest_counts_what_the_user_set_so_an_upgrade_that_adds_defaults_keeps_it():
    job, _ = started()
    spec = validate_job(job).spec
    spelled_out = copy.deepcopy(job)  # every default written out, as a newer schema's defaulting would
    spelled_out["spec"] = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert started_spec_digest(validate_job(spelled_out).spec, job["metadata"]["labels"]) == \
        job["status"]["startedSpecDigest"]
    assert not edited_since_started(spelled_out, [])


@pytest.mark.parametrize("what", EDITS)
def test_a_job_started_before_the_record_is_compared_with_its_attempt(what):
    """Started by an operator that recorded no digest: its newest attempt's Job says what it runs (the labels are
    not in that digest), and with no Job it is taken as unedited."""
    job, attempts = started()
    del job["status"]["startedSpecDigest"]
    change, runs_otherwise = EDITS[what]
    edited = edit(job, change)
    assert edited_since_started(edited, attempts) is (runs_otherwise and what not in RELABELS)
    assert not edited_since_started(edited, [])


@pytest.mark.parametrize("label", c.KUEUE_JOB_LABELS)
def test_an_empty_kueue_label_is_none_as_admission_compares_them(label):
    """Admission's relabelled variable takes an empty label for an absent one; so does the digest, or `kubectl
    label ... queue-name=` would pass admission unjudged and make the operator judge a running job anew."""
    job, attempts = started()
    emptied = copy.deepcopy(job)
    emptied["metadata"]["labels"] = {k: v for k, v in job["metadata"]["labels"].items() if k != label}
    emptied["status"]["startedSpecDigest"] = started_spec_digest(validate_job(emptied).spec,
                                                                 emptied["metadata"]["labels"])
    emptied["metadata"]["labels"][label] = ""
    assert not edited_since_started(emptied, attempts)
