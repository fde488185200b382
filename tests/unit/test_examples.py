"""Every example validates and renders (the cluster tier also dry-runs them on the real apiserver)."""

import pytest
import yaml

from finetune_operator.api.validation import validate_job
from finetune_operator.render import RenderContext, render_all
from tests.conftest import EXAMPLES


def test_the_examples_issue_2_promises_exist():
    names = {p.name for p in EXAMPLES}
    assert {"tiny-cpu-sft.yaml", "llama-lora-zero3-2x8.yaml", "cpt-fsdp.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_validates_and_renders(path):
    (doc,) = list(yaml.safe_load_all(path.read_text()))
    job = validate_job(doc)
    objects = render_all(job.spec, RenderContext(name=job.name, namespace=job.namespace, job_labels=job.labels))
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "Job"]


def test_zero3_example_really_is_two_nodes_of_eight_gpus_with_lora():
    doc = yaml.safe_load((EXAMPLES[0].parent / "llama-lora-zero3-2x8.yaml").read_text())
    job = validate_job(doc)
    d = job.spec.distributed
    assert (d.num_nodes, d.gpus_per_node, d.strategy, d.deepspeed.zero_stage) == (2, 8, "deepspeed", 3)
    assert job.spec.method.type == "lora"
    assert job.spec.global_batch_size == 2 * 4 * 16
