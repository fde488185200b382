"""The runtimes' limits as ValidatingAdmissionPolicies: the API server refuses a FineTuneJob that breaks its runtime's
limits at `kubectl apply` (create, update, every patch, server-side apply), whether or not the operator is up.
Generated into the chart (./hack/generate.sh) from the same tables as the operator's own check (api/runtime.py), so
both say the same thing.

What a job is judged against (as the operator judges it, api/runtime_layers.py):
- a job that has not started: the runtimes as they are now. One policy per runtime kind, its params every runtime
  of that kind (a binding with an empty selector; namespaced runtimes are looked up in the job's namespace). Each
  validation first asks whether the runtime applies to the job: the one spec.runtimeRef names (a
  ClusterFineTuneRuntime only where its namespaceSelector matches the namespace), or (no runtimeRef) a default one.
  Values a job leaves out are taken from that runtime's template, then from the built-in default, as the operator
  does. A namespace default is layered over the cluster default; each policy sees its own runtime's template only,
  which is exact because a namespace default that would make it inexact is refused (runtime_object_policy.py);
- a job that has started (status.startTime: an attempt created suspended is no start): the snapshot the operator
  recorded in status.runtime (the merged template and each layer's limits), with no params at all: tightening,
  editing or deleting a runtime neither lets a running job out nor locks its tenant out of suspending or editing it
  within the limits it started with. spec.runtimeRef can be neither changed nor added nor removed (the CRD's own
  rule).
"""

from collections.abc import Callable
from typing import Any

from ..api import constants as c
from ..api.grpo import MAX_REWARDS
from ..api.runtime import (
    ENDPOINT_FIELDS,
    LOCKABLE,
    LOCKED_LABELS,
    OWN_SECRET_ENV_NAMES,
    TRACKER_FIELDS,
    TRACKER_LENDING,
)
from ..api.runtime_limits import LENDING
from ..api.sources import MODEL_SOURCE_FIELDS, RESUME_FIELD
from .job_rights_policy import changed_variable

# Names under the release's (the chart substitutes RELEASE): two releases (watchNamespaces) must not collide.
RELEASE = "RELEASE-NAME"
POLICY_NAME = {c.CLUSTER_RUNTIME_KIND: f"{RELEASE}-cluster-runtime-limits",
               c.RUNTIME_KIND: f"{RELEASE}-runtime-limits"}
SNAPSHOT_POLICY = f"{RELEASE}-recorded-runtime-limits"
QUEUE_LABEL = c.LABEL_KUEUE_QUEUE
SNAPSHOT = "oldObject.status.runtime"
MAX_LAYERS = 2  # the cluster default and the namespace's (status.RuntimeSnapshot.layers)

# Whether the job's runtime is already recorded (by an operator that records each layer's limits), or the job started
# with none: then the live runtimes judge it no more, unless an update changes what it runs (variables.changed: every
# spec field but suspend and runPolicy), which starts it anew under the runtimes that cover it now.
RECORDED = (f"request.operation == 'UPDATE' && has(oldObject.status) && has({SNAPSHOT}) && "
            f"has({SNAPSHOT}.layers) && size({SNAPSHOT}.layers) > 0 && {SNAPSHOT}.layers.all(l, has(l.limits))")
STARTED_WITHOUT = ("request.operation == 'UPDATE' && has(oldObject.status) && !has(oldObject.status.runtime) && "
                   "has(oldObject.status.startTime)")


def present(expr: str) -> str:
    """CEL: every field on the way to `expr` (e.g. params.spec.template.distributed) is set: has() of a field under a
    missing one is an error, and an error refuses the request (failurePolicy Fail)."""
    parts = expr.split(".")
    return " && ".join(f"has({'.'.join(parts[:i])})" for i in range(2, len(parts) + 1)
                       if not parts[i - 1].endswith("]"))


def _has(root: str, path: str) -> str:
    return present(f"{root}.{path}")


def _value(path: str, template: str, default: str) -> str:
    """The job's value, else the runtime template's, else the built-in default."""
    return (f"(({_has('object.spec', path)}) ? object.spec.{path} : "
            f"(({_has(template, path)}) ? {template}.{path} : {default}))")


def selector_matches(selector: str, labels: str) -> str:
    """CEL: the label selector at `selector` (absent: everything) matches the map `labels`, with
    metav1.LabelSelector's meaning (api/selectors.py)."""
    return (f"!({present(selector)}) || ((!has({selector}.matchLabels) || {selector}.matchLabels.all(k, "
            f"k in {labels} && {labels}[k] == {selector}.matchLabels[k])) && (!has({selector}.matchExpressions) || "
            f"{selector}.matchExpressions.all(e, e.operator == 'In' ? (e.key in {labels} && has(e.values) && "
            f"{labels}[e.key] in e.values) : e.operator == 'NotIn' ? !(e.key in {labels} && has(e.values) && "
            f"{labels}[e.key] in e.values) : e.operator == 'Exists' ? e.key in {labels} : !(e.key in {labels}))))")


NAMESPACE_LABELS = ("(has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels : "
                    "{'kubernetes.io/metadata.name': request.namespace})")


# The most items of each list a model source lies in (a CEL map carries no index: a refusal names rewards[i] by it).
LIST_BOUNDS = {"spec.method.grpo.rewards": MAX_REWARDS}


def _model_source(field: str, template: str) -> str:
    """CEL: the list of [path, location] the job sets at `field` (api/sources.py MODEL_SOURCE_FIELDS)."""
    if field == RESUME_FIELD:  # the job's value, else its runtime's: auto, never and its own output load nothing
        resume = _value(field.removeprefix("spec."), template, "'auto'")
        return (f"({resume}.startsWith('/') && !{resume}.startsWith('{c.OUTPUT_MOUNT_PATH}/') ? "
                f"[['{field}', string({resume})]] : [])")
    if "[]" not in field:
        at = "object." + field
        return f"(({present(at)}) ? [['{field}', string({at})]] : [])"
    listed, rest = field.split("[]", 1)
    items = "object." + listed
    index = ", ".join(str(i) for i in range(LIST_BOUNDS[listed]))
    return (f"(({present(items)}) ? [{index}].filter(i, i < size({items}) && has({items}[i]{rest}))"
            f".map(i, ['{listed}[' + string(i) + ']{rest}', string({items}[i]{rest})]) : [])")


def value_variables(template: str) -> list[dict[str, str]]:
    """What a limit reads of the job, each the job's value, else `template`'s, else the built-in default."""
    def sources(section: str) -> str:
        paths = f"object.spec.data.{section}.filter(s, has(s.path)).map(s, s.path)"
        hubs = f"object.spec.data.{section}.filter(s, has(s.hub)).map(s, s.hub.name)"
        return f"{paths} + {hubs}"

    def lent(path: str) -> str:
        given = _has(template, path)
        if path == "pod.secretEnv":
            given += f" && size({template}.{path}) > 0"
        elif path == "pod.volumes":
            given += f" && {template}.{path}.exists(v, has(v.secret))"
        return f"(({given}) && !({_has('object.spec', path)}) ? ['spec.template.{path}'] : [])"

    return [
        # [field, location] of every place the job loads weights or code from, so a refusal names the field.
        {"name": "modelSources", "expression": " + ".join(_model_source(f, template) for f in MODEL_SOURCE_FIELDS)},
        {"name": "volumeKinds", "expression": f"{_value('pod.volumes', template, '[]')}.map(v, {VOLUME_KIND})"},
        {"name": "lent", "expression": " + ".join(lent(path) for path in LENDING)},
        {"name": "nodes", "expression": _value("distributed.numNodes", template, "1")},
        {"name": "gpusPerNode", "expression": _value("distributed.gpusPerNode", template, "1")},
        {"name": "strategy", "expression": _value("distributed.strategy", template, "'ddp'")},
        {"name": "method", "expression": "(has(object.spec.method) && has(object.spec.method.type)) ? "
                                         "object.spec.method.type : 'lora'"},
        {"name": "deadline", "expression": _value("runPolicy.activeDeadlineSeconds", template, "0")},
        {"name": "claims", "expression": f"({_has('object.spec', 'output.claimName')} ? [object.spec.output.claimName] "
                                         f": ({_has(template, 'output.claimName')} ? "
                                         f"[{template}.output.claimName] : [])) + "
                                         f"{_value('pod.volumes', template, '[]')}.filter(v, has(v.claimName))"
                                         ".map(v, v.claimName)"},
        {"name": "dataSources", "expression": f"{sources('train')} + (has(object.spec.data.validation) ? "
                                              f"{sources('validation')} : [])"},
        # [field, where] of each place the job writes or pushes to (allowedOutputs).
        {"name": "outputs", "expression": " + ".join(
            f"(({_has('object.spec', p)}) || ({_has(template, p)}) ? "
            f"[['spec.{p}', string({_value(p, template, NONE)})]] : [])" for p in OUTPUT_FIELDS)},
    ]


Rule = tuple[str, str]  # (CEL: holds, CEL: the message when it does not)
# The kind of a volume v of spec.pod.volumes, as allowedVolumeKinds names it (api/runtime_limits.py VOLUME_KINDS).
VOLUME_KIND = ("(has(v.claimName) ? 'persistentVolumeClaim' : has(v.configMap) ? 'configMap' : has(v.secret) ? "
               "'secret' : 'nfs')")
OUTPUT_FIELDS = ("output.uri", "output.push.repo")  # where a job writes and pushes (api/runtime_limits.py)
NONE = "''"  # CEL's empty string
REMOTE_CODE = "has(object.spec.model.trustRemoteCode) && object.spec.model.trustRemoteCode"
# GRPO reward functions from a ConfigMap: Python the job brings, imported by the trainer (render/grpo.py).
REWARD_CODE = ("has(object.spec.method.grpo) && has(object.spec.method.grpo.rewards) && "
               "object.spec.method.grpo.rewards.exists(r, has(r.configMap))")


def combined(guard: str, rules: list[Rule]) -> dict[str, str]:
    """One validation for many rules, its message every broken rule's (the API server reports one validation per
    policy: a refusal must say every error at once)."""
    broken = ", ".join(f"(({holds}) ? '' : {message})" for holds, message in rules)
    return {"expression": f"!({guard}) || ({' && '.join(f'({holds})' for holds, _ in rules)})",
            "messageExpression": f"[{broken}].filter(m, m != '').join('; ')", "reason": "Forbidden"}


def _label(key: str) -> str:
    return f"has(object.metadata.labels) && '{key}' in object.metadata.labels"


def checks(limits: str, limits_present: str, who: str, remote_code_unset: str = "false") -> list[Rule]:
    """Every lock and every limit of the runtime whose limits are at `limits` (present when `limits_present`),
    named by the CEL string `who`; the values are value_variables'. allowTrustRemoteCode limits when unset too:
    `remote_code_unset` says what unset means (a record from before the limit existed: true)."""
    def limit(name: str) -> str:
        return f"({limits_present} && has({limits}.{name}))"

    out = []
    for path, what in LOCKABLE.items():
        given = [] if path == "queueName" else [(_has("object.spec", path), f"spec.{path}")]
        if path in LOCKED_LABELS:
            given.append((_label(LOCKED_LABELS[path]), f"metadata.labels.{LOCKED_LABELS[path]}"))
        for present_, where in given:
            out.append((f"!({limit('locked')} && '{path}' in {limits}.locked) || !({present_})",
                        f"'{where}: {what} is locked by ' + {who} + ' (limits.locked): remove {where}, the runtime "
                        "sets it'"))
    allowed = f"({limits_present} && has({limits}.allowTrustRemoteCode) ? {limits}.allowTrustRemoteCode : " \
              f"{remote_code_unset})"
    out.append((f"!({REMOTE_CODE}) || {allowed}",
                f"'spec.model.trustRemoteCode is true: ' + {who} + ' allows limits.allowTrustRemoteCode = false; "
                "remove it (a model in transformers itself needs none), or ask the admin to allow it'"))
    out.append((f"!({REWARD_CODE}) || {allowed}",
                f"'spec.method.grpo.rewards: a reward function from a ConfigMap is Python the job brings, and ' + "
                f"{who} + ' allows limits.allowTrustRemoteCode = false; use a built-in reward or a function from "
                "the image, or ask the admin to allow it'"))
    rules = [
        ("maxNodes", f"variables.nodes <= {limits}.maxNodes",
         f"'spec.distributed.numNodes is ' + string(variables.nodes) + ': ' + {who} + ' allows limits.maxNodes = ' "
         f"+ string({limits}.maxNodes) + '; ask for fewer nodes, or use another runtime'"),
        ("maxGpusPerJob", f"variables.nodes * variables.gpusPerNode <= {limits}.maxGpusPerJob",
         "'spec.distributed asks for ' + string(variables.nodes) + ' nodes x ' + string(variables.gpusPerNode) + "
         f"' GPUs = ' + string(variables.nodes * variables.gpusPerNode) + ': ' + {who} + ' allows "
         f"limits.maxGpusPerJob = ' + string({limits}.maxGpusPerJob) + '; ask for fewer GPUs, or use "
         "another runtime'"),
        ("allowedMethods", f"variables.method in {limits}.allowedMethods",
         f"'spec.method.type is ' + variables.method + ': ' + {who} + ' allows limits.allowedMethods ' + "
         f"{limits}.allowedMethods.join(', ')"),
        ("allowedStrategies", f"variables.strategy in {limits}.allowedStrategies",
         f"'spec.distributed.strategy is ' + variables.strategy + ': ' + {who} + ' allows limits.allowedStrategies "
         f"' + {limits}.allowedStrategies.join(', ')"),
        ("allowedModelSources", f"variables.modelSources.all(s, {limits}.allowedModelSources.exists(p, "
         "s[1].startsWith(p)))",
         f"variables.modelSources.filter(s, !{limits}.allowedModelSources.exists(p, s[1].startsWith(p)))"
         ".map(s, s[0] + ' is ' + s[1]).join(', ') + "
         f"': ' + {who} + ' allows limits.allowedModelSources ' + {limits}.allowedModelSources.join(', ') + "
         "'; load them from under one of those prefixes'"),
        ("allowedOutputs", f"variables.outputs.all(s, {limits}.allowedOutputs.exists(p, s[1].startsWith(p)))",
         f"variables.outputs.filter(s, !{limits}.allowedOutputs.exists(p, s[1].startsWith(p)))"
         ".map(s, s[0] + ' is ' + s[1]).join(', ') + "
         f"': ' + {who} + ' allows limits.allowedOutputs ' + {limits}.allowedOutputs.join(', ') + "
         "'; write under one of those prefixes'"),
        ("allowedDataSources", f"variables.dataSources.all(s, {limits}.allowedDataSources.exists(p, "
         "s.startsWith(p)))",
         f"'spec.data uses ' + variables.dataSources.filter(s, !{limits}.allowedDataSources.exists(p, "
         f"s.startsWith(p))).join(', ') + ': ' + {who} + ' allows limits.allowedDataSources ' + "
         f"{limits}.allowedDataSources.join(', ') + '; use data under one of those prefixes'"),
        ("allowedClaims", f"variables.claims.all(n, n in {limits}.allowedClaims)",
         f"'spec mounts the claim(s) ' + variables.claims.filter(n, !(n in {limits}.allowedClaims))"
         f".join(', ') + ': ' + {who} + ' allows limits.allowedClaims ' + "
         f"{limits}.allowedClaims.join(', ') + '; mount one of those claims'"),
        ("allowedVolumeKinds", f"variables.volumeKinds.all(k, k in {limits}.allowedVolumeKinds)",
         "'spec.pod.volumes mounts ' + variables.volumeKinds.filter(k, !(k in "
         f"{limits}.allowedVolumeKinds)).join(', ') + ': ' + {who} + ' allows limits.allowedVolumeKinds ' + "
         f"{limits}.allowedVolumeKinds.join(', ')"),
        ("allowedClaims", f"({limit('allowedVolumeKinds')}) || !('nfs' in variables.volumeKinds)",
         f"'spec.pod.volumes mounts an nfs export: ' + {who} + ' allows limits.allowedClaims ' + "
         f"{limits}.allowedClaims.join(', ') + ', and so no nfs volume (storage is those claims unless "
         "limits.allowedVolumeKinds lists nfs); mount the export through a PersistentVolumeClaim'"),
        ("maxActiveDeadlineSeconds", f"variables.deadline > 0 && variables.deadline <= "
         f"{limits}.maxActiveDeadlineSeconds",
         "'spec.runPolicy.activeDeadlineSeconds is ' + (variables.deadline > 0 ? string(variables.deadline) : "
         f"'unset') + ': ' + {who} + ' allows limits.maxActiveDeadlineSeconds = ' + "
         f"string({limits}.maxActiveDeadlineSeconds) + '; set it to at most that'"),
    ]
    return out + [(f"!{limit(name)} || ({holds})", message) for name, holds, message in rules]


def lent_rules(who: str, locked: Callable[[str], str]) -> list[Rule]:
    """While the runtime lends the job a credential (variables.lent), every field that says where credentials go
    is locked, while it lends what a tracker logs in with, what the tracker writes into, and while it lends
    anything, the job's own Secret variables are credentials only (api/runtime_limits.py); `locked(path)` (CEL) says
    when the lock itself says so already."""
    endpoints = [(f"{locked(path)} || size(variables.lent) == 0 || !({_has('object.spec', path)})",
                  f"'spec.{path}: {LOCKABLE[path]} is locked: ' + {who} + ' lends the job credentials (' + "
                  "variables.lent.join(', ') + '), and a job may not say where they are sent; remove it, or give "
                  "the job its own credentials instead of the runtime\\'s'")
                 for path in ENDPOINT_FIELDS]
    lent_from = "spec.template."  # how variables.lent names each lent field
    lending = "[" + ", ".join(f"'{lent_from}{p}'" for p in TRACKER_LENDING) + "]"
    tracker_lent = f"variables.lent.filter(l, l in {lending})"
    trackers = [(f"{locked(path)} || size({tracker_lent}) == 0 || "
                 f"!({_has('object.spec', path)})",
                 f"'spec.{path}: {LOCKABLE[path]} is locked: ' + {who} + ' lends the job what a tracker logs in "
                 f"with (' + {tracker_lent}.join(', ') + '), and a job may not choose what it writes into; remove "
                 "it (the runtime\\'s is used; for the project, else the job\\'s namespace), or give the job its "
                 "own (' + " + f"{tracker_lent}.map(l, l.substring({len(lent_from)})).join(', ') + ') instead of the "
                 "runtime\\'s'")
                for path in TRACKER_FIELDS]
    names = "[" + ", ".join(f"'{n}'" for n in OWN_SECRET_ENV_NAMES) + "]"
    settings = f"object.spec.pod.secretEnv.filter(e, !(e.name.upperAscii() in {names}))"
    own_secret_env = (f"size(variables.lent) == 0 || "
                      f"!({_has('object.spec', 'pod.secretEnv')}) || size({settings}) == 0",
                      f"'spec.pod.secretEnv names ' + {settings}.map(e, e.name).join(', ') + ': ' + {who} + ' lends "
                      "the job credentials (' + variables.lent.join(', ') + '), and while it does, a variable of the "
                      "job\\'s own is one of the credentials it may bring, not a setting (pod.env is locked: such a "
                      f"variable can send a lent token elsewhere); use one of {', '.join(OWN_SECRET_ENV_NAMES)}, or "
                      "give the job its own credentials for everything instead of the runtime\\'s'")
    return endpoints + trackers + [own_secret_env]


def _label_value(root: str, key: str) -> str:
    return f"(has({root}.metadata.labels) && '{key}' in {root}.metadata.labels ? {root}.metadata.labels['{key}'] : '')"


def relabelled_variable() -> dict[str, str]:
    """The Kueue labels an update changes (queue, priority, time limit): they reach the next attempt's Job, so they
    are part of what a job runs, as status.startedSpecDigest counts them (render/workload.py)."""
    parts = " + ".join(
        f"({_label_value('object', k)} != {_label_value('oldObject', k)} ? ['metadata.labels[{k}]'] : [])"
        for k in c.KUEUE_JOB_LABELS)
    return {"name": "relabelled", "expression": f"request.operation == 'UPDATE' ? {parts} : []"}


def _live_variables(kind: str) -> list[dict[str, str]]:
    named = (f"has(object.spec.runtimeRef) && object.spec.runtimeRef.name == params.metadata.name && "
             f"(has(object.spec.runtimeRef.kind) ? object.spec.runtimeRef.kind : '{c.CLUSTER_RUNTIME_KIND}') == "
             f"'{kind}'")
    selected = (selector_matches("params.spec.namespaceSelector", "variables.namespaceLabels")
                if kind == c.CLUSTER_RUNTIME_KIND else "true")
    return [
        # A job already recorded is judged by its snapshot, not by the live runtimes; one started without a runtime
        # by none, as long as what it runs is unchanged (a default added later must not cap a running job, nor
        # leave it uncapped once it is edited).
        changed_variable(),
        relabelled_variable(),
        {"name": "live", "expression": f"!({RECORDED}) && !(({STARTED_WITHOUT}) && size(variables.changed) == 0 && "
                                       "size(variables.relabelled) == 0)"},
        {"name": "namespaceLabels", "expression": NAMESPACE_LABELS},
        {"name": "selected", "expression": selected},
        {"name": "named", "expression": named},
        {"name": "applies", "expression": "variables.live && (variables.named ? variables.selected : "
                                          "(!has(object.spec.runtimeRef) && has(params.spec) && "
                                          "has(params.spec.default) && params.spec.default && variables.selected))"},
    ]


def _policy(name: str, variables: list[dict[str, str]], validations: list[dict[str, str]],
            param_kind: str | None) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{
            "apiGroups": [c.GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
            "resources": [c.PLURAL]}]},
        "variables": variables, "validations": validations}
    binding: dict[str, Any] = {"policyName": name, "validationActions": ["Deny"]}
    if param_kind is not None:
        spec = {"failurePolicy": "Fail", "paramKind": {"apiVersion": c.API_VERSION, "kind": param_kind}, **spec}
        # Every runtime of the kind is a param; each validation picks the one(s) that apply. No runtime at all:
        # nothing to check.
        binding["paramRef"] = {"selector": {}, "parameterNotFoundAction": "Allow"}
    return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": name}, "spec": spec},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": name}, "spec": binding}]


def live_policy(kind: str) -> list[dict[str, Any]]:
    """Jobs that have not started, against the runtimes of `kind` as they are now."""
    who = f"'{kind} ' + params.metadata.name"
    validations = []
    if kind == c.CLUSTER_RUNTIME_KIND:
        validations.append({
            "expression": "!(variables.live && variables.named) || variables.selected",
            "messageExpression": f"'spec.runtimeRef: ' + {who} + ' may not be used in namespace ' + "
                                 "request.namespace + ': its spec.namespaceSelector does not match the labels of "
                                 "the namespace; name a runtime this namespace may use, or ask a cluster admin to "
                                 "label the namespace'",
            "reason": "Forbidden"})
    limits = "params.spec.limits"
    rules = checks(limits, present(limits), who)
    rules += lent_rules(who, lambda path: f"({present(limits)} && has({limits}.locked) && '{path}' in "
                                          f"{limits}.locked)")
    validations.append(combined("variables.applies", rules))
    return _policy(POLICY_NAME[kind], _live_variables(kind) + value_variables("params.spec.template"), validations,
                   kind)


def snapshot_policy() -> list[dict[str, Any]]:
    """Jobs that have started, against the runtime recorded in their status (each layer's limits as recorded)."""
    validations = []
    for i in range(MAX_LAYERS):
        layer = f"{SNAPSHOT}.layers[{i}]"
        who = f"{layer}.kind + ' ' + {layer}.name + ' as recorded when the job started'"
        validations.append(combined(f"variables.recorded && size({SNAPSHOT}.layers) > {i}",
                                    checks(f"{layer}.limits", "true", who, remote_code_unset="true")))
    who = f"{SNAPSHOT}.kind + ' ' + {SNAPSHOT}.name + ' as recorded when the job started'"
    validations.append(combined("variables.recorded", lent_rules(who, lambda path: (
        f"{SNAPSHOT}.layers.exists(l, has(l.limits.locked) && '{path}' in l.limits.locked)"))))
    variables = [{"name": "recorded", "expression": RECORDED}] + value_variables(f"{SNAPSHOT}.template")
    return _policy(SNAPSHOT_POLICY, variables, validations, None)
