"""The trainer's exit-code contract, shared with the operator (which decides retry vs fail from it).

Codes follow sysexits.h where one fits. Anything not listed as permanent is retryable: a kill (137: SIGKILL, which
is an OOM kill only when the kubelet says OOMKilled), a collective/NCCL timeout, a lost node, a DNS failure at
start-up.
"""

from typing import Final

SUCCESS: Final = 0
DATA_ERROR: Final = 65  # EX_DATAERR: the data cannot be read or yields no trainable example
PUSH_FAILED: Final = 74  # EX_IOERR: the model is saved, the Hub push (or the output.uri upload) failed, or the object
# store did not answer (network, 5xx); the retry only pushes (uploads)
RENDEZVOUS_DNS_TIMEOUT: Final = 75  # EX_TEMPFAIL: node 0's name never resolved; retry the attempt
PUSH_REFUSED: Final = 77  # EX_NOPERM: the Hub refused the push (token, permission, repo), or the object store refused
# the credentials or has no such bucket (reason StorageRefused)
CONFIG_ERROR: Final = 78  # EX_CONFIG: the config, model or tokenizer cannot work (e.g. QLoRA on CPU)
DIVERGED: Final = 79  # the loss became NaN/inf or stayed far above its early level; a restart diverges again
INTERRUPTED: Final = 143  # 128 + SIGTERM: stopped on request after saving a checkpoint; resumable

PERMANENT: Final = frozenset({DATA_ERROR, PUSH_REFUSED, CONFIG_ERROR, DIVERGED})
REASONS: Final = {
    SUCCESS: "Succeeded",
    DATA_ERROR: "DataError",
    PUSH_FAILED: "PushFailed",
    PUSH_REFUSED: "PushRefused",
    RENDEZVOUS_DNS_TIMEOUT: "RendezvousDNSTimeout",
    CONFIG_ERROR: "InvalidConfig",
    DIVERGED: "LossDiverged",
    INTERRUPTED: "Interrupted",
    137: "Killed",  # SIGKILL: the kubelet's OOMKilled reason, when it gives one, wins (controller/observed.py)
}


# What each code means to a user (docs/reference/exit-codes.md is generated from this table).
DESCRIPTIONS: Final = {
    SUCCESS: "the model is saved (and pushed or uploaded when asked)",
    DATA_ERROR: "data missing, unreadable, or nothing trainable (the file and row are named)",
    CONFIG_ERROR: "the config, model or tokenizer cannot work (e.g. QLoRA on CPU, flash attention missing from the "
                  "image)",
    DIVERGED: "the loss or gradient norm became NaN/inf, or the loss stayed far above its early level for 20 "
              "optimizer steps or until the end of a shorter run (runPolicy.divergence); nothing is checkpointed "
              "after it, no final model is saved",
    PUSH_REFUSED: "the model is saved; the Hub refused the push (token, permission, repo) - PushRefused - or the "
                  "object store refused the credentials or has no such bucket - StorageRefused",
    PUSH_FAILED: "the model is saved; the Hub was unreachable or failing (the retry only pushes) - PushFailed -, "
                 "final/ could not be uploaded to output.uri (the retry only uploads) - UploadFailed -, or the store "
                 "did not answer - StorageUnavailable",
    RENDEZVOUS_DNS_TIMEOUT: "node 0's name never resolved",
    INTERRUPTED: "stopped on request (SIGTERM, Ctrl-C) after saving a checkpoint; resumable",
    137: "killed (SIGKILL): the kubelet's OOMKilled when it says so",
}


def is_permanent(code: int) -> bool:
    """True when retrying the same attempt cannot succeed."""
    return code in PERMANENT


def reason(code: int) -> str:
    return REASONS.get(code, "Error")


def short(text: str, limit: int = 400) -> str:
    """`text` on one line, cut at a word boundary to at most `limit` characters (an Event or a column, not a log)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1].rsplit(" ", 1)[0]
    return cut + "…"
