"""extraArgs are checked against the installed transformers, and what we render is accepted by it."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from finetune_operator.api import constants as c
from finetune_operator.api.training import MANAGED_TRAINING_ARGUMENTS
from finetune_operator.api.transformers_names import (
    OPTIMIZER_NAMES,
    REPORTING_INTEGRATIONS,
    SCHEDULER_NAMES,
    TRAINING_ARGUMENT_NAMES,
)
from finetune_operator.api.validation import validate_job
from finetune_operator.generate import NAMES_MODULE, names_module
from finetune_operator.render import RenderContext
from finetune_operator.render.configmap import config_files
from tests.builders import make_job
from tests.conftest import EXAMPLES

transformers = pytest.importorskip("transformers")


def real_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}


def test_generated_names_match_the_installed_transformers():
    """The operator ships these names instead of transformers; the pinned transformers is the truth."""
    from transformers.trainer_utils import SchedulerType
    from transformers.training_args import OptimizerNames

    assert real_fields() == TRAINING_ARGUMENT_NAMES
    assert {o.value for o in OptimizerNames} == OPTIMIZER_NAMES
    assert {s.value for s in SchedulerType} == SCHEDULER_NAMES
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    assert set(INTEGRATION_TO_CALLBACK) == REPORTING_INTEGRATIONS and {"wandb", "mlflow"} <= REPORTING_INTEGRATIONS
    assert NAMES_MODULE.read_text() == names_module(), "api/transformers_names.py is stale: run ./hack/generate.sh"


def test_every_managed_name_is_a_real_field():
    assert set(MANAGED_TRAINING_ARGUMENTS) - real_fields() == set()


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_rendered_arguments_have_only_real_names(path):
    job = validate_job(yaml.safe_load(path.read_text()))
    args = json.loads(config_files(job.spec, RenderContext(name=job.name, namespace="d"))["trainer.json"])
    assert set(args["trainingArguments"]) <= real_fields()


def test_cpu_example_arguments_build_a_real_training_arguments(tmp_path):
    """The CPU example's arguments, parsed by HfArgumentParser, give the TrainingArguments we intend."""
    path = next(p for p in EXAMPLES if p.name == "tiny-cpu-sft.yaml")
    job = validate_job(yaml.safe_load(path.read_text()))
    ctx = RenderContext(name=job.name, namespace="d", output_dir=str(tmp_path / "out"), config_dir=str(tmp_path))
    args = json.loads(config_files(job.spec, ctx)["trainer.json"])["trainingArguments"]
    (parsed,) = transformers.HfArgumentParser(transformers.TrainingArguments).parse_dict(args)
    assert parsed.use_cpu is True and parsed.max_steps == 30 and parsed.save_total_limit == 2
    assert parsed.report_to == ["tensorboard"]


def test_deepspeed_arguments_build_a_real_training_arguments(tmp_path):
    job = validate_job(yaml.safe_load(next(p for p in EXAMPLES if "zero3" in p.name).read_text()))
    ctx = RenderContext(name=job.name, namespace="d", output_dir=str(tmp_path / "out"), config_dir=str(tmp_path))
    files = config_files(job.spec, ctx)
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    args = json.loads(files["trainer.json"])["trainingArguments"]
    args["use_cpu"] = True  # no GPU here; the DeepSpeed JSON is still loaded and its "auto" values filled
    pytest.importorskip("deepspeed")
    (parsed,) = transformers.HfArgumentParser(transformers.TrainingArguments).parse_dict(args)
    ds = parsed.hf_deepspeed_config.config
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == 4


def test_fsdp_config_reaches_training_arguments(tmp_path):
    """FSDP cannot run on CPU; what can be checked here is that TrainingArguments reads our fsdp.json as intended."""
    job = validate_job(yaml.safe_load(next(p for p in EXAMPLES if p.name == "cpt-fsdp.yaml").read_text()))
    ctx = RenderContext(name=job.name, namespace="d", output_dir=str(tmp_path / "out"), config_dir=str(tmp_path))
    files = config_files(job.spec, ctx)
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    args = json.loads(files["trainer.json"])["trainingArguments"]
    args["use_cpu"] = True  # bf16 without a GPU is refused otherwise; the FSDP parsing is what is under test
    (parsed,) = transformers.HfArgumentParser(transformers.TrainingArguments).parse_dict(args)
    assert parsed.fsdp is True
    assert parsed.fsdp_config["version"] == 2
    assert parsed.fsdp_config["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    assert parsed.fsdp_config["activation_checkpointing"] is True
    assert parsed.fsdp_config["state_dict_type"] == "SHARDED_STATE_DICT"


def test_trainer_refuses_fsdp_on_cpu(tmp_path):
    from finetune_trainer.config import load_config
    from finetune_trainer.errors import ConfigError

    job = validate_job(yaml.safe_load(next(p for p in EXAMPLES if p.name == "cpt-fsdp.yaml").read_text()))
    doc = json.loads(config_files(job.spec, RenderContext(name=job.name, namespace="d"))["trainer.json"])
    doc["spec"]["distributed"]["gpusPerNode"] = 0  # a hand-edited config that skipped the operator's validation
    path = tmp_path / "trainer.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="FSDP through the Trainer needs GPUs"):
        load_config(path)


def test_the_trainer_caches_where_the_config_says(tmp_path):
    from finetune_trainer.config import load_config

    job = validate_job(make_job({"spec.data.cacheDir": "/hf-cache/team", "spec.pod.volumes": [
        {"name": "hf-cache", "mountPath": "/hf-cache", "claimName": "hf-cache"}]}))
    for ctx, expected in ((RenderContext(name=job.name, namespace="d"), "/hf-cache/team"),
                          (RenderContext(name=job.name, namespace="d", output_dir=str(tmp_path),
                                         cache_dir=str(tmp_path / ".cache")), str(tmp_path / ".cache"))):
        path = tmp_path / "trainer.json"
        path.write_text(config_files(job.spec, ctx)["trainer.json"])
        assert load_config(path).cache == Path(expected)


@pytest.mark.parametrize("trust_remote_code", [False, True])
@pytest.mark.parametrize("cache_dir", [None, "/hf-cache/team", "/output/.cache"])
@pytest.mark.parametrize("local_run", [False, True])
def test_s3_models_are_staged_where_nobody_else_writes_when_they_bring_code(tmp_path, trust_remote_code, cache_dir,
                                                                             local_run):
    """The trainer's side of render's cache paths: which cache s3:// models go to, and who tokenizes first."""
    from finetune_trainer.config import load_config

    job = validate_job(make_job({"spec.model.trustRemoteCode": trust_remote_code, "spec.data.cacheDir": cache_dir,
                                 "spec.pod.volumes": [{"name": "hf-cache", "mountPath": "/hf-cache",
                                                       "claimName": "hf-cache"}]}))
    ctx = RenderContext(name=job.name, namespace="d", **({"output_dir": str(tmp_path),
                                                          "cache_dir": str(tmp_path / ".cache")} if local_run else {}))
    path = tmp_path / "trainer.json"
    path.write_text(config_files(job.spec, ctx)["trainer.json"])
    cfg = load_config(path)
    pod_cache = tmp_path / ".cache" if local_run else Path(c.CACHE_MOUNT_PATH)
    shared = tmp_path / ".cache" if local_run else Path(cache_dir or c.CACHE_MOUNT_PATH)
    assert cfg.cache == shared and cfg.pod_cache_dir == pod_cache
    assert cfg.model_cache == (pod_cache if trust_remote_code else shared)
    assert cfg.cache_node_local is (not local_run and cache_dir is None)


@pytest.mark.parametrize("extra", [{"logging_strategy": "no"}, {"logging_strategy": "epoch"},
                                   {"logging_first_step": False}])
def test_extra_args_cannot_stop_the_losses_the_divergence_guard_reads(extra):
    """A review's run: extraArgs.logging_strategy: "no" left the guard nothing to judge (a loss of 3,457 ended
    Succeeded). Refused with the field path and where logging is set."""
    from finetune_operator.api.errors import InvalidSpec

    doc = yaml.safe_load(next(p for p in EXAMPLES if p.name == "tiny-cpu-sft.yaml").read_text())
    doc["spec"]["training"]["extraArgs"] = extra
    with pytest.raises(InvalidSpec) as refused:
        validate_job(doc)
    (name,) = extra
    assert f"spec.training.extraArgs.{name}" in str(refused.value) and "divergence guard" in str(refused.value)
