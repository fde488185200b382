"""The CRD is generated from the models, structural, documented, and the committed copy never drifts."""

import pytest
import yaml

from finetune_operator.api.crd import crd, crd_yaml
from tests.conftest import CRD_FILE


def walk(schema, path="$"):
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")


def spec_schema():
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_the_generator():
    assert CRD_FILE.read_text() == crd_yaml(), "crds/finetunejob.yaml is stale: run ./hack/generate.sh"


def test_schema_is_structural():
    for path, node in walk(spec_schema()):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"


def test_every_spec_field_has_a_description():
    root = spec_schema()["properties"]["spec"]
    missing = [p for p, node in walk(root, "spec")
               if p != "spec" and not node.get("description") and "[]" not in p[-2:]]
    assert missing == []


def test_names_status_subresource_and_printer_columns():
    doc = yaml.safe_load(CRD_FILE.read_text())
    assert doc["metadata"]["name"] == "finetunejobs.finetunejob.dev"
    assert doc["spec"]["names"]["shortNames"] == ["ftj"]
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    for expected in ("Phase", "Nodes", "GPUs", "Progress", "Loss", "Age"):
        assert expected in columns
    # The phase column reads status.phase, not "the last condition" (the Kueue "Suspended" trap).
    assert version["additionalPrinterColumns"][0]["jsonPath"] == ".status.phase"


def test_free_form_fields_keep_unknown_fields():
    spec = spec_schema()["properties"]["spec"]["properties"]
    assert spec["training"]["properties"]["extraArgs"]["x-kubernetes-preserve-unknown-fields"] is True
    inline = spec["data"]["properties"]["train"]["items"]["properties"]["inline"]
    assert inline["items"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["pod"]["properties"]["nodeSelector"]["additionalProperties"] == {"type": "string"}


def test_schema_limits_mirror_the_models():
    dist = spec_schema()["properties"]["spec"]["properties"]["distributed"]["properties"]
    assert dist["numNodes"]["minimum"] == 1 and dist["numNodes"]["type"] == "integer"
    assert dist["strategy"]["enum"] == ["ddp", "fsdp", "deepspeed"]
    assert dist["deepspeed"]["properties"]["zeroStage"]["enum"] == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["finetunejob", "finetuneruntime", "clusterfinetuneruntime"])
def test_every_quantity_is_checked_by_the_apiserver_itself(name):
    """The quantity pattern reaches the CRD for each resources field, optional ones included (a Field pattern on an
    optional field was enforced by pydantic and left out of the schema: the apiserver took `cpu: lots`)."""
    from finetune_operator.api.resources import QUANTITY_PATTERN

    doc = yaml.safe_load((CRD_FILE.parent / f"{name}.yaml").read_text())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    resources = (spec.get("template") or {"properties": spec})["properties"]["resources"]["properties"]
    fields = ("cpu", "memory", "ephemeralStorage", "shmSize")
    assert {f: resources[f].get("pattern") for f in fields} == {f: QUANTITY_PATTERN for f in fields}


def test_chart_ships_the_same_crd():
    chart_copy = CRD_FILE.parents[1] / "charts" / "finetunejob" / "crds" / "finetunejob.yaml"
    assert chart_copy.read_text() == CRD_FILE.read_text(), "run ./hack/generate.sh"


def test_chart_values_and_schema_are_generated():
    import json as _json

    from finetune_operator.api.chart_values import values_schema, values_yaml

    chart = CRD_FILE.parents[1] / "charts" / "finetunejob"
    assert (chart / "values.yaml").read_text() == values_yaml(), "run ./hack/generate.sh"
    assert _json.loads((chart / "values.schema.json").read_text()) == values_schema(), "run ./hack/generate.sh"


def test_spec_reference_is_generated():
    from finetune_operator.api.reference import spec_reference

    reference = CRD_FILE.parents[1] / "docs" / "reference" / "spec.md"
    assert reference.read_text() == spec_reference(), "run ./hack/generate.sh"
    assert "`spec.distributed.deepspeed.zeroStage`" in reference.read_text()


def test_trainer_progress_payload_fits_the_status_model_and_is_rounded():
    """What rank 0 patches into status.progress passes the status model (the CRD schema's source) and reads well
    in `kubectl get ftj`: 4 significant digits of loss, whole tokens/s."""
    from finetune_operator.api.status import Progress
    from finetune_trainer.training.callbacks import status_progress

    record = {"time": "2026-11-23T10:00:00Z", "step": 13, "maxSteps": 30, "epoch": 0.43333333333,
              "loss": 6.161258220672607, "evalLoss": 5.98712345, "learningRate": 0.0035123456,
              "tokensPerSecond": 2796.4069254628266, "tokensPerSecondPerDevice": 1398.2034627314133, "mfu": 0.4213,
              "peakMemoryGiB": 61.2712, "tokensSeen": 1000, "eta": "0m03s", "checkpoint": None}
    progress = status_progress(record)
    Progress.model_validate(progress)
    assert progress["loss"] == 6.161 and progress["evalLoss"] == 5.987
    assert progress["tokensPerSecond"] == 2796 and progress["tokensPerSecondPerDevice"] == 1398
    assert progress["percent"] == 43 and progress["mfu"] == 0.4213
    assert "tokensSeen" not in progress and "checkpoint" not in progress


def test_grafana_dashboard_queries_only_metrics_the_operator_exports():
    import json as _json
    import re

    from prometheus_client import REGISTRY

    from finetune_operator.controller import metrics  # noqa: F401 - registers the operator's metrics

    exported = {m.name for m in REGISTRY.collect()}
    dashboard = _json.loads((CRD_FILE.parents[1] / "charts" / "finetunejob" / "dashboards" /
                             "finetunejob-operator.json").read_text())
    queried = {name for p in dashboard["panels"] for t in p["targets"]
               for name in re.findall(r"finetunejob_[a-z_]+", t["expr"])}
    base = {re.sub(r"_(bucket|total|count|sum)$", "", q) for q in queried}
    assert queried and base <= exported, base - exported


YAML11_BOOLEAN_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false"}


def test_no_enum_has_a_word_that_yaml_reads_as_a_boolean_without_taking_the_boolean():
    """kubectl's YAML parser reads an unquoted off/no/on/yes as a boolean before the apiserver sees it: an enum with
    such a word must take the boolean (an untyped field whose words the operator checks), or the docs' spelling
    fails at `kubectl apply`."""
    trapped, taken = [], []
    for path, node in walk(spec_schema()["properties"]["spec"], "$.spec"):  # the status is written as JSON
        if {str(w).lower() for w in node.get("enum") or []} & YAML11_BOOLEAN_WORDS:
            trapped.append(path)
        if "means off)" in node.get("description", "") or "means no)" in node.get("description", ""):
            assert "type" not in node and node.get("x-kubernetes-preserve-unknown-fields") is True, path
            taken.append(path)
    assert trapped == []
    assert sorted(taken) == ["$.spec.checkpoints.saveStrategy", "$.spec.runPolicy.divergence.action",
                             "$.spec.training.evalStrategy"]


def test_a_word_the_schema_cannot_check_is_refused_by_validation_with_its_path():
    from finetune_operator.api.errors import InvalidSpec
    from finetune_operator.api.validation import validate_job
    from tests.builders import make_job

    with pytest.raises(InvalidSpec, match=r"spec\.runPolicy\.divergence\.action.*'stop', 'warn' or 'off'"):
        validate_job(make_job({"spec.runPolicy": {"divergence": {"action": "stp"}}}))
    with pytest.raises(InvalidSpec, match=r"spec\.checkpoints\.saveStrategy"):
        validate_job(make_job({"spec.checkpoints": {"saveStrategy": True}}))


@pytest.mark.parametrize(("text", "path", "word"), [
    ("runPolicy: {divergence: {action: off}}", ("run_policy", "divergence", "action"), "off"),
    ("checkpoints: {saveStrategy: no}", ("checkpoints", "save_strategy"), "no"),
    ("training: {evalStrategy: no}", ("training", "eval_strategy"), "no"),
])
def test_the_unquoted_words_are_read_as_written(text, path, word):
    from finetune_operator.api.spec import FineTuneJobSpec

    doc = {"model": {"name": "/models/x"}, "data": {"format": "text", "train": [{"path": "/d.txt"}]},
           **yaml.safe_load(text)}
    value = FineTuneJobSpec.model_validate(doc)
    for part in path:
        value = getattr(value, part)
    assert value == word


def test_the_admission_policy_keeps_every_field_the_operator_writes_from_trainers():
    """charts/.../admission-policy.yaml lists the status fields a trainer may not change: the operator's own."""
    import re

    from finetune_operator.controller.planning import OPERATOR_STATUS_FIELDS
    from tests.conftest import ROOT

    template = (ROOT / "charts" / "finetunejob" / "templates" / "admission-policy.yaml").read_text()
    listed = re.search(r"\$operatorFields := list (.*?) }}", template)
    assert listed is not None
    assert tuple(re.findall(r'"(\w+)"', listed.group(1))) == OPERATOR_STATUS_FIELDS
