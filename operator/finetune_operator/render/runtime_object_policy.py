"""Admission of the runtimes themselves, generated into the chart with the job policies (runtime_policy.py), the same
rules as the operator's (api/runtime_limits.py template_errors, api/runtime_layers.py layering_errors):

- a runtime whose template breaks its own limits is refused (every lean job using it would be);
- a namespace's default FineTuneRuntime is layered over the default ClusterFineTuneRuntime (one whose
  namespaceSelector matches): refused when the layered template breaks either runtime's limits, sets a field the
  cluster default locks, or splits the GPU shape (numNodes, gpusPerNode) between the two templates while either
  limits maxGpusPerJob (the job policies check each runtime with its own template: the split would be seen whole by
  neither, and a job would be admitted that the operator then fails).
A cluster default created or changed after a namespace's default is not checked against it here (the API server
cannot look across namespaces): the operator's check of every job, exact, still refuses what breaks either.
"""

from collections.abc import Callable
from typing import Any

from ..api import constants as c
from ..api.runtime import LOCKABLE
from .runtime_policy import (
    NAMESPACE_LABELS,
    RELEASE,
    VOLUME_KIND,
    Rule,
    _has,
    _policy,
    combined,
    present,
    selector_matches,
)

TEMPLATE_POLICY = f"{RELEASE}-runtime-templates"
LAYERING_POLICY = f"{RELEASE}-namespace-default-layering"
OWN = "object.spec.template"
CLUSTER = "params.spec.template"
# (present, value) of a template path as CEL.
Getter = Callable[[str], tuple[str, str]]


def _one(template: str) -> Getter:
    return lambda path: (f"({_has(template, path)})", f"{template}.{path}")


def _layered(path: str) -> tuple[str, str]:
    """The namespace default's value over the cluster default's."""
    ours, theirs = _has(OWN, path), _has(CLUSTER, path)
    return f"(({ours}) || ({theirs}))", f"(({ours}) ? {OWN}.{path} : {CLUSTER}.{path})"


def template_rules(get: Getter, limits: str, whose: str) -> list[Rule]:
    """The template's own values (the job's built-in defaults are not the template's) against the limits at
    `limits`, named `whose` (a CEL string) in the message."""
    nodes_set, nodes = get("distributed.numNodes")
    gpus_set, gpus = get("distributed.gpusPerNode")
    strategy_set, strategy = get("distributed.strategy")
    deadline_set, deadline = get("runPolicy.activeDeadlineSeconds")
    claim_set, claim = get("output.claimName")
    volumes_set, volumes = get("pod.volumes")
    total = f"(({nodes_set}) ? {nodes} : 1) * (({gpus_set}) ? {gpus} : 1)"
    claims = (f"((({claim_set}) ? [{claim}] : []) + (({volumes_set}) ? {volumes} : []).filter(v, has(v.claimName))"
              ".map(v, v.claimName))")
    rules = [
        ("maxNodes", f"!{nodes_set} || {nodes} <= {limits}.maxNodes",
         f"'spec.template.distributed.numNodes is ' + string({nodes}) + ': it breaks ' + {whose} + ' "
         f"limits.maxNodes = ' + string({limits}.maxNodes)"),
        ("maxGpusPerJob", f"!({nodes_set} || {gpus_set}) || {total} <= {limits}.maxGpusPerJob",
         f"'spec.template.distributed gives ' + string({total}) + ' GPUs per job: it breaks ' + {whose} + ' "
         f"limits.maxGpusPerJob = ' + string({limits}.maxGpusPerJob)"),
        ("allowedStrategies", f"!{strategy_set} || {strategy} in {limits}.allowedStrategies",
         f"'spec.template.distributed.strategy is ' + {strategy} + ': it breaks ' + {whose} + ' "
         f"limits.allowedStrategies ' + {limits}.allowedStrategies.join(', ')"),
        ("maxActiveDeadlineSeconds", f"!{deadline_set} || {deadline} <= {limits}.maxActiveDeadlineSeconds",
         f"'spec.template.runPolicy.activeDeadlineSeconds is ' + string({deadline}) + ': it breaks ' + {whose} + "
         f"' limits.maxActiveDeadlineSeconds = ' + string({limits}.maxActiveDeadlineSeconds)"),
        ("allowedClaims", f"{claims}.all(n, n in {limits}.allowedClaims)",
         f"'spec.template mounts the claim(s) ' + {claims}.filter(n, !(n in {limits}.allowedClaims)).join(', ') + "
         f"': it breaks ' + {whose} + ' limits.allowedClaims ' + {limits}.allowedClaims.join(', ')"),
    ]
    kinds = f"(({volumes_set}) ? {volumes} : []).map(v, {VOLUME_KIND})"
    rules += [
        ("allowedVolumeKinds", f"{kinds}.all(k, k in {limits}.allowedVolumeKinds)",
         f"'spec.template.pod.volumes mounts ' + {kinds}.filter(k, !(k in {limits}.allowedVolumeKinds)).join(', ') "
         f"+ ': it breaks ' + {whose} + ' limits.allowedVolumeKinds ' + {limits}.allowedVolumeKinds.join(', ')"),
        ("allowedClaims", f"({present(f'{limits}.allowedVolumeKinds')}) || !('nfs' in {kinds})",
         f"'spec.template.pod.volumes mounts an nfs export: it breaks ' + {whose} + ' limits.allowedClaims, and so "
         "no nfs volume (storage is those claims unless limits.allowedVolumeKinds lists nfs)'"),
    ]
    return [(f"!({present(f'{limits}.{name}')}) || ({holds})", f"{message} + '; change the template or the limit'")
            for name, holds, message in rules]


def template_policy() -> list[dict[str, Any]]:
    """Both runtime kinds: the template against the runtime's own limits."""
    rules = template_rules(_one(OWN), "object.spec.limits", "'its own'")
    docs = _policy(TEMPLATE_POLICY, [], [combined(present("object.spec.limits"), rules)], None)
    docs[0]["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = [c.RUNTIME_PLURAL,
                                                                           c.CLUSTER_RUNTIME_PLURAL]
    return docs


def layering_policy() -> list[dict[str, Any]]:
    """A namespace's default FineTuneRuntime, against each default ClusterFineTuneRuntime its namespace may use."""
    named = "'the default ClusterFineTuneRuntime ' + params.metadata.name"
    cluster = f"{named} + '\\'s'"
    rules = template_rules(_layered, "params.spec.limits", cluster)
    rules += template_rules(_layered, "object.spec.limits", "'its own (over the cluster default)'")
    for path, what in LOCKABLE.items():
        rules.append((f"!({present('params.spec.limits.locked')} && '{path}' in params.spec.limits.locked) || "
                      f"!({_has(OWN, path)})",
                      f"'spec.template.{path}: {what} is locked by ' + {named} + ' (limits.locked): a namespace "
                      "default layered over it may not set it; remove it'"))
    shape = ("distributed.numNodes", "distributed.gpusPerNode")
    ours_set = " || ".join(f"({_has(OWN, p)})" for p in shape)
    rules.append((f"!({present('params.spec.limits.maxGpusPerJob')}) || !({ours_set})",
                  f"'spec.template.distributed: ' + {named} + ' limits maxGpusPerJob, which the API server checks "
                  "with the GPU shape of its own template: a namespace default layered over it may not set numNodes "
                  "or gpusPerNode; leave them to the cluster default (or to each job), or give jobs a runtimeRef'"))
    restated = " && ".join(f"(!({_has(CLUSTER, p)}) || ({_has(OWN, p)}))" for p in shape)
    rules.append((f"!({present('object.spec.limits.maxGpusPerJob')}) || ({restated})",
                  "'spec.template.distributed: its limits.maxGpusPerJob is checked with the GPU shape of its own "
                  f"template, and ' + {named} + ' template sets numNodes or gpusPerNode: set them in this template "
                  "too'"))
    variables = [
        {"name": "namespaceLabels", "expression": NAMESPACE_LABELS},
        {"name": "layered", "expression": "has(object.spec) && has(object.spec.default) && object.spec.default && "
                                          "has(params.spec) && has(params.spec.default) && params.spec.default && ("
                                          + selector_matches("params.spec.namespaceSelector",
                                                             "variables.namespaceLabels") + ")"},
    ]
    docs = _policy(LAYERING_POLICY, variables, [combined("variables.layered", rules)], c.CLUSTER_RUNTIME_KIND)
    docs[0]["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = [c.RUNTIME_PLURAL]
    return docs


def policies() -> list[dict[str, Any]]:
    return template_policy() + layering_policy()
