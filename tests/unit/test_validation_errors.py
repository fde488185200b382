"""Bad input: every case names the field path and pins the message; all errors come back at once."""

import math

import pytest

from finetune_operator.api.constants import HF_CACHE_ENV_NAMES
from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.validation import validate_job
from tests.builders import DELETE, make_job

CPU = {"spec.distributed.gpusPerNode": 0}

# (case id, overrides, expected path, pinned message fragment)
BAD_INPUTS = [
    ("name-missing", {"metadata.name": DELETE}, "metadata.name", "a name is required"),
    ("name-uppercase", {"metadata.name": "Llama_SFT"}, "metadata.name", "must be a DNS-1035 label"),
    ("name-too-long", {"metadata.name": "a" * 49}, "metadata.name", "pod hostnames"),
    ("wrong-api-version", {"apiVersion": "finetunejob.dev/v9"}, "apiVersion", "unsupported apiVersion"),
    ("wrong-kind", {"kind": "PyTorchJob"}, "kind", "this is not a FineTuneJob"),
    ("spec-missing", {"spec": DELETE}, "spec", "spec is required"),
    ("model-missing", {"spec.model": DELETE}, "spec.model", "required field is missing"),
    ("model-name-empty", {"spec.model.name": ""}, "spec.model.name", "at least 1 character"),
    ("model-other-scheme", {"spec.model.name": "s4://models/x"}, "spec.model.name",
     "s4:// is not a location the trainer reads"),
    ("data-other-scheme", {"spec.data.train": [{"path": "gs://bucket/train.jsonl"}]}, "spec.data.train[0].path",
     "gs:// is not a location the trainer reads"),
    ("lowercase-credential", {"spec.pod.env": [{"name": "aws_secret_access_key", "value": "x"}]},
     "spec.pod.env[0].name", "holds a credential"),
    ("model-unknown-field", {"spec.model.dtpe": "bfloat16"}, "spec.model.dtpe", "unknown field"),
    ("dtype-invalid", {"spec.model.dtype": "bf16"}, "spec.model.dtype", "Input should be 'auto'"),
    ("quantization-invalid", {"spec.model.quantization": "2bit"}, "spec.model.quantization", "'none', '8bit'"),
    ("format-invalid", {"spec.data.format": "alpacaa"}, "spec.data.format", "'alpaca', 'sharegpt'"),
    ("train-empty", {"spec.data.train": []}, "spec.data.train", "at least 1 item"),
    ("source-two-origins", {"spec.data.train": [{"path": "/a", "hub": {"name": "b"}}]}, "spec.data.train[0]",
     "exactly one of path, hub or inline"),
    ("source-no-origin", {"spec.data.train": [{}]}, "spec.data.train[0]", "exactly one of path, hub or inline"),
    ("split-over-50", {"spec.data.validationSplitPercentage": 80}, "spec.data.validationSplitPercentage",
     "less than or equal to 50"),
    ("block-size-not-text", {"spec.data.blockSize": 512}, "spec.data.blockSize", "applies to format text only"),
    ("packing-text", {"spec.data.format": "text", "spec.data.packing": True}, "spec.data.packing",
     "always cut into full blocks"),
    ("max-length-tiny", {"spec.data.maxLength": 4}, "spec.data.maxLength", "greater than or equal to 16"),
    ("method-invalid", {"spec.method.type": "prefix"}, "spec.method.type", "'full', 'lora', 'qlora'"),
    ("qlora-without-4bit", {"spec.method.type": "qlora"}, "spec.method.type", "qlora trains adapters on a 4-bit"),
    ("full-quantized", {"spec.method.type": "full", "spec.model.quantization": "8bit"}, "spec.model.quantization",
     "cannot train quantized weights"),
    ("lora-rank-zero", {"spec.method.lora": {"r": 0}}, "spec.method.lora.r", "greater than or equal to 1"),
    ("lr-string", {"spec.training.learningRate": "fast"}, "spec.training.learningRate", "valid number"),
    ("lr-negative", {"spec.training.learningRate": -1}, "spec.training.learningRate", "greater than 0"),
    ("batch-zero", {"spec.training.perDeviceTrainBatchSize": 0}, "spec.training.perDeviceTrainBatchSize",
     "greater than or equal to 1"),
    ("epochs-string", {"spec.training.epochs": "three"}, "spec.training.epochs", "valid number"),
    ("eval-steps-missing", {"spec.training.evalStrategy": "steps", "spec.data.validationSplitPercentage": 5},
     "spec.training.evalSteps", "evalStrategy steps needs evalSteps"),
    ("eval-without-data", {"spec.training.evalStrategy": "epoch"}, "spec.training.evalStrategy",
     "evaluation needs validation data"),
    ("extra-arg-unknown", {"spec.training.extraArgs": {"adam_beta3": 0.9}}, "spec.training.extraArgs.adam_beta3",
     "not a TrainingArguments field"),
    ("extra-arg-managed", {"spec.training.extraArgs": {"output_dir": "/x"}}, "spec.training.extraArgs.output_dir",
     "managed by the operator"),
    ("extra-arg-weights-only-checkpoints", {"spec.training.extraArgs": {"save_only_model": True}},
     "spec.training.extraArgs.save_only_model", "managed by the operator"),
    ("extra-arg-duplicates-field", {"spec.training.extraArgs": {"learning_rate": 1}},
     "spec.training.extraArgs.learning_rate", "managed by the operator"),
    ("num-nodes-zero", {"spec.distributed.numNodes": 0}, "spec.distributed.numNodes", "greater than or equal to 1"),
    ("num-nodes-string", {"spec.distributed.numNodes": "two"}, "spec.distributed.numNodes", "valid integer"),
    ("gpus-negative", {"spec.distributed.gpusPerNode": -1}, "spec.distributed.gpusPerNode",
     "greater than or equal to 0"),
    ("fsdp-and-deepspeed", {"spec.distributed.strategy": "fsdp", "spec.distributed.fsdp": {},
                            "spec.distributed.deepspeed": {}}, "spec.distributed.fsdp", "exclusive"),
    ("deepspeed-block-wrong-strategy", {"spec.distributed.deepspeed": {"zeroStage": 2}}, "spec.distributed.strategy",
     "strategy is not deepspeed"),
    ("zero-stage-4", {"spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {"zeroStage": 4}},
     "spec.distributed.deepspeed.zeroStage", "Input should be 0, 1, 2 or 3"),
    ("param-offload-stage2", {"spec.distributed.strategy": "deepspeed",
                              "spec.distributed.deepspeed": {"zeroStage": 2, "offloadParams": "cpu"}},
     "spec.distributed.deepspeed.offloadParams", "needs ZeRO stage 3"),
    ("zero3-quantized", {"spec.method.type": "qlora", "spec.model.quantization": "4bit",
                         "spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {"zeroStage": 3}},
     "spec.distributed.deepspeed.zeroStage", "ZeRO-3 cannot partition"),
    ("cpu-offload", {**CPU, "spec.distributed.strategy": "deepspeed",
                     "spec.distributed.deepspeed": {"zeroStage": 2, "offloadOptimizer": "cpu"}},
     "spec.distributed.deepspeed.offloadOptimizer", "a CPU job has no GPU memory to offload"),
    ("cpu-fsdp", {**CPU, "spec.distributed.strategy": "fsdp"}, "spec.distributed.strategy", "FSDP through the Trainer"),
    ("cpu-quantized", {**CPU, "spec.method.type": "qlora", "spec.model.quantization": "4bit"},
     "spec.model.quantization", "bitsandbytes quantization needs GPUs"),
    ("cpu-fp16", {**CPU, "spec.training.precision": "fp16"}, "spec.training.precision", "fp16 mixed precision needs"),
    ("cpu-flash-attention", {**CPU, "spec.model.attnImplementation": "flash_attention_2"},
     "spec.model.attnImplementation", "flash attention kernels need a GPU"),
    ("fsdp2-hybrid",
     {"spec.distributed.strategy": "fsdp", "spec.distributed.fsdp": {"shardingStrategy": "hybrid_shard"}},
     "spec.distributed.fsdp.shardingStrategy", "FSDP2 supports full_shard and shard_grad_op only"),
    ("rendezvous-port-low", {"spec.distributed.rendezvousPort": 80}, "spec.distributed.rendezvousPort",
     "greater than or equal to 1024"),
    ("reserved-env", {"spec.pod.env": [{"name": "PET_NNODES", "value": "3"}]}, "spec.pod.env[0].name",
     "PET_NNODES is set by the operator"),
    ("reserved-env-master", {"spec.pod.env": [{"name": "MASTER_ADDR", "value": "x"}]}, "spec.pod.env[0].name",
     "MASTER_ADDR is set by the operator"),
    ("reserved-env-nvidia-devices", {"spec.pod.env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
     "spec.pod.env[0].name", "NVIDIA_VISIBLE_DEVICES is set by the operator"),
    ("reserved-secret-env", {"spec.pod.secretEnv": [{"name": "WORLD_SIZE", "secretName": "s", "key": "k"}]},
     "spec.pod.secretEnv[0].name", "WORLD_SIZE is set by the operator"),
    ("env-name-with-equals", {"spec.pod.env": [{"name": "A=B", "value": "x"}]}, "spec.pod.env[0].name",
     "has an invalid format"),
    ("memory-not-quantity", {"spec.resources.memory": "lots"}, "spec.resources.memory", "has an invalid format"),
    ("shm-shell-injection", {"spec.resources.shmSize": "1Gi; rm -rf /"}, "spec.resources.shmSize",
     "has an invalid format"),
    ("ephemeral-storage-not-quantity", {"spec.resources.ephemeralStorage": "200 GB"},
     "spec.resources.ephemeralStorage", "has an invalid format"),
    ("ephemeral-storage-zero", {"spec.resources.ephemeralStorage": "0"}, "spec.resources.ephemeralStorage",
     "0 is not above zero"),
    ("memory-negative", {"spec.resources.memory": "-5Gi"}, "spec.resources.memory", "-5Gi is not above zero"),
    ("cpu-zero-millicores", {"spec.resources.cpu": "0m"}, "spec.resources.cpu", "0m is not above zero"),
    ("shm-zero-exponent", {"spec.resources.shmSize": "0e3"}, "spec.resources.shmSize", "0e3 is not above zero"),
    ("image-with-space", {"spec.pod.image": "x:1 --privileged"}, "spec.pod.image", "has an invalid format"),
    ("sub-path-parent", {"spec.output.claimName": "c", "spec.output.subPath": "a/../../etc"}, "spec.output.subPath",
     "may not contain '..'"),
    ("merge-without-adapter", {"spec.method.type": "full", "spec.output.mergeAdapter": True},
     "spec.output.mergeAdapter", "has no adapter to merge"),
    ("resume-relative", {"spec.checkpoints.resume": "checkpoint-10"}, "spec.checkpoints.resume",
     "must be auto, never or an absolute path"),
    # A location that could climb out of a runtime's allowed prefixes (api/sources.py).
    ("model-climbs", {"spec.model.name": "/models/../output/evil"}, "spec.model.name", "'.' or '..' segments"),
    ("tokenizer-hub-climbs", {"spec.model.tokenizer": "org/../evil"}, "spec.model.tokenizer", "'..' segments"),
    ("init-from-empty-segment", {"spec.method.lora.initFrom": "/adapters//x"}, "spec.method.lora.initFrom",
     "empty segment"),
    ("data-percent-encoded", {"spec.data.train": [{"path": "/data/%2e%2e/secret"}]}, "spec.data.train[0].path",
     "may not contain '%'"),
    ("data-s3-climbs", {"spec.data.train": [{"path": "s3://data/../other-bucket/x"}]}, "spec.data.train[0].path",
     "'..' segments"),
    ("hub-dataset-climbs", {"spec.data.train": [{"hub": {"name": "tatsu-lab/../evil"}}]},
     "spec.data.train[0].hub.name", "'..' segments"),
    ("resume-climbs", {"spec.checkpoints.resume": "/output/../models/x"}, "spec.checkpoints.resume",
     "'..' segments"),
    ("backoff-negative", {"spec.runPolicy.backoffLimit": -1}, "spec.runPolicy.backoffLimit",
     "greater than or equal to 0"),
    ("streaming-without-max-steps", {"spec.data.streaming": True}, "spec.training.maxSteps",
     "a streamed dataset has no length"),
    ("gpu-resource-unqualified", {"spec.resources.gpuResourceName": "gpu"}, "spec.resources.gpuResourceName",
     "<vendor-domain>/<name>"),
    ("gpu-resource-kubernetes-io", {"spec.resources.gpuResourceName": "kubernetes.io/gpu"},
     "spec.resources.gpuResourceName", "Kubernetes' own resources"),
    ("volume-no-source", {"spec.pod.volumes": [{"name": "m", "mountPath": "/models"}]}, "spec.pod.volumes[0]",
     "exactly one of claimName, configMap, secret, nfs"),
    ("volume-two-sources", {"spec.pod.volumes": [{"name": "m", "mountPath": "/m", "claimName": "a", "secret": "b"}]},
     "spec.pod.volumes[0]", "exactly one of"),
    ("volume-hides-output", {"spec.pod.volumes": [{"name": "m", "mountPath": "/output", "claimName": "a"}]},
     "spec.pod.volumes[0].mountPath", "overlaps the trainer's own /output"),
    ("volume-above-config", {"spec.pod.volumes": [{"name": "m", "mountPath": "/etc", "claimName": "a"}]},
     "spec.pod.volumes[0].mountPath", "overlaps the trainer's own /etc/finetune"),
    # The image's code (a review mounted a tenant's ConfigMap at the working directory, which `python -m` puts first
    # on sys.path, and a .pth file into site-packages: code beside lent credentials without allowTrustRemoteCode).
    ("volume-at-the-working-directory", {"spec.pod.volumes": [{"name": "m", "mountPath": "/home/trainer",
                                                               "configMap": "mine"}]},
     "spec.pod.volumes[0].mountPath", "overlaps the trainer's own /home/trainer"),
    ("volume-into-site-packages", {"spec.pod.volumes": [{
        "name": "m", "mountPath": "/opt/venv/lib/python3.11/site-packages/zz.pth", "subPath": "evil.pth",
        "configMap": "mine"}]}, "spec.pod.volumes[0].mountPath", "overlaps the trainer's own /opt/venv"),
    ("volume-sitecustomize-in-the-interpreter", {"spec.pod.volumes": [{
        "name": "m", "mountPath": "/usr/local/lib/python3.11/sitecustomize.py", "subPath": "s.py",
        "configMap": "mine"}]}, "spec.pod.volumes[0].mountPath", "overlaps the trainer's own /usr"),
    ("volume-relative-path", {"spec.pod.volumes": [{"name": "m", "mountPath": "models", "claimName": "a"}]},
     "spec.pod.volumes[0].mountPath", "must be an absolute path"),
    ("volume-dotdot-path", {"spec.pod.volumes": [{"name": "m", "mountPath": "/a/../output", "claimName": "a"}]},
     "spec.pod.volumes[0].mountPath", "without '..'"),
    ("volume-reserved-name", {"spec.pod.volumes": [{"name": "output", "mountPath": "/m", "claimName": "a"}]},
     "spec.pod.volumes[0].name", "a volume of the trainer itself"),
    ("volume-subpath-escapes", {"spec.pod.volumes": [{"name": "m", "mountPath": "/m", "claimName": "a",
                                                      "subPath": "x/../../y"}]},
     "spec.pod.volumes[0].subPath", "may not contain '..'"),
    ("volumes-same-name", {"spec.pod.volumes": [{"name": "m", "mountPath": "/a", "claimName": "a"},
                                                {"name": "m", "mountPath": "/b", "claimName": "b"}]},
     "spec.pod.volumes[1].name", "volumes[0] has the same name"),
    ("volumes-nested", {"spec.pod.volumes": [{"name": "a", "mountPath": "/data", "claimName": "a"},
                                             {"name": "b", "mountPath": "/data/extra", "claimName": "b"}]},
     "spec.pod.volumes[1].mountPath", "overlaps volumes[0].mountPath /data"),
    ("grace-negative", {"spec.pod.terminationGracePeriodSeconds": -1}, "spec.pod.terminationGracePeriodSeconds",
     "greater than or equal to 0"),
    ("toleration-bad-operator", {"spec.pod.tolerations": [{"key": "k", "operator": "In"}]},
     "spec.pod.tolerations[0].operator", "'Exists' or 'Equal'"),
    ("early-stopping-without-eval", {"spec.evaluation.earlyStopping": {"patience": 2}}, "spec.training.evalStrategy",
     "evaluation.earlyStopping watches the validation loss"),
    ("early-stopping-saves-by-epoch", {"spec.evaluation.earlyStopping": {"patience": 2},
                                       "spec.data.validationSplitPercentage": 10, "spec.training.evalStrategy": "steps",
                                       "spec.training.evalSteps": 5, "spec.checkpoints.saveStrategy": "epoch"},
     "spec.checkpoints.saveStrategy", "one is needed at every evaluation"),
    ("early-stopping-save-steps", {"spec.evaluation.earlyStopping": {"patience": 2},
                                   "spec.data.validationSplitPercentage": 10, "spec.training.evalStrategy": "steps",
                                   "spec.training.evalSteps": 7, "spec.checkpoints.saveSteps": 10},
     "spec.checkpoints.saveSteps", "needs a checkpoint at evaluations (every 7 steps)"),
    ("init-from-full", {"spec.method.type": "full", "spec.method.lora.initFrom": "/models/adapter"},
     "spec.method.lora.initFrom", "but method full trains no adapter"),
    ("tracker-unknown", {"spec.tracking.reportTo": ["wandb", "weights-and-biases"]}, "spec.tracking.reportTo",
     "'weights-and-biases' is not a tracker transformers knows"),
    ("tracker-all", {"spec.tracking.reportTo": ["all"]}, "spec.tracking.reportTo", "name the trackers"),
    ("tracker-twice", {"spec.tracking.reportTo": ["mlflow", "mlflow"]}, "spec.tracking.reportTo", "listed twice"),
    ("wandb-without-key", {"spec.tracking.reportTo": ["wandb"]}, "spec.tracking.reportTo",
     "wandb needs an API key to log in"),
    ("mlflow-without-server", {"spec.tracking.reportTo": ["mlflow"]}, "spec.tracking.mlflow.trackingUri",
     "mlflow needs its tracking server"),
    ("mlflow-uri-credentials", {"spec.tracking.reportTo": ["mlflow"],
                                "spec.tracking.mlflow": {"trackingUri": "https://ml:s3cret@mlflow.corp"}},
     "spec.tracking.mlflow.trackingUri", "the URI holds credentials"),
    ("tracker-settings-unused", {"spec.tracking.wandb": {"offline": True}}, "spec.tracking.wandb",
     "wandb is not in tracking.reportTo"),
    ("secret-in-plain-env", {"spec.pod.env": [{"name": "WANDB_API_KEY", "value": "abc"}]}, "spec.pod.env[0].name",
     "WANDB_API_KEY holds a credential"),
    ("push-without-token", {"spec.output.push": {"repo": "acme/llama-sft"}}, "spec.output.push.tokenSecret",
     "pushing needs a Hub token"),
    ("push-token-twice", {"spec.output.push": {"repo": "acme/llama-sft", "tokenSecret": {"name": "hf"}},
                          "spec.pod.secretEnv": [{"name": "HF_TOKEN", "secretName": "hf", "key": "token"}]},
     "spec.output.push.tokenSecret", "HF_TOKEN is also given in pod.secretEnv"),
    ("push-repo-without-namespace", {"spec.output.push": {"repo": "llama-sft", "tokenSecret": {"name": "hf"}}},
     "spec.output.push.repo", "has an invalid format"),
    ("push-strategy-invalid", {"spec.output.push": {"repo": "a/b", "strategy": "every_save",
                                                    "tokenSecret": {"name": "hf"}}},
     "spec.output.push.strategy", "'end' or 'checkpoint'"),
    ("cache-dir-on-root", {"spec.data.cacheDir": "/hf-cache"}, "spec.data.cacheDir",
     "is on no volume, and the pods' root filesystem is read-only"),
    ("cache-dir-read-only", {"spec.data.cacheDir": "/models/.cache",
                             "spec.pod.volumes": [{"name": "m", "mountPath": "/models", "claimName": "models",
                                                   "readOnly": True}]},
     "spec.data.cacheDir", "is on a read-only volume"),
    ("cache-dir-relative", {"spec.data.cacheDir": "cache"}, "spec.data.cacheDir", "absolute"),
    ("push-to-hub-extra-arg", {"spec.training.extraArgs": {"push_to_hub": True}},
     "spec.training.extraArgs.push_to_hub", "managed by the operator"),
    ("early-stopping-patience-zero", {"spec.evaluation.earlyStopping": {"patience": 0}},
     "spec.evaluation.earlyStopping.patience", "greater than or equal to 1"),
]


@pytest.mark.parametrize(("overrides", "path", "message"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_names_path_and_rule(overrides, path, message):
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job(overrides))
    matching = [e for e in info.value.errors if e.path == path]
    assert matching, f"no error at {path}; got {[e.render() for e in info.value.errors]}"
    assert any(message in e.message for e in matching), [e.render() for e in matching]


def test_every_error_has_a_fix_or_a_self_explaining_message():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.distributed.numNodes": 0, "spec.model.dtpe": 1, "spec.data.format": "csv"}))
    assert len(info.value.errors) == 3
    for error in info.value.errors:
        assert error.fix or "should be" in error.message


def test_all_errors_at_once_across_sections():
    """A broken section does not hide rule violations in the others."""
    job = make_job({
        "spec.distributed.gpusPerNode": 0,
        "spec.distributed.strategy": "deepspeed",
        "spec.distributed.deepspeed": {"zeroStage": 3, "offloadOptimizer": "cpu"},  # section-level error
        "spec.method.type": "qlora",  # cross-section: needs 4bit (method x model)
        "spec.training.evalStrategy": "steps", "spec.training.evalSteps": 5,  # cross-section: no validation data
        "spec.training.extraArgs": {"adam_beta3": 1},  # TrainingArguments name
        "metadata.name": "Bad_Name",
    })
    with pytest.raises(InvalidSpec) as info:
        validate_job(job)
    paths = sorted(e.path for e in info.value.errors)
    assert paths == [
        "metadata.name",
        "spec.distributed.deepspeed.offloadOptimizer",
        "spec.method.type",
        "spec.training.evalStrategy",
        "spec.training.extraArgs.adam_beta3",
    ]


def test_rules_do_not_fire_on_sections_that_failed():
    """An invalid model section must not produce a false qlora/4bit error from default values."""
    job = make_job({"spec.model.quantization": "4bitt", "spec.method.type": "qlora"})
    with pytest.raises(InvalidSpec) as info:
        validate_job(job)
    assert [e.path for e in info.value.errors] == ["spec.model.quantization"]


def test_range_errors_say_the_limit():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.distributed.numNodes": 0}))
    assert info.value.errors[0].fix == "use a value >= 1"


def test_unknown_field_suggests_the_closest_name_and_lists_valid_ones():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.distributed.numNode": 2}))
    (error,) = info.value.errors
    assert error.path == "spec.distributed.numNode"
    assert error.fix.startswith("did you mean numNodes?")
    assert "gpusPerNode" in error.fix


def test_unknown_training_argument_suggests_the_closest_names_only():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.training.extraArgs": {"adam_beta3": 0.9, "zzz_not_close": 1}}))
    close, far = info.value.errors
    assert close.fix == "did you mean adam_beta2 or adam_beta1?"  # not ~150 names
    assert far.path == "spec.training.extraArgs.zzz_not_close" and "did you mean" not in far.fix
    assert "TrainingArguments reference" in far.fix


@pytest.mark.parametrize("name, fix", [
    ("evaluation_strategy", "set spec.training.evalStrategy"),
    ("group_by_length", "train_sampling_strategy: group_by_length"),
    ("logging_dir", "runs/ in the output directory"),
    ("overwrite_output_dir", "spec.checkpoints.resume"),
    ("save_safetensors", "always saved as safetensors"),
    ("fp16_opt_level", "spec.training.precision"),
], ids=lambda v: v if isinstance(v, str) and "_" in v and " " not in v else "")
def test_seed_era_training_arguments_name_where_the_setting_went(name, fix):
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({f"spec.training.extraArgs.{name}": True}))
    (error,) = info.value.errors
    assert error.path == f"spec.training.extraArgs.{name}" and "transformers 5." in error.message
    assert fix in error.fix


def test_retired_names_are_not_fields_of_the_pinned_transformers():
    from finetune_operator.api.training import RETIRED_TRAINING_ARGUMENTS
    from finetune_operator.api.transformers_names import TRAINING_ARGUMENT_NAMES

    assert set(RETIRED_TRAINING_ARGUMENTS) & TRAINING_ARGUMENT_NAMES == set()
    assert "train_sampling_strategy" in TRAINING_ARGUMENT_NAMES  # where group_by_length went


@pytest.mark.parametrize("overrides, path, message", [
    ({"spec.training.optim": "adamw_hf"}, "spec.training.optim", "not an optimizer of transformers"),
    ({"spec.training.lrScheduler": "cosine_with_min_lr"}, "spec.training.lrScheduler",
     "needs min_lr or min_lr_rate in extraArgs.lr_scheduler_kwargs"),
    ({"spec.training.lrScheduler": "cosine_with_min_lr",
      "spec.training.extraArgs.lr_scheduler_kwargs": {"min_lr": 1e-5, "min_lr_rate": 0.1}},
     "spec.training.lrScheduler", "needs min_lr or min_lr_rate"),
    ({"spec.training.lrScheduler": "warmup_stable_decay"}, "spec.training.lrScheduler", "needs num_decay_steps"),
    ({"spec.training.lrScheduler": "reduce_lr_on_plateau"}, "spec.training.lrScheduler", "steps on the eval loss"),
], ids=["optim-adamw_hf", "min-lr-missing", "min-lr-both", "wsd-decay-missing", "plateau-without-eval"])
def test_optimizer_and_scheduler_fail_at_validation_not_in_the_pod(overrides, path, message):
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job(overrides))
    (error,) = info.value.errors
    assert error.path == path and message in error.message and error.fix


def test_optimizer_fix_offers_the_closest_real_names():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.training.optim": "adamw_hf"}))
    assert "adamw_" in info.value.errors[0].fix


def test_schedulers_with_their_kwargs_are_accepted():
    ok = validate_job(make_job({"spec.training.lrScheduler": "cosine_with_min_lr",
                                "spec.training.extraArgs.lr_scheduler_kwargs": {"min_lr_rate": 0.1}}))
    assert ok.spec.training.extra_args["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}
    validate_job(make_job({"spec.training.lrScheduler": "warmup_stable_decay",
                           "spec.training.extraArgs.lr_scheduler_kwargs": {"num_decay_steps": 10}}))


def test_every_scheduler_the_api_offers_is_one_transformers_has():
    from typing import get_args

    from finetune_operator.api.training import Scheduler
    from finetune_operator.api.transformers_names import SCHEDULER_NAMES

    assert set(get_args(Scheduler)) <= SCHEDULER_NAMES


def test_summary_lists_every_error_with_value_and_fix():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.distributed.numNodes": 0, "spec.training.learningRate": "fast"}))
    text = info.value.summary()
    assert text.startswith("2 error(s) in the FineTuneJob:")
    assert "spec.distributed.numNodes" in text and "(got 0)" in text and "fix:" in text
    assert "spec.training.learningRate" in text and "(got 'fast')" in text


def test_bad_input_table_is_big_enough():
    assert len(BAD_INPUTS) >= 30


def test_nan_and_infinity_are_refused_with_a_fix():
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(InvalidSpec) as refused:
            validate_job(make_job({"spec.training.learningRate": value}))
        (error,) = refused.value.errors
        assert error.path == "spec.training.learningRate" and "finite number" in error.message and error.fix


def test_a_value_nested_thousands_deep_is_an_error_not_a_crash():
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    doc = make_job()
    doc["spec"].setdefault("training", {})["extraArgs"] = {"deep": deep}  # set after the builder's deepcopy
    with pytest.raises(InvalidSpec) as info:
        validate_job(doc)
    assert any("nested more than 64 levels" in e.message for e in info.value.errors)


@pytest.mark.parametrize("field, value, fix", [
    ("numTrainEpochs", 3, "that is TrainingArguments' num_train_epochs; here it is spec.training.epochs"),
    ("num_train_epochs", 3, "here it is spec.training.epochs"),
    ("bf16", True, "that is TrainingArguments' bf16; here it is spec.training.precision"),
    ("lr_scheduler_type", "cosine", "here it is spec.training.lrScheduler"),
    ("neftuneNoiseAlpha", 5, "here it is spec.method.neftuneNoiseAlpha"),
    ("labelSmoothingFactor", 0.1, "has no field of its own: set spec.training.extraArgs.label_smoothing_factor"),
    ("evaluation_strategy", "steps", "renamed eval_strategy; set spec.training.evalStrategy"),
])
def test_a_trainer_argument_written_as_a_training_field_says_where_it_goes(field, value, fix):
    """Users bring the Trainer's own names (HF configs, LLaMA-Factory and axolotl YAML) into spec.training."""
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({f"spec.training.{field}": value}))
    (error,) = [e for e in info.value.errors if e.path == f"spec.training.{field}"]
    assert error.message == "unknown field" and fix in error.fix, error.render()


def test_an_unknown_training_field_that_is_no_trainer_argument_still_gets_the_closest_name():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.training.learningrate": 1e-4}))
    assert "did you mean learningRate?" in info.value.errors[0].fix


def test_a_method_written_as_its_type_says_how_to_write_it():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.method": "lora"}))
    (error,) = [e for e in info.value.errors if e.path == "spec.method"]
    assert error.message == "must be a mapping" and error.fix == "write it as {type: lora}"


def test_snake_case_names_are_refused_as_the_crd_refuses_them_with_the_camel_case_name():
    """`finetune validate` must not accept what `kubectl apply` refuses (the CRD's schema knows camelCase only)."""
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.distributed.num_nodes": 2, "spec.model.attn_implementation": "sdpa"}))
    fixes = {e.path: e.fix for e in info.value.errors}
    assert fixes["spec.distributed.num_nodes"] == "write it as numNodes (the manifest's names are camelCase)"
    assert fixes["spec.model.attn_implementation"].startswith("write it as attnImplementation")


def test_a_single_value_where_a_list_belongs_shows_the_list():
    with pytest.raises(InvalidSpec) as info:
        validate_job(make_job({"spec.method": {"type": "lora", "lora": {"targetModules": "all-linear"}}}))
    (error,) = [e for e in info.value.errors if e.path == "spec.method.lora.targetModules"]
    assert error.fix == "write it as a YAML list: [all-linear]"


def test_object_storage_mistakes_are_named_with_their_fix():
    with pytest.raises(InvalidSpec) as raised:
        validate_job(make_job({
            "spec.model.name": "s3://A_Bucket/models/x", "spec.output.uri": "s3://ok-bucket/runs/x",
            "spec.data.train": [{"path": "s3://b/data.jsonl"}],
            "spec.s3": {"credentialsSecret": "s3-creds"},
            "spec.pod.secretEnv": [{"name": "AWS_ACCESS_KEY_ID", "secretName": "other", "key": "id"}]}))
    text = raised.value.summary()
    assert "spec.model.name: not an s3:// URI of a bucket S3 accepts" in text
    assert "spec.data.train[0].path: not an s3:// URI" in text  # a one-letter bucket
    assert "spec.pod.secretEnv[0].name: s3.credentialsSecret also sets it" in text
    with pytest.raises(InvalidSpec, match="spec.output.uri"):
        validate_job(make_job({"spec.output.uri": "s3://key:secret@bucket/x"}))
    with pytest.raises(InvalidSpec, match=r"spec.pod.env\[0\].name: AWS_SECRET_ACCESS_KEY holds a credential"):
        validate_job(make_job({"spec.pod.env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "abc"}]}))


def test_an_invalid_spec_with_suspend_set_still_lists_its_errors():
    """spec.suspend is a plain field beside the sections: the per-section validation skips it instead of failing."""
    with pytest.raises(InvalidSpec) as raised:
        validate_job(make_job({"spec.suspend": True, "spec.method.type": "qlora"}))
    assert "spec.method.type" in raised.value.summary()


def test_a_password_in_a_url_is_never_repeated_in_an_error():
    with pytest.raises(InvalidSpec) as caught:
        validate_job(make_job({"spec.s3": {"endpointURL": "https://admin:hunter2@minio.example:9000"}}))
    text = str(caught.value)
    assert "spec.s3.endpointURL" in text and "hunter2" not in text and "https://***@minio.example:9000" in text


@pytest.mark.parametrize("name", sorted(HF_CACHE_ENV_NAMES))
@pytest.mark.parametrize("where", ["spec.pod.env", "spec.pod.secretEnv"])
def test_the_hub_cache_variables_are_the_operators_and_the_error_says_to_use_cache_dir(name, where):
    """Code never comes from a cache someone else writes (render/env.py): none of the variables that move a Hub,
    transformers or datasets cache may point one elsewhere."""
    entry = {"name": name, "value": "/shared/hf"} if where == "spec.pod.env" else \
        {"name": name, "secretName": "s", "key": "k"}
    with pytest.raises(InvalidSpec) as refused:
        validate_job(make_job({where: [entry]}))
    assert f"{where}[0].name" in refused.value.summary() and "spec.data.cacheDir" in refused.value.summary()
