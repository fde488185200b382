"""S3-compatible object storage (spec.s3) through fsspec's s3fs: the filesystem every s3:// path goes through (data
files via datasets' storage_options, model downloads, checkpoint uploads), and errors that name the URI, what the
store said and what to change.

Configured once per process from the spec (`configure`): the data, model and output code ask for `filesystem()`.
Credentials are never passed here: boto reads them from the environment (the Secret's keys), a web identity token
(IRSA) or ~/.aws, as it does for the AWS CLI."""

import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.api.storage import S3Spec, split_s3
from finetune_trainer.errors import ConfigError, DataError, StorageRefused, StorageUnavailable

_SETTINGS: list[S3Spec] = [S3Spec()]
_CACHE: list[Path] = [Path.home() / ".cache" / "finetunejob-models"]
_FILESYSTEMS: dict[str, Any] = {}
_STAGED: set[str] = set()  # the copies this process has reconciled with the store


def configure(s3: S3Spec, cache: Path | None = None) -> None:
    """The store of this process (the trainer's, the preflight's, finetune run's), and where s3:// models go."""
    _SETTINGS[0] = s3
    if cache is not None:
        _CACHE[0] = cache
    _FILESYSTEMS.clear()
    _STAGED.clear()


def settings() -> S3Spec:
    return _SETTINGS[0]


def model_cache() -> Path:
    """Where this process stages s3:// models (finetune_trainer.model_staging)."""
    return _CACHE[0]


def staged_copies() -> set[str]:
    """The staged copies this process has reconciled with the store since `configure` (each once per process)."""
    return _STAGED


def storage_options() -> dict[str, Any]:
    """s3fs's keyword arguments for spec.s3 (datasets.load_dataset(storage_options=...) takes the same)."""
    s3 = _SETTINGS[0]
    client: dict[str, Any] = {}
    if s3.region:
        client["region_name"] = s3.region
    options: dict[str, Any] = {
        "client_kwargs": client,
        # Bounded waits: a store that does not answer is a retryable outage, not a hang.
        "config_kwargs": {"connect_timeout": 10, "read_timeout": 120,
                          "retries": {"max_attempts": 3, "mode": "standard"},
                          **({"s3": {"addressing_style": s3.addressing_style}}
                             if s3.addressing_style != "auto" else {})},
    }
    if s3.endpoint_url:
        options["endpoint_url"] = s3.endpoint_url
    return options


def filesystem() -> Any:
    """The s3fs filesystem for spec.s3 (one per process and thread-safe: s3fs runs its own event loop)."""
    key = json.dumps(storage_options(), sort_keys=True)
    if key not in _FILESYSTEMS:
        import s3fs

        _FILESYSTEMS[key] = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options())
    return _FILESYSTEMS[key]


def allow_datasets_remote_files() -> None:
    """datasets refuses every remote URL under HF_HUB_OFFLINE=1, which users set to keep pods off the Hub (and the
    test kubelet sets): s3:// files named in the spec are wanted whatever the Hub policy, so datasets' own flag is
    lifted for this process (streamed reads check it later, too). huggingface_hub's flag stays: the Hub is still
    never contacted."""
    import datasets

    datasets.config.HF_HUB_OFFLINE = False


# --- what went wrong ---------------------------------------------------------------------------------------------
# AWS's and MinIO's spellings (MinIO says InvalidTokenId for a session token it cannot read; STS-backed AWS
# services InvalidClientTokenId).
REFUSED_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                 "InvalidTokenId", "InvalidClientTokenId", "TokenRefreshRequired", "AllAccessDisabled", "403")


def _code(exc: BaseException) -> str:
    """The store's error code (S3's Code element), wherever s3fs or botocore put it."""
    for candidate in (exc, exc.__cause__, exc.__context__, *(exc.args if exc.args else ())):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict):
            return str((response.get("Error") or {}).get("Code") or "")
    return ""


def refused(exc: BaseException) -> bool:
    return isinstance(exc, PermissionError) or _code(exc) in REFUSED_CODES or tls_failed(exc)


def tls_failed(exc: BaseException) -> bool:
    """TLS could not be set up: an https:// endpoint on a plain-http server, or an untrusted certificate. A setting
    to fix, not an outage (botocore's SSLError, aiohttp's ClientConnectorSSLError / CertificateError)."""
    chain = [e for e in (exc, exc.__cause__, exc.__context__) if e is not None]
    return any("SSL" in type(e).__name__ or "Certificate" in type(e).__name__ for e in chain) or any(
        marker in str(e) for e in chain for marker in ("WRONG_VERSION_NUMBER", "CERTIFICATE_VERIFY_FAILED"))


def _local_run() -> bool:
    """`finetune run`: no Secrets and no ServiceAccount, the shell's AWS_* variables are the credentials."""
    return os.environ.get(c.ENV_JOB_NAMESPACE) == c.LOCAL_NAMESPACE


def unreachable(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    return bool(names & {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionError",
                         "ClientConnectorError", "ServerDisconnectedError", "TimeoutError"}) or \
        _code(exc) in ("SlowDown", "ServiceUnavailable", "InternalError", "503", "500")


def explain(exc: BaseException, uri: str) -> str:
    code = _code(exc)
    endpoint = _SETTINGS[0].endpoint_url or "AWS"
    if tls_failed(exc):
        return (f"{uri}: TLS with {endpoint} failed ({type(exc).__name__}: {exc}); an https:// endpoint whose "
                "server speaks plain http (write http:// in spec.s3.endpointURL), or a certificate the trainer "
                "does not trust")
    if refused(exc):
        where = ("the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of the shell that runs `finetune run` (a local run "
                 "has no Secrets)" if _local_run() else "spec.s3.credentialsSecret (AWS_ACCESS_KEY_ID / "
                 "AWS_SECRET_ACCESS_KEY) or the role of the pod's ServiceAccount")
        # A session token goes with the request whatever the keys are: a stale or mistyped one is refused as such.
        token = (", and AWS_SESSION_TOKEN, which is set: a temporary credential that expired or does not belong to "
                 "these keys (unset it for long-lived keys)" if os.environ.get("AWS_SESSION_TOKEN") else "")
        return (f"{uri}: the store refused the credentials ({code or type(exc).__name__}: {exc}); check {where}"
                f"{token}, and that they may read and write this bucket")
    if code == "NoSuchBucket" or "bucket does not exist" in str(exc).lower():
        return f"{uri}: the bucket {split_s3(uri)[0]} does not exist; create it or fix the URI"
    if unreachable(exc):
        return f"{uri}: the store at {endpoint} did not answer ({type(exc).__name__}: {exc})"
    return f"{uri}: {type(exc).__name__}: {exc}"


def failure(exc: BaseException, uri: str, missing: Callable[[str], Exception] = DataError) -> Exception:
    """The TrainerError for a failed access: refused credentials 77, an outage retryable, anything missing
    `missing` (65 for data, 78 for a model)."""
    if refused(exc):
        return StorageRefused(explain(exc, uri))
    if unreachable(exc):
        return StorageUnavailable(explain(exc, uri))
    return missing(explain(exc, uri))


def check_bucket(uri: str) -> None:
    """The output's bucket exists and takes a write (a probe object, removed again): refused or missing is 77."""
    fs = filesystem()
    probe = f"{uri.rstrip('/')}/.finetune-write-check-{os.getpid()}"
    try:
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except Exception as exc:  # s3fs and botocore raise many types
        if unreachable(exc):
            raise StorageUnavailable(explain(exc, uri)) from exc
        why = explain(exc, uri)
        raise StorageRefused(why if tls_failed(exc) else why + "; spec.output.uri must name a bucket the job may "
                             "write") from exc


# --- files -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteFile:
    uri: str
    size: int
    etag: str


def listing(uri: str, patterns: Iterable[str] | None = None) -> list[RemoteFile]:
    """Every object under the prefix `uri` (its relative name matching one of `patterns`, fnmatch-style)."""
    import fnmatch

    fs = filesystem()
    prefix = uri.rstrip("/") + "/"
    found = fs.find(prefix, detail=True)
    out = []
    for key, info in sorted(found.items()):
        name = key[len(prefix.removeprefix("s3://")):] if not key.startswith("s3://") else key[len(prefix):]
        if name.endswith("/"):  # a folder marker (the S3 console makes them): no file of its own
            continue
        if patterns is not None and not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        out.append(RemoteFile(f"s3://{key.removeprefix('s3://')}", int(info.get("size") or 0),
                              str(info.get("ETag") or info.get("etag") or "").strip('"')))
    return out


def relative(remote: RemoteFile, uri: str) -> str:
    """The object's name under the prefix `uri`, as a path under the directory it is downloaded into: a key that
    would climb out of it (`..`, an empty part) is refused, not followed."""
    name = remote.uri[len(uri.rstrip("/")) + 1:]
    parts = name.split("/")
    if not name or any(part in ("", ".", "..") for part in parts):
        raise ConfigError(f"{remote.uri} under {uri} has a name that would be written outside the directory it is "
                          "downloaded into ('..', '.' or an empty part); rename or remove that object")
    return name


def read_manifest(path: Path) -> dict[str, str]:
    """ETags of the files already downloaded; a manifest that is torn or not ours is no manifest (all fetched)."""
    try:
        manifest = json.loads(path.read_text()) if path.is_file() and not path.is_symlink() else {}
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in manifest.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(manifest, dict) else {}


def write_manifest(path: Path, manifest: dict[str, str]) -> None:
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.part")
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, path)  # never torn, and never written through a link planted at the name


def download(files: list[RemoteFile], uri: str, dest: Path) -> int:
    """The files (under prefix `uri`) into `dest`, resumably: a file already there with the same size and ETag (in
    dest/.s3-manifest.json) is skipped, each file is written to a temporary name and renamed. Returns bytes fetched."""
    fs = filesystem()
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / ".s3-manifest.json"
    manifest = read_manifest(manifest_path)
    fetched = 0
    for remote in files:
        name = relative(remote, uri)
        target = dest / name
        if (manifest.get(name) == remote.etag and not target.is_symlink() and target.is_file()
                and target.stat().st_size == remote.size):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        # A name nobody can guess or share: two downloaders never write one file, nor through a planted link.
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        try:
            fs.get_file(remote.uri, str(tmp))
            os.replace(tmp, target)  # atomic: a reader sees the old file or the new one, never a missing or half one
        except BaseException:
            tmp.unlink(missing_ok=True)  # a retry writes another name: nothing half-written piles up
            raise
        manifest[name] = remote.etag
        write_manifest(manifest_path, manifest)
        fetched += remote.size
    return fetched


def upload(local: Path, uri: str, names: Iterable[str]) -> int:
    """The files `names` (relative to `local`) to the prefix `uri`; returns bytes sent."""
    fs = filesystem()
    sent = 0
    for name in names:
        path = local / name
        fs.put_file(str(path), f"{uri.rstrip('/')}/{name}")
        sent += path.stat().st_size
    return sent


def with_retries(action: Callable[[], Any], attempts: int, first_wait: float = 1.0, max_wait: float = 60.0,
                 on_retry: Callable[[int, BaseException], None] | None = None, other_errors: int | None = None) -> Any:
    """`action`, retried with exponential backoff while the store is unreachable; refusals raise at once. An error
    that is not an outage (a local file gone, a bug) is tried `other_errors` times at most, when given: retrying it
    for as long as an outage may last would only hide it."""
    wait = first_wait
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:  # s3fs and botocore raise many types
            if refused(exc) or attempt == attempts or (
                    other_errors is not None and attempt >= other_errors and not unreachable(exc)):
                raise
            if on_retry is not None:
                on_retry(attempt, exc)
            time.sleep(wait)
            wait = min(wait * 2, max_wait)
    raise AssertionError("unreachable")
