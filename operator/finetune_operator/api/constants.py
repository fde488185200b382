"""Names shared by the API, the renderer, the operator and the trainer: one place, each documented."""

from typing import Final

GROUP: Final = "finetunejob.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "FineTuneJob"
PLURAL: Final = "finetunejobs"
SINGULAR: Final = "finetunejob"
SHORT_NAMES: Final = ["ftj"]
# Runtimes (api/runtime.py): defaults and limits set by admins, per namespace or for the cluster.
RUNTIME_KIND: Final = "FineTuneRuntime"
RUNTIME_PLURAL: Final = "finetuneruntimes"
RUNTIME_SHORT_NAMES: Final = ["ftr"]
CLUSTER_RUNTIME_KIND: Final = "ClusterFineTuneRuntime"
CLUSTER_RUNTIME_PLURAL: Final = "clusterfinetuneruntimes"
CLUSTER_RUNTIME_SHORT_NAMES: Final = ["cftr"]

# Kubernetes' recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/common-labels), each
# with the comment docs/reference/labels.md shows for it.

# Always finetunejob.
LABEL_NAME: Final = "app.kubernetes.io/name"
# The FineTuneJob's name.
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
# What the object is to the job: config, rendezvous (the headless Service), network, trainer, trainer-identity.
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
# Always finetunejob-operator: the objects the operator created.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
# Always finetunejob.
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
APP_NAME: Final = "finetunejob"
MANAGED_BY: Final = "finetunejob-operator"

# The FineTuneJob's name: selects the job's objects (kubectl get pods -l finetunejob.dev/job-name=NAME) and the
# headless Service's pods.
LABEL_JOB: Final = f"{GROUP}/job-name"
# The attempt (1 for the first run, 0 for the preflight): selects one attempt's pods; the trainer reads it.
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"

KUEUE_PREFIX: Final = "kueue.x-k8s.io/"
# Kueue admits a workload by flipping spec.suspend; it finds workloads by this label.
LABEL_KUEUE_QUEUE: Final = f"{KUEUE_PREFIX}queue-name"
# Kueue's WorkloadPriorityClass of the workload: what a runtime's lock on pod.priorityClassName also locks.
LABEL_KUEUE_PRIORITY: Final = f"{KUEUE_PREFIX}priority-class"
# Kueue deactivates a workload that ran this long: it can only shorten a job.
KUEUE_MAX_EXEC_TIME: Final = f"{KUEUE_PREFIX}max-exec-time-seconds"
# The Kueue labels and annotations of a FineTuneJob copied to its attempts' Jobs, and no others: Kueue reads more
# (priority-boost, admission gates, partial admission, a prebuilt Workload to run under, ...) and each would be a
# way around what a runtime locks (the queue, the priority class) or around the gang.
KUEUE_JOB_LABELS: Final = (LABEL_KUEUE_QUEUE, LABEL_KUEUE_PRIORITY, KUEUE_MAX_EXEC_TIME)
KUEUE_JOB_ANNOTATIONS: Final = (KUEUE_MAX_EXEC_TIME,)
# A gang restart hands the admitted Workload of the failed attempt to the next one (the queued Job names it).
LABEL_KUEUE_PREBUILT: Final = f"{KUEUE_PREFIX}prebuilt-workload-name"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
KUEUE_WORKLOADS: Final = "workloads"
# On a Job the operator suspended itself (spec.suspend, no Kueue): a Job suspended without it was suspended
# by someone else (Kueue's manageJobsWithoutQueueName), and the operator never unsuspends it.
ANNOTATION_SUSPENDED: Final = f"{GROUP}/suspended-by-operator"

# The Indexed Job controller writes each pod's completion index into this annotation; node rank comes from it.
ANNOTATION_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
# The digest of the whole spec the attempt was rendered from.
ANNOTATION_SPEC_HASH: Final = f"{GROUP}/spec-hash"
# The digest of what an attempt was rendered from (the spec less runPolicy and suspend, which apply at once): an
# edit of anything else applies from the next attempt, and resuming a suspended job with such an edit starts one.
ANNOTATION_ATTEMPT_SPEC_HASH: Final = f"{GROUP}/attempt-spec-hash"
# What Kueue compares between a Job and its Workload (containers, tolerations, pod count): equal across attempts,
# the next attempt may take over the Workload the last one was admitted with.
ANNOTATION_POD_SET_HASH: Final = f"{GROUP}/pod-set-hash"
# When the FineTuneJob took a failed attempt's admitted Workload over: held longer than the restart's backoff and
# a grace, it is released (the next attempt could not be created to take it).
ANNOTATION_HELD_SINCE: Final = f"{GROUP}/held-since"
# On an attempt's Job that restarts in place: its pods may fail and be replaced alone, which the operator counts
# against this many (runPolicy.inPlaceRestarts as the attempt was rendered).
ANNOTATION_RESTARTS_IN_PLACE: Final = f"{GROUP}/restarts-in-place"
# On an elastic attempt's Job: the fewest nodes it trains on (distributed.minNodes as the attempt was rendered).
ANNOTATION_MIN_NODES: Final = f"{GROUP}/min-nodes"
# Kueue's partial admission: it may admit an elastic attempt with fewer pods than numNodes (at least this many).
ANNOTATION_KUEUE_MIN_PARALLELISM: Final = f"{KUEUE_PREFIX}job-min-parallelism"
# Kueue lowers the Job's completions with its parallelism when it admits fewer pods (partial admission).
ANNOTATION_KUEUE_COMPLETIONS_EQUAL_PARALLELISM: Final = f"{KUEUE_PREFIX}job-completions-equal-parallelism"

# Paths inside trainer pods.
CONFIG_MOUNT_PATH: Final = "/etc/finetune"
CONFIG_FILE: Final = "trainer.json"
DEEPSPEED_FILE: Final = "deepspeed.json"
FSDP_FILE: Final = "fsdp.json"
OUTPUT_MOUNT_PATH: Final = "/output"
CACHE_MOUNT_PATH: Final = "/cache"
TMP_MOUNT_PATH: Final = "/tmp"
SHM_MOUNT_PATH: Final = "/dev/shm"
TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"
# The trainer's own pod volumes (render/workload.py); spec.pod.volumes may not reuse their names.
CONFIG_VOLUME: Final = "config"
OUTPUT_VOLUME: Final = "output"
CACHE_VOLUME: Final = "cache"
TMP_VOLUME: Final = "tmp"
SHM_VOLUME: Final = "dshm"
TRAINER_VOLUMES: Final = (CONFIG_VOLUME, OUTPUT_VOLUME, CACHE_VOLUME, TMP_VOLUME, SHM_VOLUME)
# method.grpo reward functions from ConfigMaps: ConfigMap n (in order of first use) is the volume
# <prefix><n>, mounted read-only at <mount path>/<its name> and put on the trainer's module path.
REWARD_CODE_MOUNT_PATH: Final = "/opt/finetune/rewards"
# Where the trainer image keeps Python and the trainer's code (trainer_image/Dockerfile: the venv, the interpreter
# under /usr, WORKDIR and HOME /home/trainer, which `python -m` puts first on sys.path): a volume there would bring
# code (a sitecustomize.py, a .pth file, a module shadowing one the trainer imports) into every process of the pod.
IMAGE_CODE_PATHS: Final = ("/opt/venv", "/usr", "/home/trainer")
REWARD_CODE_VOLUME_PREFIX: Final = "reward-code-"

# The trainer's progress records (JSON Lines) in the output directory: what `finetune run` draws and tests read.
PROGRESS_FILE: Final = "progress.jsonl"
# The trainer's warnings and notes, one JSON record each, beside progress.jsonl (whose records are all steps):
# what `finetune run` prints between its progress lines.
NOTICES_FILE: Final = "notices.jsonl"

CONTAINER_NAME: Final = "trainer"
RENDEZVOUS_PORT_NAME: Final = "rendezvous"
DEFAULT_RENDEZVOUS_PORT: Final = 29500
DEFAULT_GPU_RESOURCE: Final = "nvidia.com/gpu"
DEFAULT_TRAINER_IMAGE: Final = "ghcr.io/finetunejob/trainer:0.1.0"
# Kubernetes' default is 30 s; a sharded checkpoint of a large model takes minutes to write after SIGTERM.
DEFAULT_TERMINATION_GRACE_SECONDS: Final = 300
# Non-root uid/gid of the trainer image (trainer_image/Dockerfile creates it).
TRAINER_UID: Final = 1000

# torchrun reads PET_<FLAG> as its own --<flag>; these five are the rendezvous contract every operator uses.
ENV_PET_NNODES: Final = "PET_NNODES"
ENV_PET_NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
ENV_PET_NODE_RANK: Final = "PET_NODE_RANK"
ENV_PET_MASTER_ADDR: Final = "PET_MASTER_ADDR"
ENV_PET_MASTER_PORT: Final = "PET_MASTER_PORT"
# An attempt that restarts in place runs torchrun's c10d rendezvous (hosted by node 0's agent on the master port):
# workers restarted on their pods up to PET_MAX_RESTARTS times, PET_NNODES a range MIN:MAX for an elastic job.
# The launcher adds PET_RDZV_ENDPOINT and PET_RDZV_CONF from the variables above (finetune_trainer/launch.py).
ENV_PET_RDZV_BACKEND: Final = "PET_RDZV_BACKEND"
ENV_PET_RDZV_ID: Final = "PET_RDZV_ID"
ENV_PET_RDZV_ENDPOINT: Final = "PET_RDZV_ENDPOINT"
ENV_PET_RDZV_CONF: Final = "PET_RDZV_CONF"
ENV_PET_MAX_RESTARTS: Final = "PET_MAX_RESTARTS"
ENV_PET_LOCAL_ADDR: Final = "PET_LOCAL_ADDR"
RDZV_BACKEND_C10D: Final = "c10d"
# torchrun's own variables for each worker: its agent's restart count, the nodes of the group.
ENV_TORCHELASTIC_RESTART_COUNT: Final = "TORCHELASTIC_RESTART_COUNT"
ENV_GROUP_WORLD_SIZE: Final = "GROUP_WORLD_SIZE"

# Our own variables, read by finetune_trainer.
ENV_CONFIG: Final = "FINETUNE_CONFIG"
ENV_JOB_NAME: Final = "FINETUNE_JOB_NAME"
ENV_JOB_NAMESPACE: Final = "FINETUNE_JOB_NAMESPACE"
LOCAL_NAMESPACE: Final = "local"  # what `finetune run` gives as the namespace: no cluster, no Secrets
ENV_ATTEMPT: Final = "FINETUNE_ATTEMPT"
ENV_POD_NAME: Final = "FINETUNE_POD_NAME"

# Where the trainer puts per-process results for the launcher (a directory) and the launcher its summary (the
# container's termination message file); local runs point both elsewhere.
ENV_RESULT_DIR: Final = "FINETUNE_RESULT_DIR"
ENV_TERMINATION_LOG: Final = "FINETUNE_TERMINATION_LOG"
# What a SIGTERM means where the trainer runs, in the user's words (`finetune run` sets it: its Ctrl-C); in a pod
# it is unset, and a SIGTERM is the pod's deletion, preemption, eviction or its node's drain.
ENV_STOP_CAUSE: Final = "FINETUNE_STOP_CAUSE"
# How many nodes' launchers share this machine's CPU limit (`finetune run` sets it: every node on one machine); in a
# pod it is unset, each node a container of its own limit (finetune_trainer/cpu_threads.py divides by it).
ENV_NODES_SHARING_CPUS: Final = "FINETUNE_NODES_SHARING_CPUS"
# "1": take the output.uri prefix over from the run that holds it (`finetune run --take-over`; outputs/owner.py).
ENV_OUTPUT_TAKE_OVER: Final = "FINETUNE_OUTPUT_TAKE_OVER"
# The ServiceAccount token's directory, when not the standard in-cluster path (local runs, tests).
ENV_SERVICEACCOUNT_DIR: Final = "FINETUNE_SERVICEACCOUNT_DIR"
SERVICEACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
# torch.distributed's own variables, set by torchrun for each worker.
ENV_RANK: Final = "RANK"
ENV_WORLD_SIZE: Final = "WORLD_SIZE"
ENV_LOCAL_RANK: Final = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE: Final = "LOCAL_WORLD_SIZE"  # the processes of this node (torchrun sets it)
# Hugging Face's cache root (models, tokenizers, datasets downloaded from the Hub), and the other libraries'
# compile caches: all on a writable volume, the root filesystem being read-only.
ENV_HF_HOME: Final = "HF_HOME"
ENV_HF_MODULES_CACHE: Final = "HF_MODULES_CACHE"
ENV_TORCH_EXTENSIONS_DIR: Final = "TORCH_EXTENSIONS_DIR"
ENV_TRITON_CACHE_DIR: Final = "TRITON_CACHE_DIR"
# DeepSpeed picks its accelerator from this ("cpu" for CPU jobs); NCCL's log level (spec.distributed.ncclDebug).
ENV_DS_ACCELERATOR: Final = "DS_ACCELERATOR"
ENV_NCCL_DEBUG: Final = "NCCL_DEBUG"
# In-cluster config: the apiserver's address as the kubelet sets it for every container.
ENV_KUBERNETES_SERVICE_HOST: Final = "KUBERNETES_SERVICE_HOST"
ENV_KUBERNETES_SERVICE_PORT: Final = "KUBERNETES_SERVICE_PORT"

# The operator's own settings (controller/settings.py), set by the chart's Deployment.
ENV_OPERATOR_TRAINER_IMAGE: Final = "FINETUNE_TRAINER_IMAGE"
ENV_OPERATOR_RESTART_BACKOFF: Final = "FINETUNE_RESTART_BACKOFF_SECONDS"
ENV_OPERATOR_KUEUE_HOLD_GRACE: Final = "FINETUNE_KUEUE_HOLD_GRACE_SECONDS"
ENV_OPERATOR_METRICS_PORT: Final = "FINETUNE_METRICS_PORT"
ENV_OPERATOR_WORKERS: Final = "FINETUNE_WORKERS"
ENV_OPERATOR_NETWORK_POLICY: Final = "FINETUNE_NETWORK_POLICY"
ENV_OPERATOR_STUCK_RECONCILE: Final = "FINETUNE_STUCK_RECONCILE_SECONDS"
ENV_OPERATOR_WATCH_SECONDS: Final = "FINETUNE_WATCH_SECONDS"
OPERATOR_HEALTH_PORT: Final = 8081
DEFAULT_METRICS_PORT: Final = 8080
# Non-root uid/gid of the operator image (Dockerfile) and of the chart's pod securityContext.
OPERATOR_UID: Final = 65532

# Where huggingface_hub, transformers and datasets cache (data.cacheDir sets them, through HF_HOME).
HF_CACHE_ENV_NAMES: Final = frozenset({ENV_HF_HOME, ENV_HF_MODULES_CACHE, "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                                       "TRANSFORMERS_CACHE", "HF_DATASETS_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE",
                                       "HUGGINGFACE_ASSETS_CACHE"})
# Names a user env entry may not set: torchrun/torch.distributed would silently be redirected.
RESERVED_ENV_NAMES: Final = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "NODE_RANK",
        "CUDA_VISIBLE_DEVICES",
        # The NVIDIA container runtime reads it: "all" would hand the pod every GPU of its node, requested or not.
        "NVIDIA_VISIBLE_DEVICES",
        # The trainer loads checkpoints as data only (torch.load weights-only); this one would turn that off.
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        # Where Hub downloads and remote code are kept: the operator keeps code in the pod's own cache (render/env.py).
        *HF_CACHE_ENV_NAMES,
        ENV_CONFIG,
        ENV_JOB_NAME,
        ENV_JOB_NAMESPACE,
        ENV_ATTEMPT,
        ENV_POD_NAME,
        # The trainer reports progress to the API server with its pod's token: pointed elsewhere, it would hand
        # the token (the job's identity, maybe a ServiceAccount a runtime lends) to that server.
        ENV_KUBERNETES_SERVICE_HOST,
        ENV_KUBERNETES_SERVICE_PORT,
    }
)
RESERVED_ENV_PREFIXES: Final = ("PET_", "TORCHELASTIC_", "FINETUNE_")
# Variables that hold credentials of the trackers and the Hub: never as a plain pod.env value (it would sit in the
# FineTuneJob, the Job and every pod spec, readable by anyone who can read those).
SECRET_ENV_NAMES: Final = frozenset({
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD",
    "COMET_API_KEY", "NEPTUNE_API_TOKEN", "CLEARML_API_SECRET_KEY", "SWANLAB_API_KEY", "DAGSHUB_USER_TOKEN",
    "AZURE_CLIENT_SECRET", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
})

# Kubernetes limits a pod hostname to one DNS label; Indexed Job hostnames are "<job>-a<attempt>-<index>".
MAX_JOB_NAME_LENGTH: Final = 48
