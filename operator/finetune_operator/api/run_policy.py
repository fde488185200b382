"""spec.runPolicy: restarts, deadlines, clean-up and suspension of the whole job."""

from pydantic import Field

from .base import ApiModel


class RunPolicy(ApiModel):
    backoff_limit: int = Field(
        default=3, ge=0, le=1000,
        description="Gang restarts allowed: when any node fails, the whole attempt is replaced, up to this many times.",
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Fail the job once it has run this long, restarts included."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the FineTuneJob (and its children) this long after it finishes."
    )
    suspend: bool = Field(
        default=False, description="Stop the running attempt (checkpoints are kept); unset to resume from the last one."
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
    stall_timeout_seconds: int | None = Field(
        default=1800, ge=60,
        description="Restart an attempt whose progress heartbeat is older than this; unset disables the watchdog.",
    )
