"""FineTuneJob status: written by the operator (phase, conditions, attempts) and by trainer rank 0 (progress)."""

from typing import Any, Literal

from pydantic import Field

from .base import ApiModel
from .runtime import RuntimeLimits

Phase = Literal["Pending", "Queued", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]
TERMINAL_PHASES = ("Succeeded", "Failed")
ConditionType = Literal["Created", "Waiting", "Running", "Restarting", "Suspended", "Stalled", "TopologyChangePending",
                        "Succeeded", "Failed"]


class Condition(ApiModel):
    type: ConditionType = Field(description="Aspect of the job this condition describes.")
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field(default="", max_length=1024, description="CamelCase machine-readable reason.")
    message: str = Field(default="", max_length=32768, description="Human-readable detail.")
    last_transition_time: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When status last changed."
    )
    observed_generation: int | None = Field(default=None, ge=0, description="Spec generation it was computed from.")


class RewardStat(ApiModel):
    name: str = Field(max_length=63, description="The reward's name (method.grpo.rewards[].name or its default).")
    mean: float | None = Field(default=None, description="Its mean over the step's completions.")
    std: float | None = Field(default=None, ge=0, description="Its standard deviation.")


class Progress(ApiModel):
    phase: Literal["Preparing", "Training", "Stopped"] | None = Field(
        default=None, description="Preparing: loading and tokenizing the data (heartbeat every 30 s); Training; "
        "Stopped: no attempt runs (Queued, Suspended, Restarting, Failed), the values are the last attempt's (set "
        "by the operator, which also clears the ETA).")
    message: str | None = Field(default=None, max_length=1024, description="What the preparation is doing.")
    step: int = Field(default=0, ge=0, description="Optimizer steps completed.")
    max_steps: int | None = Field(default=None, ge=0, description="Total optimizer steps of the run.")
    epoch: float | None = Field(default=None, ge=0, description="Fractional epoch reached.")
    percent: int | None = Field(default=None, ge=0, le=100, description="step / maxSteps, in percent.")
    loss: float | None = Field(default=None, description="Latest training loss.")
    eval_loss: float | None = Field(default=None, description="Latest evaluation loss.")
    rewards_margin: float | None = Field(default=None, description="Preference objectives: mean implicit reward "
                                         "of chosen minus rejected answers (latest step); reward: the mean score "
                                         "margin.")
    rewards_accuracy: float | None = Field(default=None, ge=0, le=1, description="Preference objectives: share of "
                                           "pairs whose chosen answer gets the higher reward.")
    rewards_chosen: float | None = Field(default=None, description="Preference objectives: mean implicit reward "
                                         "of the chosen answers.")
    rewards_rejected: float | None = Field(default=None, description="Preference objectives: mean implicit reward "
                                           "of the rejected answers.")
    reward: float | None = Field(default=None, description="grpo: the mean weighted reward of the step's "
                                 "completions.")
    reward_std: float | None = Field(default=None, ge=0, description="grpo: its standard deviation.")
    reward_functions: list[RewardStat] | None = Field(default=None, max_length=16, description="grpo: each "
                                                      "reward's mean and std (unweighted), as method.grpo.rewards "
                                                      "names them.")
    kl: float | None = Field(default=None, description="grpo with beta > 0: the mean per-token KL divergence from "
                             "the reference model.")
    completion_length: float | None = Field(default=None, ge=0, description="grpo: the mean completion length in "
                                            "tokens.")
    clip_ratio: float | None = Field(default=None, ge=0, le=1, description="grpo: the share of completion tokens "
                                     "whose probability ratio was clipped (epsilon).")
    eval_perplexity: float | None = Field(default=None, ge=0, description="SFT: exp(evalLoss), the validation "
                                          "perplexity per token (a preference objective's loss is no token "
                                          "cross-entropy: it has evalRewardsAccuracy and evalRewardsMargin).")
    eval_rewards_accuracy: float | None = Field(default=None, ge=0, le=1, description="Preference objectives "
                                                "(not kto): share of the held-out pairs whose chosen answer gets the "
                                                "higher reward, at the latest evaluation.")
    eval_rewards_margin: float | None = Field(default=None, description="Preference objectives: mean reward "
                                              "margin (chosen minus rejected) over the held-out data, at the latest "
                                              "evaluation.")
    learning_rate: float | None = Field(default=None, description="Current learning rate.")
    tokens_per_second: float | None = Field(default=None, ge=0, description="Training tokens/s over all processes.")
    tokens_per_second_per_device: float | None = Field(
        default=None, ge=0, description="tokensPerSecond divided by the processes (one per GPU)."
    )
    mfu: float | None = Field(
        default=None, ge=0, description="Model FLOPs utilization: model FLOPs/s per GPU over the GPU's dense 16-bit "
        "peak (absent on CPU, in fp32 and on GPUs without a known peak unless resources.peakTflopsPerGpu is set)."
    )
    peak_memory_gib: float | None = Field(default=None, ge=0, alias="peakMemoryGiB",
                                          description="Rank 0's peak GPU memory, GiB.")
    eta: str | None = Field(default=None, max_length=64, description="Estimated time left, e.g. 1h02m.")
    updated_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="Heartbeat: when rank 0 last reported."
    )


class Goodput(ApiModel):
    """Updated on phase changes only (operator/finetune_operator/goodput.py)."""

    gpu_hours: float = Field(default=0.0, ge=0, description="GPU-hours of ended periods in which the whole gang "
                             "ran; add (now - runningSince) x gpus while Running.")
    running_since: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                      description="When the current gang started running (absent unless Running).")
    restart_downtime_seconds: int = Field(default=0, ge=0,
                                          description="Wall time from each failure until the gang ran again.")
    steps_redone: int = Field(default=0, ge=0, description="Optimizer steps done twice because of restarts (work "
                              "after the newest checkpoint that a failure threw away).")
    failed_at: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                  description="The failure a restart is recovering from (absent otherwise).")
    attempt_since: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                      description="When the current attempt was started by a restart.")
    in_place_recovery_seconds: float = Field(default=0.0, ge=0, description="Wall time from each failure or lost "
                                             "node until the re-formed worker group (same pods, or the survivors) "
                                             "made its first step: what restarts in place cost.")
    checkpoint_stall_seconds: float = Field(default=0.0, ge=0, description="Time the training loop stood still "
                                            "for checkpoints (the snapshot; the write goes on in the background).")
    checkpoint_step: int | None = Field(default=None, ge=0, description="The newest checkpoint counted in "
                                        "checkpointStallSeconds.")


class CheckpointRef(ApiModel):
    step: int = Field(ge=0, description="Global step of the newest complete checkpoint.")
    path: str = Field(max_length=4096, description="Its directory inside the output volume.")
    stall_seconds: float | None = Field(default=None, ge=0, description="How long training stood still for this "
                                        "checkpoint (with overlapped saves: the snapshot to host memory).")
    save_seconds: float | None = Field(default=None, ge=0, description="From the save's start until the checkpoint "
                                       "was complete (marked) on the output volume.")
    restored_from: str | None = Field(default=None, max_length=4096, description="The checkpoint the running "
                                      "attempt resumed from (resume: auto resumes only one that the same model and "
                                      "method produced).")


class PushRef(ApiModel):
    repo: str = Field(max_length=200, description="The Hub repository the final model was pushed to.")
    revision: str = Field(default="main", max_length=255, description="The branch pushed to.")
    commit: str = Field(default="", max_length=4096, description="The commit's URL.")


class Notice(ApiModel):
    time: str = Field(json_schema_extra={"format": "date-time"}, description="When the trainer said it.")
    reason: str = Field(max_length=128, description="CamelCase, e.g. LossSpike, GlobalBatchChanged, "
                        "SystemPromptFolded.")
    message: str = Field(max_length=4096, description="What happened and what to do about it.")


class UploadStatus(ApiModel):
    """output.uri: where checkpoint uploads stand (written by the trainer of node 0)."""

    uri: str = Field(max_length=1024, description="The output's object storage prefix.")
    complete_step: int | None = Field(default=None, ge=0, description="Step of the newest checkpoint complete in "
                                      "the bucket (every node's files there, FINETUNE_COMPLETE written last).")
    pending: int = Field(default=0, ge=0, description="Checkpoints saved locally whose upload is not done yet.")
    behind_since: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                     description="Set while uploads are behind (a checkpoint waits for another's "
                                     "upload, or an upload is retried: the store slow or unreachable; training goes "
                                     "on): since when.")
    last_error: str | None = Field(default=None, max_length=1024, description="The store's last error, retried.")


class Workers(ApiModel):
    """The worker group torchrun formed last (an attempt that restarts in place or is elastic re-forms it after a
    failure, a lost node or a joining one); reported by its rank 0 after its first step."""

    attempt: int | None = Field(default=None, ge=0, description="The attempt it belongs to.")
    generation: str = Field(max_length=64, description="When the group's rank 0 started: tells groups apart.")
    nodes: int = Field(ge=1, description="Nodes (pods) in the group.")
    world_size: int = Field(ge=1, description="Training processes in the group.")
    gradient_accumulation_steps: int = Field(ge=1, description="Accumulation that keeps the global batch on this "
                                             "world size.")
    global_batch_size: int = Field(ge=1, description="Sequences per optimizer step (unchanged by the size).")
    restart_count: int = Field(default=0, ge=0, description="torchrun's restarts of the workers on rank 0's pod.")
    cause: str | None = Field(default=None, max_length=1024, description="Why the group before it ended: the most "
                              "telling failure its workers left (absent for an attempt's first group).")
    resumed_step: int | None = Field(default=None, ge=0, description="The checkpoint step the group resumed from.")
    lost_steps: int | None = Field(default=None, ge=0, description="Steps the group before it had made past that "
                                   "checkpoint, done again.")
    failed_at: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                  description="When the group before it failed (its first worker to end).")
    recovery_seconds: float | None = Field(default=None, ge=0, description="From failedAt to this group's first "
                                           "optimizer step.")
    timeline: dict[str, float] = Field(default_factory=dict, description="Seconds after failedAt: workersStarted "
                                       "(detection, torchrun's restart and rendezvous), modelLoaded, "
                                       "checkpointLoaded, firstStep.")
    at: dict[str, str] = Field(default_factory=dict, description="The same phases' ends on the wall clock "
                               "(RFC 3339, milliseconds).")


class Recovery(ApiModel):
    """The operator's account of the current attempt's lost pods and worker groups (what was already announced)."""

    attempt: int = Field(ge=0, description="The attempt counted here.")
    pods_failed: int = Field(default=0, ge=0, description="Its Job's failed pods already looked at.")
    pod_failures: int = Field(default=0, ge=0, description="Of those, pods that failed by themselves (not stopped "
                              "from outside): counted against runPolicy.inPlaceRestarts.")
    generation: str | None = Field(default=None, max_length=64, description="The worker group last announced.")
    nodes: int | None = Field(default=None, ge=1, description="Its nodes.")


class Reporter(ApiModel):
    uid: str = Field(max_length=64, description="The FineTuneJob UID the reporting trainer was started for.")
    attempt: int | None = Field(default=None, ge=0, description="Its attempt.")


class RuntimeLayer(ApiModel):
    kind: str = Field(max_length=64, description="FineTuneRuntime or ClusterFineTuneRuntime.")
    name: str = Field(max_length=253, description="Its name.")
    generation: int = Field(ge=0, description="Its metadata.generation when the job started.")
    limits: RuntimeLimits | None = Field(default=None, description="Its limits then, as written: every later "
                                         "edit of the job and every attempt is checked against these, whatever the "
                                         "runtime says now.")


class RuntimeSnapshot(ApiModel):
    """What spec.runtimeRef (or the default runtimes) gave the job when it started: every later attempt runs with
    this, whatever happens to the runtime since."""

    name: str = Field(max_length=253, description="The runtime (the most specific, when defaults are layered).")
    kind: str = Field(max_length=64, description="Its kind.")
    generation: int = Field(ge=0, description="Its generation then.")
    digest: str = Field(max_length=80, description="sha256 of the template the job runs with (12 hex digits).")
    layers: list[RuntimeLayer] = Field(default_factory=list, max_length=2, description="Each runtime applied, "
                                       "the cluster default first.")
    template: dict[str, Any] = Field(default_factory=dict, description="The template the job runs with (the "
                                     "layers merged): the defaults under its spec.")


class MemoryEstimateStatus(ApiModel):
    peak_gib: float = Field(alias="peakGiB", ge=0, description="Predicted torch peak allocation per GPU, GiB.")
    needed_gib: float = Field(alias="neededGiB", ge=0, description="What one GPU must hold: the peak, allocator "
                              "fragmentation and the CUDA context, GiB.")
    largest_term: str = Field(max_length=64, description="The largest term (weights, gradients, optimizer states, "
                              "activations, logits and loss, ...).")
    terms: dict[str, float] = Field(default_factory=dict, description="Every term, GiB per GPU.")
    capacity_gib: float | None = Field(default=None, alias="capacityGiB", ge=0, description="Memory of one GPU the "
                                       "estimate was compared with (spec.resources.gpuMemoryGiB or the product "
                                       "label), GiB.")
    fits: bool | None = Field(default=None, description="neededGiB within capacityGiB.")
    suggestion: str | None = Field(default=None, max_length=1024, description="The cheapest change that fits, "
                                   "when it does not.")
    alternatives: list[str] = Field(default_factory=list, max_length=8, description="Other changes that fit, "
                                    "each of another kind, cheapest first.")


class FineTuneJobStatus(ApiModel):
    phase: Phase | None = Field(default=None, description="Pending, Queued, Running, Restarting, Suspended, "
                                "Succeeded or Failed.")
    reason: str | None = Field(default=None, max_length=1024, description="Why the job is in this phase.")
    message: str | None = Field(default=None, max_length=32768, description="Detail for humans.")
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations of the job's state.")
    attempt: int = Field(default=0, ge=0, description="Current attempt (1 for the first run).")
    restarts: int = Field(default=0, ge=0, description="Gang restarts so far (counted against backoffLimit).")
    schedule_retries: int = Field(default=0, ge=0, description="Partial gangs torn down after "
                                  "runPolicy.scheduleTimeoutSeconds and retried (not counted against backoffLimit).")
    disruptions: int = Field(default=0, ge=0, description="Gang restarts because a pod was stopped from outside "
                             "(deleted, evicted, preempted, a node drained): not counted against backoffLimit.")
    nodes: str | None = Field(default=None, max_length=32, description="Nodes running / nodes requested, e.g. "
                              "2/2; an elastic job adds its minimum: 3/4 (min 2).")
    restarts_in_place: int = Field(default=0, ge=0, description="Worker groups re-formed on the same pods after a "
                                   "failure or a lost node (runPolicy.inPlaceRestarts), instead of a gang restart.")
    nodes_lost: int = Field(default=0, ge=0, description="Pods of a job that restarts in place that failed or were "
                            "stopped, and were replaced alone (the others kept running).")
    recovery: Recovery | None = Field(default=None, description="The operator's account of lost pods and worker "
                                      "groups of the current attempt.")
    workers: Workers | None = Field(default=None, description="The worker group torchrun formed last (reported by "
                                    "its rank 0).")
    gpus: int | None = Field(default=None, ge=0, description="GPUs requested by one attempt.")
    global_batch_size: int | None = Field(default=None, ge=1, description="Sequences per optimizer step.")
    progress: Progress | None = Field(default=None, description="Training progress reported by rank 0.")
    checkpoint: CheckpointRef | None = Field(default=None, description="Newest complete checkpoint.")
    start_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                   description="When the first attempt started.")
    completion_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                        description="When the job succeeded or failed.")
    observed_generation: int | None = Field(default=None, ge=0, description="Spec generation last reconciled.")
    goodput: Goodput | None = Field(default=None, description="GPU-hours used and what restarts cost.")
    pushed: PushRef | None = Field(default=None, description="Where spec.output.push put the final model "
                                   "(written by the trainer once the push succeeded).")
    upload: UploadStatus | None = Field(default=None, description="Checkpoint uploads to spec.output.uri.")
    reporter: Reporter | None = Field(default=None, description="Who wrote the trainer's fields last: the chart's "
                                      "admission policy admits a trainer's write only for this object's UID and its "
                                      "current attempt.")
    active_seconds: int | None = Field(default=None, ge=0, description="Seconds the job was active (not Queued "
                                       "or Suspended) before activeSince: what runPolicy.activeDeadlineSeconds limits.")
    active_since: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                     description="Since when the job is active again (absent while Queued or "
                                     "Suspended).")
    kueue_deactivated: bool | None = Field(default=None, description="The operator deactivated the attempt's Kueue "
                                           "workload for spec.suspend; it activates it again on resume.")
    notice: Notice | None = Field(default=None, description="The trainer's latest warning (a loss spike, a resume "
                                  "that changed the global batch ...), posted by the operator as a Warning Event.")
    notice_posted: str | None = Field(default=None, json_schema_extra={"format": "date-time"},
                                      description="The time of the last notice posted as an Event.")
    runtime: RuntimeSnapshot | None = Field(default=None, description="The runtime the job runs with, recorded "
                                            "when it started.")
    started_spec_digest: str | None = Field(
        default=None, max_length=64, description="For a job that started with no runtime: a digest of what it runs "
        "(its spec but suspend and runPolicy, and its Kueue queue and priority labels), recorded when it started. "
        "An edit that changes it starts the job anew under the runtimes that cover it then.")
    preflight: Literal["Running", "Passed", "Failed"] | None = Field(
        default=None, description="The preflight check's outcome (spec.runPolicy.preflight).")
    memory_estimate: MemoryEstimateStatus | None = Field(
        default=None, alias="memoryEstimate", description="Predicted memory per GPU, from the preflight (the "
        "model's config.json and the spec): refused before any GPU is held when it cannot fit.")
