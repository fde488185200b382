"""RenderContext: everything rendering needs besides the spec, passed in so rendering never reads the world."""

from dataclasses import dataclass, field

from ..api.constants import CONFIG_MOUNT_PATH, DEFAULT_TRAINER_IMAGE, OUTPUT_MOUNT_PATH


@dataclass(frozen=True)
class RenderContext:
    """Identity of the FineTuneJob and operator settings. `attempt` starts at 1 and grows with gang restarts."""

    name: str
    namespace: str
    attempt: int = 1
    trainer_image: str = DEFAULT_TRAINER_IMAGE
    # The FineTuneJob's own labels: a Kueue queue name on it is copied to the workload.
    job_labels: dict[str, str] = field(default_factory=dict)
    job_annotations: dict[str, str] = field(default_factory=dict)
    # Where the trainer finds its config and writes output; `finetune run` points these at local directories.
    config_dir: str = CONFIG_MOUNT_PATH
    output_dir: str = OUTPUT_MOUNT_PATH
    # `finetune run` caches in its own output directory, whatever spec.data.cacheDir says about the pods.
    cache_dir: str | None = None
    # Set when resuming an attempt from a checkpoint the operator recorded in status.checkpoint.
    resume_from: str | None = None
    # The FineTuneJob's UID: its trainer writes only to the object with this UID (a precondition of each report).
    uid: str | None = None
    # The operator's networkPolicy setting: each gang gets a NetworkPolicy (ingress only from its own pods).
    network_policy: bool = False
    # The Kueue Workload a gang restart hands over: the attempt's Job names it and Kueue starts the Job at once
    # under that Workload's admission instead of queueing a new Workload behind the jobs submitted since.
    kueue_workload: str | None = None
    # The attempt Job's own activeDeadlineSeconds: what was left of the job's runPolicy.activeDeadlineSeconds when
    # it was created, so that a Job left without its FineTuneJob (or its operator) still ends (controller/deadlines.py).
    deadline_seconds: int | None = None
