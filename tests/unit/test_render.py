"""render_all: pure, deterministic, and right for each topology (DDP, FSDP, ZeRO-2/3, LoRA, QLoRA, CPU)."""

import json

import pytest

from finetune_operator.api import constants as c
from finetune_operator.api.validation import validate_job
from finetune_operator.render import RenderContext, render_all, render_trainer_identity
from finetune_operator.render.workload import render_workload
from tests.builders import make_job
from tests.support.pod_runner import expand

CTX = RenderContext(name="test-job", namespace="ml", attempt=2, trainer_image="registry.local/trainer:1")


def render(overrides=None, ctx=CTX, labels=None):
    job = validate_job(make_job(overrides))
    ctx = RenderContext(**{**ctx.__dict__, "job_labels": labels or {}})
    objects = render_all(job.spec, ctx)
    return {o["kind"]: o for o in objects}


def files(objs):
    return {k: json.loads(v) for k, v in objs["ConfigMap"]["data"].items()}


def container(objs):
    return objs["Job"]["spec"]["template"]["spec"]["containers"][0]


def env_of(objs):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objs)["env"]}


def test_children_and_apply_order():
    objs = render_all(validate_job(make_job()).spec, CTX)
    assert [o["kind"] for o in objs] == ["ConfigMap", "Service", "Job"]
    assert all(o["metadata"]["namespace"] == "ml" for o in objs)


def test_render_is_deterministic():
    spec = validate_job(make_job()).spec
    assert render_all(spec, CTX) == render_all(spec, CTX)


def test_multi_node_ddp_rendezvous_contract():
    objs = render({"spec.distributed.numNodes": 4, "spec.distributed.gpusPerNode": 8})
    job = objs["Job"]
    assert job["metadata"]["name"] == "test-job-a2"
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["subdomain"] == objs["Service"]["metadata"]["name"] == "test-job"
    env = env_of(objs)
    assert env[c.ENV_PET_NNODES] == "4"
    assert env[c.ENV_PET_NPROC_PER_NODE] == "8"
    # The kubelet expands the attempt from the pod's own label: every attempt's containers are the same.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert env[c.ENV_ATTEMPT] == {"fieldRef": {"fieldPath": f"metadata.labels['{c.LABEL_ATTEMPT}']"}}
    assert labels[c.LABEL_ATTEMPT] == "2"
    assert expand(env[c.ENV_PET_MASTER_ADDR], {c.ENV_ATTEMPT: labels[c.LABEL_ATTEMPT]}) == \
        "test-job-a2-0.test-job.ml.svc"
    assert env[c.ENV_PET_MASTER_PORT] == "29500"
    assert env[c.ENV_PET_NODE_RANK] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert container(objs)["resources"]["limits"]["nvidia.com/gpu"] == "8"
    args = files(objs)[c.CONFIG_FILE]["trainingArguments"]
    assert args["ddp_find_unused_parameters"] is False  # lora default freezes the base
    assert "use_cpu" not in args and "deepspeed" not in args and "fsdp" not in args


def test_headless_service_publishes_not_ready_addresses():
    svc = render({"spec.distributed.rendezvousPort": 23456})["Service"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {c.LABEL_JOB: "test-job"}
    assert svc["spec"]["ports"][0]["port"] == 23456


def test_fsdp_config_file_and_arguments():
    objs = render({"spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 4,
                   "spec.distributed.strategy": "fsdp", "spec.method.type": "full",
                   "spec.distributed.fsdp": {"shardingStrategy": "shard_grad_op", "offloadParams": True,
                                             "transformerLayerClasses": ["LlamaDecoderLayer"]}})
    f = files(objs)
    assert f[c.FSDP_FILE] == {
        "version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_offload": True, "activation_checkpointing": False, "cpu_ram_efficient_loading": True,
        "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "reshard_after_forward": False,
    }
    args = f[c.CONFIG_FILE]["trainingArguments"]
    assert args["fsdp"] is True and args["fsdp_config"] == "/etc/finetune/fsdp.json"
    assert c.DEEPSPEED_FILE not in f


def test_fsdp1_keeps_prefetch_and_strategy_names():
    objs = render({"spec.distributed.strategy": "fsdp", "spec.distributed.fsdp": {
        "version": 1, "shardingStrategy": "hybrid_shard", "forwardPrefetch": True}})
    fsdp = files(objs)[c.FSDP_FILE]
    assert fsdp["reshard_after_forward"] == "HYBRID_SHARD"
    assert fsdp["backward_prefetch"] == "BACKWARD_PRE" and fsdp["forward_prefetch"] is True


def test_zero2_preset_uses_auto_for_trainer_values():
    objs = render({"spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {"zeroStage": 2}})
    ds = files(objs)[c.DEEPSPEED_FILE]
    assert ds["zero_optimization"]["stage"] == 2
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
        assert ds[key] == "auto"
    assert ds["bf16"]["enabled"] == "auto"
    assert "offload_optimizer" not in ds["zero_optimization"]
    assert files(objs)[c.CONFIG_FILE]["trainingArguments"]["deepspeed"] == "/etc/finetune/deepspeed.json"


def test_zero3_gathers_16bit_weights_on_save():
    objs = render({"spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {"zeroStage": 3}})
    zero = files(objs)[c.DEEPSPEED_FILE]["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True


def test_zero3_cpu_offload_uses_deepspeed_optimizer_and_pinned_memory():
    objs = render({"spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {
        "zeroStage": 3, "offloadOptimizer": "cpu", "offloadParams": "cpu"}})
    ds = files(objs)[c.DEEPSPEED_FILE]
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert ds["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert ds["optimizer"]["type"] == "AdamW"


def test_deepspeed_user_overrides_merge_deeply():
    objs = render({"spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {
        "zeroStage": 3, "config": {"zero_optimization": {"sub_group_size": 5}, "steps_per_print": 10}}})
    ds = files(objs)[c.DEEPSPEED_FILE]
    assert ds["zero_optimization"]["sub_group_size"] == 5
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True  # preset kept
    assert ds["steps_per_print"] == 10


def test_lora_settings_reach_the_trainer_config():
    objs = render({"spec.method": {"type": "lora", "lora": {"r": 64, "alpha": 16, "targetModules": ["q_proj"]}},
                   "spec.method.neftuneNoiseAlpha": 5})
    cfg = files(objs)[c.CONFIG_FILE]
    assert cfg["spec"]["method"]["lora"]["r"] == 64
    assert cfg["spec"]["method"]["lora"]["targetModules"] == ["q_proj"]
    assert cfg["trainingArguments"]["neftune_noise_alpha"] == 5


def test_qlora_single_gpu():
    objs = render({"spec.method.type": "qlora", "spec.model.quantization": "4bit"})
    cfg = files(objs)[c.CONFIG_FILE]
    assert cfg["spec"]["model"]["quantization"] == "4bit"
    assert container(objs)["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_cpu_job_requests_no_gpu_and_sets_use_cpu():
    objs = render({"spec.distributed.gpusPerNode": 0, "spec.distributed.cpuProcessesPerNode": 2,
                   "spec.resources.cpu": "4", "spec.resources.memory": "8Gi", "spec.training.precision": "fp32"})
    res = container(objs)["resources"]
    assert res["limits"] == {"cpu": "4", "memory": "8Gi"} and res["requests"] == res["limits"]
    env = env_of(objs)
    assert env[c.ENV_PET_NPROC_PER_NODE] == "2"
    assert env["DS_ACCELERATOR"] == "cpu"
    args = files(objs)[c.CONFIG_FILE]["trainingArguments"]
    assert args["use_cpu"] is True and args["bf16"] is False and args["fp16"] is False


@pytest.mark.parametrize("gpus", [0, 8])
def test_ephemeral_storage_is_requested_and_bounded_beside_cpu_memory_and_gpus(gpus):
    objs = render({"spec.distributed.gpusPerNode": gpus, "spec.distributed.numNodes": 2,
                   "spec.resources.ephemeralStorage": "200Gi", "spec.resources.memory": "64Gi",
                   **({"spec.training.precision": "fp32"} if gpus == 0 else {})})
    res = container(objs)["resources"]  # one template for every node's pod (an Indexed Job)
    assert res["requests"] == res["limits"] == {"ephemeral-storage": "200Gi", "memory": "64Gi",
                                                **({"nvidia.com/gpu": "8"} if gpus else {})}
    unset = container(render({}))["resources"]
    assert "ephemeral-storage" not in unset["requests"] and "ephemeral-storage" not in unset["limits"]


@pytest.mark.parametrize("disk,asked", [("50Gi", "4Gi"), ("4Gi", "4Gi"), ("4000Mi", "4000Mi"), ("5G", "4Gi"),
                                        ("1Gi", "1Gi")])
def test_the_preflight_pod_states_ephemeral_storage_when_the_job_does_and_keeps_its_own_small_amounts(disk, asked):
    """A namespace quota on ephemeral-storage (or limits.cpu) refuses a pod that does not state it: the preflight
    states it, no more than it needs (no weights, no corpus), and never more than the job allows its pods."""
    from finetune_operator.render.preflight import PREFLIGHT_RESOURCES, render_preflight

    job = validate_job(make_job({"spec.resources.ephemeralStorage": disk, "spec.resources.memory": "64Gi"}))
    (_, pre) = render_preflight(job.spec, CTX)
    res = pre["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": asked},
                   "limits": {"cpu": "1", "memory": "8Gi", "ephemeral-storage": asked}}
    assert set(res["limits"]) >= set(res["requests"])  # every kind requested is limited too
    assert "ephemeral-storage" not in PREFLIGHT_RESOURCES["requests"]  # the shared constant is left alone
    (_, plain) = render_preflight(validate_job(make_job()).spec, CTX)
    assert plain["spec"]["template"]["spec"]["containers"][0]["resources"] == PREFLIGHT_RESOURCES


def test_command_is_an_argv_list_and_user_strings_stay_data():
    hostile = "x'; rm -rf / #\n$(id)"
    objs = render({"spec.pod.env": [{"name": "NOTE", "value": hostile}],
                   "spec.data.train": [{"path": f"/data/{hostile}"}]})
    cmd = container(objs)["command"]
    assert cmd == ["python", "-m", "finetune_trainer.launch", "--config", "/etc/finetune/trainer.json"]
    assert env_of(objs)["NOTE"] == hostile
    # The trainer config is JSON produced by json.dumps: the hostile path round-trips unchanged.
    assert files(objs)[c.CONFIG_FILE]["spec"]["data"]["train"][0]["path"] == f"/data/{hostile}"


def test_secrets_only_by_reference():
    objs = render({"spec.pod.secretEnv": [{"name": "HF_TOKEN", "secretName": "hf", "key": "token"}]})
    assert env_of(objs)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token", "optional": False}}


def test_pod_security_hardening():
    objs = render()
    pod = objs["Job"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == "finetunejob-trainer"
    sc = container(objs)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True


def test_trainer_identity_may_only_patch_status():
    objs = {o["kind"]: o for o in render_trainer_identity("ml", None)}
    assert list(objs) == ["ServiceAccount", "Role", "RoleBinding"]
    assert objs["Role"]["rules"] == [{"apiGroups": ["finetunejob.dev"], "resources": ["finetunejobs/status"],
                                      "verbs": ["patch"]}]
    assert objs["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "finetunejob-trainer",
                                                "namespace": "ml"}]
    assert render_trainer_identity("ml", None) == render_trainer_identity("ml", None)  # shared, so identical


def test_a_user_service_account_may_patch_its_own_jobs_status_only_through_children_of_the_job():
    assert render_trainer_identity("ml", "workload-identity") == []  # no namespace-wide binding
    objs = render({"spec.pod.serviceAccountName": "workload-identity"})
    assert objs["Role"]["metadata"]["name"] == objs["RoleBinding"]["metadata"]["name"] == "finetunejob-trainer-test-job"
    assert objs["Role"]["rules"] == [{"apiGroups": ["finetunejob.dev"], "resources": ["finetunejobs/status"],
                                      "verbs": ["patch"], "resourceNames": ["test-job"]}]
    assert objs["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "workload-identity",
                                                "namespace": "ml"}]
    assert objs["Job"]["spec"]["template"]["spec"]["serviceAccountName"] == "workload-identity"
    assert "Role" not in render({})  # the shared identity is namespace infrastructure, not a child


def test_volumes_shm_config_and_output_claim():
    objs = render({"spec.output.claimName": "shared", "spec.resources.shmSize": "32Gi"})
    volumes = {v["name"]: v for v in objs["Job"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert volumes["config"]["configMap"]["name"] == "test-job-config"
    assert volumes["output"]["persistentVolumeClaim"]["claimName"] == "shared"
    mounts = {m["name"]: m for m in container(objs)["volumeMounts"]}
    assert mounts["output"]["subPath"] == "test-job"
    assert mounts["config"]["readOnly"] is True


def test_user_volumes_are_mounted_as_written():
    objs = render({"spec.pod.volumes": [
        {"name": "models", "mountPath": "/models", "readOnly": True, "claimName": "team-models", "subPath": "llama"},
        {"name": "creds", "mountPath": "/etc/creds", "secret": "s3-credentials"},
        {"name": "corpus", "mountPath": "/data", "nfs": {"server": "10.0.0.5", "path": "/exports/corpus"},
         "readOnly": True},
        {"name": "prompts", "mountPath": "/prompts", "configMap": "prompts"},
    ]})
    pod = objs["Job"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"] == {"name": "models",
                                 "persistentVolumeClaim": {"claimName": "team-models", "readOnly": True}}
    assert volumes["creds"] == {"name": "creds", "secret": {"secretName": "s3-credentials"}}
    assert volumes["corpus"]["nfs"] == {"server": "10.0.0.5", "path": "/exports/corpus", "readOnly": True}
    assert volumes["prompts"]["configMap"] == {"name": "prompts"}
    mounts = {m["name"]: m for m in container(objs)["volumeMounts"]}
    assert mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": True, "subPath": "llama"}
    assert mounts["creds"] == {"name": "creds", "mountPath": "/etc/creds", "readOnly": False}
    assert {"config", "output", "cache", "tmp", "dshm"} < set(mounts)  # the trainer's own mounts stay


def test_termination_grace_leaves_time_for_the_sigterm_checkpoint():
    assert render()["Job"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 300
    objs = render({"spec.pod.terminationGracePeriodSeconds": 1200})
    assert objs["Job"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 1200


def test_labels_and_kueue_queue_makes_workload_suspended():
    objs = render(labels={c.LABEL_KUEUE_QUEUE: "gpu-queue"})
    job = objs["Job"]
    assert job["metadata"]["labels"][c.LABEL_KUEUE_QUEUE] == "gpu-queue"
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][c.LABEL_ATTEMPT] == "2"
    for obj in objs.values():
        assert obj["metadata"]["labels"][c.LABEL_MANAGED_BY] == c.MANAGED_BY
        assert obj["metadata"]["labels"][c.LABEL_INSTANCE] == "test-job"


def test_a_queued_attempt_never_fails_by_itself_and_can_take_over_the_last_attempts_workload():
    """Kueue finishes a failed Job's Workload (the quota and the place in the queue go with it): a queued Job
    leaves its pod failures to the operator, and every attempt's pods are what Kueue compares, unchanged."""
    queue = {c.LABEL_KUEUE_QUEUE: "gpu-queue", c.LABEL_KUEUE_PREBUILT: "a-users-own"}
    first = render(ctx=RenderContext(**{**CTX.__dict__, "attempt": 1}), labels=queue)["Job"]
    third = render(ctx=RenderContext(**{**CTX.__dict__, "attempt": 3, "resume_from": "/output/checkpoint-40",
                                        "kueue_workload": "job-test-job-a1-x"}), labels=queue)["Job"]
    assert first["spec"]["backoffLimit"] == third["spec"]["backoffLimit"] > 1000
    assert render()["Job"]["spec"]["backoffLimit"] == 0  # not queued: one failed pod fails the Job
    assert c.LABEL_KUEUE_PREBUILT not in first["metadata"]["labels"]  # never a user's
    assert third["metadata"]["labels"][c.LABEL_KUEUE_PREBUILT] == "job-test-job-a1-x"
    assert first["spec"]["template"]["spec"]["containers"] == third["spec"]["template"]["spec"]["containers"]
    hashes = {j["metadata"]["annotations"][c.ANNOTATION_POD_SET_HASH] for j in (first, third)}
    assert len(hashes) == 1
    other = render({"spec.distributed.numNodes": 3}, labels=queue)["Job"]
    assert other["metadata"]["annotations"][c.ANNOTATION_POD_SET_HASH] not in hashes


def test_suspend_and_scheduling_fields():
    objs = render({"spec.suspend": True, "spec.pod.nodeSelector": {"pool": "a100"},
                   "spec.pod.priorityClassName": "high", "spec.pod.schedulerName": "volcano",
                   "spec.pod.tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    pod = objs["Job"]["spec"]["template"]["spec"]
    assert objs["Job"]["spec"]["suspend"] is True
    assert pod["nodeSelector"] == {"pool": "a100"} and pod["priorityClassName"] == "high"
    assert pod["schedulerName"] == "volcano"
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


@pytest.mark.parametrize(("training", "expected"), [
    ({"warmupRatio": 0.03}, 0.03),
    ({"warmupSteps": 100, "warmupRatio": 0.5}, 100),
], ids=["ratio", "steps-win"])
def test_warmup_maps_to_transformers5_warmup_steps(training, expected):
    objs = render({f"spec.training.{k}": v for k, v in training.items()})
    assert files(objs)[c.CONFIG_FILE]["trainingArguments"]["warmup_steps"] == expected


def test_extra_args_reach_training_arguments():
    objs = render({"spec.training.extraArgs": {"adam_beta2": 0.95}})
    assert files(objs)[c.CONFIG_FILE]["trainingArguments"]["adam_beta2"] == 0.95


def test_streaming_makes_each_process_fetch_its_own_batches():
    args = files(render({"spec.data.streaming": True, "spec.training.maxSteps": 100}))[c.CONFIG_FILE]
    assert args["trainingArguments"]["accelerator_config"] == {"dispatch_batches": False}
    assert "accelerator_config" not in files(render())[c.CONFIG_FILE]["trainingArguments"]


def test_spec_hash_changes_with_the_spec():
    a = render()["Job"]["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH]
    b = render({"spec.training.learningRate": 0.5})["Job"]["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH]
    assert a != b and len(a) == 16


@pytest.mark.parametrize("digest", ["spec_hash", "attempt_spec_hash"])
def test_a_field_a_newer_operator_adds_with_a_default_leaves_the_digests(digest):
    """The Jobs an operator wrote keep their digests across an upgrade that adds an optional field, or a suspended
    job resumed by the new operator would read as edited (SpecChanged, a new attempt) though nobody touched it."""
    from pydantic import Field

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_operator.api.training import TrainingSpec
    from finetune_operator.render import workload

    class NewerTraining(TrainingSpec):
        added_knob: int = Field(default=3, alias="addedKnob")

    class NewerSpec(FineTuneJobSpec):
        training: NewerTraining = Field(default_factory=NewerTraining)
        added_section: str = Field(default="on", alias="addedSection")

    written = make_job({"spec.training.learningRate": 0.5})["spec"]
    before = getattr(workload, digest)(FineTuneJobSpec.model_validate(written))
    assert getattr(workload, digest)(NewerSpec.model_validate(written)) == before
    # A value other than the default changes the digest (one written as the default is the same spec).
    assert getattr(workload, digest)(NewerSpec.model_validate({**written, "addedSection": "off"})) != before


def test_a_job_whose_digest_an_operator_wrote_before_defaults_were_left_out_is_no_edit():
    """The upgrade itself: Jobs carry the digest of every field, defaults included; resumed by this operator they
    are not edited (SpecChanged, a new attempt), and an edit is still one."""
    import hashlib

    from finetune_operator.controller.suspension import edited
    from finetune_operator.render.workload import APPLIED_AT_ONCE, attempt_spec_hash

    spec = validate_job(make_job()).spec
    everything = json.dumps(spec.model_dump(mode="json", by_alias=True, exclude=APPLIED_AT_ONCE), sort_keys=True)
    before = hashlib.sha256(everything.encode()).hexdigest()[:16]  # what the operator before wrote
    job = {"metadata": {"annotations": {c.ANNOTATION_ATTEMPT_SPEC_HASH: before}}}
    assert before != attempt_spec_hash(spec) and not edited(spec, job)
    assert not edited(spec, {"metadata": {"annotations": {c.ANNOTATION_ATTEMPT_SPEC_HASH: attempt_spec_hash(spec)}}})
    assert edited(validate_job(make_job({"spec.training.learningRate": 0.5})).spec, job)


def test_preflight_job_is_one_small_cpu_pod_with_the_trainers_config_and_volumes():
    from finetune_operator.render.preflight import render_preflight

    spec = validate_job(make_job({"spec.runPolicy.preflight": True, "spec.distributed.gpusPerNode": 8,
                                  "spec.pod.volumes": [{"name": "data", "mountPath": "/data", "claimName": "d"}]})).spec
    config_map, job = render_preflight(spec, RenderContext(**{**CTX.__dict__, "attempt": 1,
                                                              "job_labels": {c.LABEL_KUEUE_QUEUE: "gpu"}}))
    assert config_map["metadata"]["name"] == "test-job-config" and c.CONFIG_FILE in config_map["data"]
    assert job["metadata"]["name"] == "test-job-a0" and job["metadata"]["labels"][c.LABEL_ATTEMPT] == "0"
    assert c.LABEL_KUEUE_QUEUE not in job["metadata"]["labels"] and job["spec"]["suspend"] is False
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (1, 1)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "finetune_trainer.preflight", "--config",
                                    f"{CTX.config_dir}/{c.CONFIG_FILE}"]
    assert not any("gpu" in name for name in {**container["resources"]["requests"],
                                               **container["resources"]["limits"]})
    assert {"name": "data", "mountPath": "/data", "readOnly": False} in container["volumeMounts"]
    assert pod["serviceAccountName"] == "finetunejob-trainer" and pod["securityContext"]["runAsNonRoot"] is True


def test_trackers_and_the_push_token_are_rendered_from_secrets_only():
    objs = render({"spec.tracking": {"reportTo": ["wandb", "mlflow"], "runName": "sft-v2",
                                     "mlflow": {"trackingUri": "http://mlflow.mlflow:5000"}},
                   "spec.pod.secretEnv": [{"name": "WANDB_API_KEY", "secretName": "wandb", "key": "api-key"}],
                   "spec.output.push": {"repo": "acme/llama-sft", "tokenSecret": {"name": "hf-write"}}})
    args = files(objs)[c.CONFIG_FILE]["trainingArguments"]
    assert args["report_to"] == ["tensorboard", "wandb", "mlflow"] and args["run_name"] == "sft-v2"
    assert "push_to_hub" not in args and "hub_token" not in args  # the trainer pushes itself, after saving
    env = env_of(objs)
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-write", "key": "token"}}
    assert env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "api-key", "optional": False}}
    assert not any("value" in e and e["name"] in c.SECRET_ENV_NAMES for e in container(objs)["env"])


def test_without_trackers_only_tensorboard_and_the_job_name():
    args = files(render())[c.CONFIG_FILE]["trainingArguments"]
    assert args["report_to"] == ["tensorboard"] and args["run_name"] == "test-job"


SHARED_CACHE = {"spec.data.cacheDir": "/hf-cache/team",
                "spec.pod.volumes": [{"name": "hf-cache", "mountPath": "/hf-cache", "claimName": "hf-cache"}]}


@pytest.mark.parametrize("trust_remote_code", [False, True])
@pytest.mark.parametrize(("where", "patch", "cache"), [
    ("default", {}, c.CACHE_MOUNT_PATH),
    ("shared claim", SHARED_CACHE, "/hf-cache/team"),
    ("output volume", {"spec.data.cacheDir": f"{c.OUTPUT_MOUNT_PATH}/.cache"}, f"{c.OUTPUT_MOUNT_PATH}/.cache"),
])
def test_caches_are_the_pods_own_unless_cachedir_says_and_code_is_always(where, patch, cache, trust_remote_code):
    """Whoever can write a cache chooses what is loaded from it: by default nothing outlives the pod, a cacheDir is
    the user's choice for data and weights, and a model that brings code is always fetched into the pod."""
    objs = render({**patch, "spec.model.trustRemoteCode": trust_remote_code})
    env, config = env_of(objs), files(objs)[c.CONFIG_FILE]
    pod_cache = c.CACHE_MOUNT_PATH
    assert config["cacheDir"] == cache and config["podCacheDir"] == pod_cache
    assert config["cacheNodeLocal"] is (where == "default")
    assert env["HF_HOME"] == f"{pod_cache if trust_remote_code else cache}/huggingface"
    assert env["HF_MODULES_CACHE"] == f"{pod_cache}/modules"
    volumes = {v["name"]: v for v in objs["Job"]["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in container(objs)["volumeMounts"] if m["mountPath"] == pod_cache)
    assert volumes[mount["name"]] == {"name": mount["name"], "emptyDir": {}}
    if where == "default":  # nothing of the cache on the output volume, which others may write
        assert not any(str(v).startswith(c.OUTPUT_MOUNT_PATH) for v in (*env.values(), config["cacheDir"]))


def test_the_same_cache_paths_on_every_attempt():
    job = validate_job(make_job({"spec.output.claimName": "shared"}))
    envs = [{e["name"]: e.get("value") for e in render_workload(job.spec, RenderContext(
        name=job.name, namespace="d", attempt=attempt))["spec"]["template"]["spec"]["containers"][0]["env"]}
        for attempt in (1, 2)]
    assert envs[0]["HF_HOME"] == envs[1]["HF_HOME"] == f"{c.CACHE_MOUNT_PATH}/huggingface"


@pytest.mark.parametrize(("distributed", "sharded"), [
    ({"strategy": "ddp"}, False),
    ({"strategy": "deepspeed", "deepspeed": {"zeroStage": 2}}, False),
    ({"strategy": "deepspeed", "deepspeed": {"zeroStage": 3}}, True),
    ({"strategy": "fsdp"}, True),
])
def test_which_strategies_shard_the_parameters(distributed, sharded):
    """Generation samples under these need every rank (synced_gpus); the trainer asks the API, not its own rule."""
    spec = validate_job(make_job({"spec.distributed": {"numNodes": 2, "gpusPerNode": 8, **distributed}})).spec
    assert spec.distributed.shards_parameters is sharded


def test_output_in_object_storage_needs_no_volume_and_credentials_stay_in_their_secret():
    objs = render({"spec.output": {"uri": "s3://training/runs/x"},
                   "spec.s3": {"endpointURL": "http://minio.storage:9000", "region": "us-east-1",
                               "credentialsSecret": "s3-creds"}})
    pod = objs["Job"]["spec"]["template"]["spec"]
    output = next(v for v in pod["volumes"] if v["name"] == "output")
    assert output == {"name": "output", "emptyDir": {}}  # no claim at all
    env = env_of(objs)
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SESSION_TOKEN"] == {"secretKeyRef": {"name": "s3-creds", "key": "AWS_SESSION_TOKEN",
                                                         "optional": True}}
    config = files(objs)["trainer.json"]
    assert config["spec"]["output"]["uri"] == "s3://training/runs/x"
    assert config["spec"]["s3"]["endpointURL"] == "http://minio.storage:9000"
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(objs["ConfigMap"])


def test_a_gang_network_policy_admits_only_its_own_pods_when_the_operator_is_asked_to():
    assert "NetworkPolicy" not in render()
    objs = render(ctx=RenderContext(**{**CTX.__dict__, "network_policy": True}))
    policy = objs["NetworkPolicy"]["spec"]
    own = {"matchLabels": {c.LABEL_JOB: "test-job"}}
    assert policy == {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own}]}]}
    pod_labels = objs["Job"]["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[c.LABEL_JOB] == "test-job"  # the gang's pods are what the policy selects
