"""spec.runPolicy: restarts, deadlines, clean-up and suspension of the whole job."""

from typing import Literal

from pydantic import Field

from .base import ApiModel, FalseIsOff


class DivergencePolicy(ApiModel):
    """A loss that stays far above the run's own early level is divergence: retrying from a checkpoint diverges
    again. The early level is the mean of the losses logged in the first `warmupSteps` optimizer steps, never above
    the loss of guessing uniformly over the vocabulary (ln vocab size): one easy first batch (rows the model already
    knows) cannot make a healthy run look diverged, and a run that blows up at once is still caught. Every run is
    judged at its end too, however short: one that ends above the threshold fails rather than saving the weights.
    Below the threshold of a uniform guess, SFT measures the rows of its first step again when the loss rises:
    a model that still knew them met new rows (a fixed order, a curriculum), not divergence."""

    action: FalseIsOff[Literal["stop", "warn", "off"]] = Field(
        default="stop",
        description="stop: the run stops (exit 79, reason LossDiverged, not retried) once the training loss has "
        "stayed above the threshold for `patience` optimizer steps (a spike starts when the losses of the last 10 "
        "steps average above it, and lasts while each logged loss is), or when training ends during such a spike "
        "however short the run (the final weights are not saved); SFT measures the rows of its first step again "
        "when the loss rises: a model that still knew them met new rows (LossShifted: the threshold then follows "
        "the new level); warn: a Warning Event only; off: no check (YAML's unquoted off, read as false, means off "
        "too). A NaN or infinite loss or gradient norm always stops the run at once.",
    )
    factor: float = Field(
        default=3.0, ge=1.5, le=1000,
        description="Threshold: factor x the run's early loss (the mean of the losses logged in the first "
        "warmupSteps steps, at most ln(vocabulary size)), and at least minIncrease above it.",
    )
    min_increase: float = Field(
        default=3.0, ge=0, le=1000,
        description="The threshold is at least this far above the early loss (nats): a model that starts near 0 "
        "may double its loss on a noisy batch without diverging.",
    )
    warmup_steps: int = Field(
        default=20, ge=1, le=100000,
        description="Optimizer steps whose logged losses make the early loss (at least the first 3 logged). Before "
        "it is known the threshold is taken from ln(vocabulary size), the loss of a uniform guess.",
    )
    patience: int = Field(
        default=20, ge=1, le=100000,
        description="Optimizer steps (not logged lines: the same whatever loggingSteps is) the loss must stay above "
        "the threshold, over at least two logged losses, to make the run diverged; a spike that comes back sooner "
        "is a Warning Event (LossSpike), and no checkpoint is saved while the loss is above the threshold.",
    )


class RunPolicy(ApiModel):
    backoff_limit: int = Field(
        default=3, ge=0, le=1000,
        description="Gang restarts allowed: when any node fails, the whole attempt is replaced, up to this many times.",
    )
    in_place_restarts: int | None = Field(
        default=None, ge=0, le=1000,
        description="Restarts on the same pods before a gang restart: a worker that fails with a retryable error "
        "is restarted by torchrun on its pod (at most this many times per pod, --max-restarts) and the group "
        "re-forms; a pod that fails or is lost is replaced alone (at most this many per attempt that failed by "
        "themselves; pods stopped from outside are not counted). Past that a failure restarts the gang (counted "
        "against backoffLimit). Permanent errors (data, config, divergence) fail the job as ever. Needs "
        "output.claimName when numNodes > 1. Unset: 3 for an elastic job (distributed.minNodes), else 0 (every "
        "failure restarts the gang).",
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Fail the job once it has been active this long, restarts included; time "
        "spent Queued (waiting for Kueue's admission) or Suspended does not count (status.activeSeconds)."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the FineTuneJob (and its children) this long after it finishes."
    )
    preflight: bool = Field(
        default=False,
        description="Before attempt 1 requests any GPU, check in one small CPU pod that the tokenizer and model "
        "config load, every data source gives trainable examples and the output volume is writable; a failure "
        "fails the job at once (DataError, InvalidConfig) without having held the gang's GPUs.",
    )
    schedule_timeout_seconds: int | None = Field(
        default=600, ge=1,
        description="A gang not fully running this long after its attempt was created (some pods unschedulable, "
        "over quota, an image that cannot be pulled) is torn down so its pods stop holding GPUs, and retried after "
        "a backoff; counted in status.scheduleRetries, not against backoffLimit. Jobs queued through Kueue are left "
        "to Kueue. Unset to wait forever.",
    )
    divergence: DivergencePolicy = Field(
        default_factory=DivergencePolicy,
        description="Stop a run whose loss stays far above its early level (e.g. a learning rate 1000x too high): "
        "by default a loss above max(3 x early, early + 3) for 20 optimizer steps, or at the end of a shorter run, "
        "where early is the mean of the losses of the first 20 steps.",
    )
    schedule_retry_limit: int = Field(
        default=5, ge=0, le=1000,
        description="How many times a partial gang torn down after scheduleTimeoutSeconds is retried; then the job "
        "fails (ScheduleRetriesExhausted) instead of grabbing its GPUs again and again. A gang larger than every "
        "node its pods may use can hold together says so at once (InsufficientCapacity, a Warning).",
    )
    capacity_shortage: Literal["wait", "create"] = Field(
        default="wait",
        description="When the nodes its pods may use cannot hold the gang together (InsufficientCapacity), or no "
        "node can hold one of its pods (Unschedulable), on its first look. wait: nothing is created and no GPU is "
        "held; the capacity is looked at again every 30 s and the gang starts once it fits. create: the attempt is "
        "created anyway, so that a cluster autoscaler sees its pending pods and adds nodes (the partial gang holds "
        "its GPUs until scheduleTimeoutSeconds, retried scheduleRetryLimit times). Jobs queued through Kueue are "
        "created either way: Kueue keeps them suspended, holding nothing, and says why.",
    )
    stall_timeout_seconds: int | None = Field(
        default=1800, ge=60,
        description="Restart an attempt whose progress heartbeat is older than this; unset disables the watchdog.",
    )
