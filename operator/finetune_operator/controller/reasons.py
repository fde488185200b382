"""Every reason a FineTuneJob shows, in `status.reason` and in its Events, with what it means: the source of
docs/reference/events.md (`./hack/generate.sh`). A test reads the operator's and the trainer's code for the reasons
they write and fails on one that is not here, or one here that nothing writes.

The trainer's exit-code reasons (DataError, InvalidConfig, ...) come from api/exit_codes.py and are not repeated."""

from typing import Final, NamedTuple


class Reason(NamedTuple):
    shown: str  # where a user sees it: the phases whose status.reason it is, and/or an Event's type
    meaning: str


REASONS: Final = {
    # Pending: the attempt exists (or is about to), not every node runs yet.
    "Created": Reason("Pending; Event Normal", "the first attempt was created"),
    "Pending": Reason("Pending", "the attempt's pods are being scheduled or started"),
    "Preflight": Reason("Pending; Event Normal", "runPolicy.preflight: one CPU pod checks the model, data and "
                        "output before any GPU is asked for"),
    "Resuming": Reason("Pending; Event Normal", "a new attempt starts from the newest complete checkpoint"),
    "SpecChanged": Reason("Pending; Event Normal", "resumed after the spec was edited: the next attempt runs the "
                          "edit, from the newest checkpoint (not counted as a restart)"),
    "RuntimeNotFound": Reason("Pending; Event Warning", "spec.runtimeRef names a runtime that does not exist (looked "
                              "at again every 30 seconds)"),
    "RuntimeNotAllowed": Reason("Pending; Event Warning", "the ClusterFineTuneRuntime's namespaceSelector does not "
                                "take the job's namespace: it waits until the namespace is labelled for it"),
    "Unschedulable": Reason("Pending; Event Warning", "no node can run a pod of the job (too many GPUs per node, a "
                            "nodeSelector or taint no node matches), said by the scheduler or seen at once by the "
                            "operator"),
    "InsufficientCapacity": Reason("Pending; Event Warning", "the nodes the job may use hold fewer of its pods than "
                                   "it has nodes"),
    "ImagePullFailed": Reason("Pending; Event Warning", "a pod's image cannot be pulled (wrong name, missing pull "
                              "Secret, registry unreachable)"),
    "CreateContainerError": Reason("Pending; Event Warning", "a pod's container cannot be created (a missing "
                                   "ConfigMap, Secret or key it references)"),
    "QuotaExceeded": Reason("Pending; Event Warning", "a ResourceQuota of the namespace refuses the attempt's pods "
                            "for now"),
    "PodFailedToStart": Reason("Pending; Event Warning", "the Job controller cannot create the pods (its Event says "
                               "why)"),
    "AttemptRefused": Reason("Pending, Restarting; Event Warning", "the API server refused the attempt's objects (an "
                             "admission policy or webhook): the message quotes it; retried"),
    "NameConflict": Reason("Pending, Restarting; Event Warning", "an object the job would create exists and is not "
                           "the job's: nothing of it is changed; retried until it is gone"),
    # Queued: Kueue holds the job (the reason is taken from Kueue's Workload).
    "Queued": Reason("Queued; Event Warning", "Kueue has not admitted the job's workload yet"),
    "Admitting": Reason("Queued; Event Warning", "Kueue reserved quota and waits for its admission checks"),
    "Preempted": Reason("Queued; Event Warning", "Kueue preempted the job for another: it queues again and resumes "
                        "from its newest checkpoint"),
    "Deactivated": Reason("Queued; Event Warning", "the Kueue workload is deactivated (spec.active: false)"),
    "LocalQueueMissing": Reason("Queued; Event Warning", "the kueue.x-k8s.io/queue-name label names a LocalQueue "
                                "that does not exist"),
    "QueueTooSmall": Reason("Queued; Event Warning", "the gang asks for more than its ClusterQueue can ever hold, "
                            "or for a resource it does not cover"),
    # Running, Suspended, Succeeded.
    "Running": Reason("Running; Event Normal", "every node's pod runs"),
    "Suspended": Reason("Suspended; Event Normal", "spec.suspend: true; the pods are gone, the checkpoints kept"),
    # Restarting: the gang is torn down and the next attempt starts after a backoff, from the newest checkpoint.
    "Disrupted": Reason("Restarting; Event Warning", "a pod was stopped from outside (deleted, evicted, preempted, a "
                        "node drained): not counted against runPolicy.backoffLimit"),
    "OOMKilled": Reason("Restarting; Event Warning", "a container ran out of memory (the kubelet's OOMKilled, or the "
                        "GPU's out-of-memory error)"),
    "Stalled": Reason("Restarting; Event Warning", "no progress heartbeat within runPolicy.stallTimeoutSeconds (also "
                      "the Stalled condition)"),
    "EphemeralStorageExceeded": Reason("Restarting; Event Warning", "the kubelet evicted a pod that wrote more "
                                       "local disk than spec.resources.ephemeralStorage (counted against "
                                       "runPolicy.backoffLimit)"),
    "PodFailed": Reason("Restarting; Event Warning", "a pod failed without a container exit code (the kubelet's "
                        "reason when it gives one)"),
    "ScheduleTimeout": Reason("Restarting; Event Warning", "not every node ran within "
                              "runPolicy.scheduleTimeoutSeconds: the partial gang is deleted to free its GPUs and "
                              "retried (not counted against backoffLimit)"),
    "StorageUnavailable": Reason("Restarting; Event Warning", "the object store did not answer (network, 5xx)"),
    "UploadFailed": Reason("Restarting; Event Warning", "final/ could not be uploaded to spec.output.uri; the next "
                           "attempt only uploads"),
    # Failed: not retried.
    "InvalidSpec": Reason("Failed; Event Warning", "the spec breaks a rule: every field error is in the message"),
    "BackoffLimitExceeded": Reason("Failed; Event Warning", "more gang restarts than runPolicy.backoffLimit"),
    "DeadlineExceeded": Reason("Failed; Event Warning", "active longer than runPolicy.activeDeadlineSeconds"),
    "ScheduleRetriesExhausted": Reason("Failed; Event Warning", "the gang never ran whole within "
                                       "runPolicy.scheduleRetryLimit retries"),
    "QuotaTooSmall": Reason("Failed; Event Warning", "a ResourceQuota of the namespace allows fewer GPUs than the "
                            "gang needs: it can never run there"),
    "StorageRefused": Reason("Failed; Event Warning", "the object store refused the credentials, or the bucket does "
                             "not exist"),
    "RewardFunctionFailed": Reason("Failed; Event Warning", "a reward function of method.grpo.rewards is missing, "
                                   "raised, or returned the wrong number of rewards or NaN: its name and the row "
                                   "are in the message (exit 78)"),
    # Events only: an attempt that restarts in place (runPolicy.inPlaceRestarts, distributed.minNodes).
    "NodeLost": Reason("Event Warning", "a pod of an attempt that restarts in place failed or was stopped: it is "
                       "replaced alone, the others keep running (counted against runPolicy.inPlaceRestarts unless "
                       "stopped from outside)"),
    "RestartedInPlace": Reason("Event Warning", "the workers restarted on the same pods and resumed from the newest "
                               "checkpoint, with the cause, the steps redone and the recovery time"),
    "Shrunk": Reason("Event Warning", "an elastic job trains on the surviving nodes of a lost one (at least "
                     "distributed.minNodes), its global batch kept"),
    "Grew": Reason("Event Normal", "an elastic job took a node back (at most distributed.numNodes), its global batch "
                   "kept"),
    # Events only.
    "SpecEdited": Reason("Event Normal", "the spec was edited while an attempt runs: the edit applies from the next "
                         "attempt"),
    "MemoryTight": Reason("Event Warning", "the preflight predicts more than 90% of a GPU's memory"),
    "KueueAdmissionKept": Reason("Event Normal", "a restarted attempt keeps the Kueue admission (quota, place in the "
                                 "queue) of the attempt before it"),
    "KueueRequeued": Reason("Event Normal", "a restarted attempt asks Kueue for other pods than before: it queues "
                            "anew"),
    "KueueReleased": Reason("Event Warning", "a held Kueue admission was released: the next attempt could not be "
                            "created in time"),
    "KueueLabelsChanged": Reason("Event Normal", "the queued Job took the FineTuneJob's edited Kueue labels"),
    "TrainerWarning": Reason("Event Warning", "a warning from the trainer that named no reason of its own"),
}

# The trainer's warnings (status.notice, posted by the operator as Warning Events with this reason).
TRAINER_NOTICES: Final = {
    "LossSpike": "the loss jumped far above its recent level at a step",
    "LossDiverging": "runPolicy.divergence with action warn: the loss stays far above its early level",
    "GlobalBatchChanged": "the run resumed on another number of processes: the global batch size changed",
    "SystemPromptFolded": "the chat template refuses system messages: they were folded into the first user turn",
    "LossShifted": "the loss rose and stayed up, but the model still knew its first rows when it rose: new rows, "
                   "not divergence; the divergence threshold follows the new level",
    "LossAboveEarlyLevel": "the run ended with its loss above the divergence threshold, on new rows the model was "
                           "still learning (it still knew its first rows when the loss rose)",
    "LearningRateChanged": "the run resumed with another learningRate: honoured from the resumed step",
    "RowsTruncated": "rows longer than data.maxLength were cut",
    "RowsDropped": "rows were left out: too long (truncation: drop), cut before their reply began, or without a "
                   "reply",
    "PairsDropped": "preference pairs too long for data.maxLength were left out",
    "RowsRepeated": "several processes: the last batch of an epoch is filled up with rows repeated from its start",
    "WeightsOnlyCheckpoint": "the run resumed a weights-only checkpoint (checkpoints.resume naming one saved with "
                             "save_only_model elsewhere): a new optimizer, the learning-rate schedule from its start",
    "DataSkipIgnored": "the run resumed with extraArgs.ignore_data_skip: the epoch's batches it had trained on are "
                       "trained on again",
    "ResumedAtFinalStep": "the newest checkpoint is already at the final step (a job created again over a "
                          "finished run's output): nothing was trained, the final model was saved from it",
}

# CamelCase words the operator reads from Kubernetes and Kueue (pod, Job and Workload conditions and reasons,
# taint effects, kinds): not reasons of ours, and never shown as one.
KUBERNETES_WORDS: Final = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
    "RunContainerError", "PodScheduled", "FailedCreate", "DisruptionTarget", "FailureTarget", "SuccessCriteriaMet",
    "QuotaReserved", "PreferNoSchedule", "ResourceQuota", "NamespaceTerminating",
})
