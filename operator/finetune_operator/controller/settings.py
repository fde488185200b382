"""The operator's settings: one typed model, read once from the environment the chart's Deployment sets."""

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..api import constants as c


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    trainer_image: str = Field(default=c.DEFAULT_TRAINER_IMAGE, min_length=1,
                               description="Image of jobs that do not set spec.pod.image.")
    restart_backoff_seconds: float = Field(default=10.0, ge=0, description="First gang-restart backoff; doubled "
                                           "per restart.")
    restart_backoff_max_seconds: float = Field(default=300.0, gt=0, description="Longest gang-restart backoff.")
    kueue_hold_grace_seconds: float = Field(default=120.0, ge=0, description="How long past its restart backoff a "
                                            "gang restart may hold its Kueue admission while the next attempt's Job "
                                            "cannot be created; then the quota goes back.")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="Port of /metrics; 0 serves none.")
    workers: int = Field(default=16, ge=1, le=256, description="Reconcile passes run at once (and API connections).")
    stuck_pass_seconds: float = Field(default=300.0, gt=0, description="A reconcile pass running longer than this "
                                      "fails the liveness probe (a pass is a few API calls: a hung connection, not "
                                      "work), so the kubelet restarts the operator.")
    watch_seconds: int = Field(default=600, ge=1, le=3600, description="How long the apiserver keeps one watch "
                                 "stream open; the operator gives up on a silent stream a tenth later (at least 10 s "
                                 "later): a connection lost without a reset, then listed and watched again.")
    network_policy: bool = Field(default=False, description="Give each gang a NetworkPolicy: ingress only from the "
                                 "pods of the same FineTuneJob.")


ENVIRONMENT: dict[str, str] = {
    "trainer_image": c.ENV_OPERATOR_TRAINER_IMAGE,
    "restart_backoff_seconds": c.ENV_OPERATOR_RESTART_BACKOFF,
    "kueue_hold_grace_seconds": c.ENV_OPERATOR_KUEUE_HOLD_GRACE,
    "metrics_port": c.ENV_OPERATOR_METRICS_PORT,
    "workers": c.ENV_OPERATOR_WORKERS,
    "network_policy": c.ENV_OPERATOR_NETWORK_POLICY,
    "stuck_pass_seconds": c.ENV_OPERATOR_STUCK_RECONCILE,
    "watch_seconds": c.ENV_OPERATOR_WATCH_SECONDS,
}


def watch_client_timeout(server_timeout: float) -> float:
    """A watch stream that outlives the server's own timeout by this much is on a dead connection."""
    return server_timeout + max(10.0, server_timeout / 10)


class InvalidSettings(ValueError):
    """An operator environment variable has a value the operator cannot run with."""


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """Settings from the environment (unset variables keep their defaults); every bad value named at once."""
    given = {field: env[name] for field, name in ENVIRONMENT.items() if env.get(name, "") != ""}
    try:
        return Settings.model_validate(given)
    except ValidationError as exc:
        problems = [f"{ENVIRONMENT[str(e['loc'][0])]}={given.get(str(e['loc'][0]))!r}: {e['msg']}"
                    for e in exc.errors(include_url=False)]
        raise InvalidSettings("invalid operator settings: " + "; ".join(problems)) from None
