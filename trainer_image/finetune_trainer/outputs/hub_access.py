"""spec.output.push before any training: the Hub client, the repository created or checked with the token, and
retries that tell a refusal (permanent) from an outage. Light on purpose (huggingface_hub, no transformers): the
trainer checks the token before it loads torch and transformers, so a refused token fails within seconds."""

import logging
import os
import time
from collections.abc import Callable

from finetune_trainer.config import TrainerConfig
from finetune_trainer.errors import PushFailed, PushRefused

log = logging.getLogger(__name__)
TRIES = 3
RETRY_SECONDS = 2.0


def hub_api(cfg: TrainerConfig):
    from huggingface_hub import HfApi

    push = cfg.spec.output.push
    return HfApi(endpoint=push.endpoint, token=os.environ.get("HF_TOKEN") or None)


def ensure_repo(api, cfg: TrainerConfig) -> None:
    push = cfg.spec.output.push
    api.create_repo(push.repo, private=push.private, exist_ok=True)
    if push.revision != "main":
        api.create_branch(push.repo, branch=push.revision, exist_ok=True)


SAVED = "the model is saved in the output directory"


def with_retries(action: Callable[[], str], what: str, state: str = SAVED) -> str:
    """Runs `action`, again after a network error or a 5xx/429; a refusal (4xx) is not retried. `state` says what
    is safe so far, in the error."""
    for attempt in range(1, TRIES + 1):
        try:
            return action()
        except Exception as exc:  # huggingface_hub raises httpx, OSError and its own errors
            status = _status(exc)
            if status is not None and 400 <= status < 500 and status != 429:
                raise PushRefused(f"{what}: the Hub refused it ({status}: {_first_line(exc)}); {state}. Check the "
                                  "token's write access and output.push.repo") from exc
            if attempt == TRIES:
                raise PushFailed(f"{what} failed {TRIES} times ({_first_line(exc)}); {state}, and the next attempt "
                                 "resumes at the last step and only pushes") from exc
            log.warning("%s failed (%s); retrying in %.0f s", what, _first_line(exc), RETRY_SECONDS * attempt)
            time.sleep(RETRY_SECONDS * attempt)
    raise AssertionError("unreachable")


def check_access(cfg: TrainerConfig) -> dict[str, str]:
    """Before training (and in the preflight), as the Trainer's own push_to_hub does: the repository exists or is
    created with the token, so a missing or refused token fails in the first minute instead of after the run
    (PushRefused, permanent). An unreachable Hub only warns: the push at the end tries again."""
    push = cfg.spec.output.push
    api = hub_api(cfg)

    def create() -> str:
        ensure_repo(api, cfg)
        return push.repo

    try:
        with_retries(create, f"checking the Hub repository {push.repo}", state="nothing was trained yet")
    except PushFailed as exc:
        log.warning("%s; training goes on and the push at the end tries again", exc)
        return {"hubCheck": "unreachable"}
    # create_repo(exist_ok=True) lets a read-only token through when the repository exists: only the push would
    # be refused, after the whole run. The token's role says so now.
    if token_role(api) == "read":
        source = (f"Secret {push.token_secret.name}, key {push.token_secret.key}" if push.token_secret
                  else "HF_TOKEN")
        raise PushRefused(f"the Hub token ({source}) is read-only (role read), so the push of {push.repo} would be "
                          "refused after training; nothing was trained yet. Use a write token, or a fine-grained "
                          f"token with write access to {push.repo}")
    return {"hubCheck": "ok"}


def token_role(api) -> str | None:
    """read, write or fineGrained, as whoami reports the token; None when it cannot be read (a Hub-compatible
    server without whoami, a network error): the push at the end still tells."""
    try:
        info = api.whoami()
    except Exception as exc:  # huggingface_hub raises httpx, OSError and its own errors
        log.info("the Hub token's role could not be read (%s)", _first_line(exc))
        return None
    role = ((info.get("auth") or {}).get("accessToken") or {}).get("role")
    return str(role) if role else None


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
