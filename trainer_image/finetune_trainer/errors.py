"""Errors that map to the permanent exit codes of the contract (finetune_operator.api.exit_codes)."""

import os
import signal
from collections.abc import Callable
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.api import exit_codes


def stop_cause(signum: int) -> str:
    """What the user did to send a stop signal, in their words (not "signal 15")."""
    if signum == signal.SIGINT:
        return "Ctrl-C"
    return os.environ.get(c.ENV_STOP_CAUSE) or ("a stop request (SIGTERM: the pod was deleted, preempted or "
                                                "evicted, or its node drained)")


class TrainerError(Exception):
    exit_code = 1
    reason: str | None = None  # the summary's reason when it is not the exit code's own name


class ConfigError(TrainerError):
    """The config, model or tokenizer cannot work; retrying will not help."""

    exit_code = exit_codes.CONFIG_ERROR


class DataError(TrainerError):
    """The data cannot be read or yields nothing to train on."""

    exit_code = exit_codes.DATA_ERROR


class NoGPUVisible(TrainerError):
    """A GPU job on a node whose GPU is not visible (driver, device plugin): retryable, another node may serve."""


class PushFailed(TrainerError):
    """The model is saved; the Hub push failed in a way a later attempt may get through (network, 5xx)."""

    exit_code = exit_codes.PUSH_FAILED


class PushRefused(TrainerError):
    """The model is saved; the Hub refused the push (token, permission, repository name): retrying cannot help."""

    exit_code = exit_codes.PUSH_REFUSED


class StorageRefused(TrainerError):
    """The object store refused the credentials, or the output's bucket is missing: retrying cannot help."""

    exit_code = exit_codes.PUSH_REFUSED
    reason = "StorageRefused"


class StorageUnavailable(TrainerError):
    """The object store did not answer (network, 5xx): a later attempt may get through."""

    exit_code = exit_codes.PUSH_FAILED
    reason = "StorageUnavailable"


class UploadFailed(TrainerError):
    """The final model is saved locally but could not be uploaded to output.uri: the retry resumes at the last
    step (its checkpoint is in the bucket) and only uploads."""

    exit_code = exit_codes.PUSH_FAILED
    reason = "UploadFailed"


class LossDiverged(TrainerError):
    exit_code = exit_codes.DIVERGED


class Interrupted(TrainerError):
    exit_code = exit_codes.INTERRUPTED


# Stop signals that arrived before training ran (main._stop_before_training), for GracefulStop to honour.
EARLY_STOPS: list[int] = []


class StopRequested(BaseException):
    """A stop signal before training runs, raised from its handler: a BaseException, so that no library's
    `except Exception` around the code it interrupts (model loading, tokenization) swallows it."""

    exit_code = exit_codes.INTERRUPTED


def outcome(run: Callable[[], dict[str, Any]], prefix: str = "") -> tuple[int, dict[str, Any], Exception | None]:
    """(exit code, summary, unexpected exception) of `run` under the contract: a TrainerError exits with its own
    code; anything else is retryable (1) and is handed back so the caller can log and re-raise it."""
    try:
        return exit_codes.SUCCESS, run(), None
    except (TrainerError, StopRequested) as exc:
        reason = getattr(exc, "reason", None) or exit_codes.reason(exc.exit_code)
        return exc.exit_code, {"reason": reason, "message": f"{prefix}{exc}"}, None
    except Exception as exc:
        # A CUDA OOM is retryable like any crash, but says what it is (the kubelet never sees it: no OOM kill).
        reason = "OOMKilled" if type(exc).__name__ == "OutOfMemoryError" else "Error"
        return 1, {"reason": reason, "message": f"{prefix}{type(exc).__name__}: {exc}"}, exc
