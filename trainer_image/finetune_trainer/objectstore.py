"""S3-compatible object storage (spec.s3) through fsspec's s3fs: the filesystem every s3:// path goes through (data
files via datasets' storage_options, model downloads, checkpoint uploads), and errors that name the URI, what the
store said and what to change.

Configured once per process from the spec (`configure`): the data, model and output code ask for `filesystem()`.
Credentials are never passed here: boto reads them from the environment (the Secret's keys), a web identity token
(IRSA) or ~/.aws, as it does for the AWS CLI."""

import contextlib
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.api.storage import S3Spec, is_s3, split_s3
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


# --- models ------------------------------------------------------------------------------------------------------
# What from_pretrained reads: configs, tokenizer files, weights (safetensors when there are any), an adapter's.
MODEL_FILES = ("*.json", "*.safetensors", "*.model", "*.tiktoken", "tokenizer*", "*.txt", "*.jinja", "*.py",
               "*.bin", "*.pt")
NEVER_MODEL_FILES = ("optimizer*", "scheduler*", "rng_state*", "trainer_state.json", "training_args.bin")


def model_files(files: list[RemoteFile], uri: str) -> list[RemoteFile]:
    """Only the files a model needs: no optimizer states or training leftovers, and no *.bin weights beside
    safetensors ones."""
    import fnmatch

    names = {relative(f, uri): f for f in files}
    has_safetensors = any(n.endswith(".safetensors") for n in names)
    keep = []
    for name, remote in names.items():
        base = name.rsplit("/", 1)[-1]
        if any(fnmatch.fnmatch(base, p) for p in NEVER_MODEL_FILES):
            continue
        if has_safetensors and base.endswith((".bin", ".pt")):
            continue
        keep.append(remote)
    return keep


CONFIG_FILES = ("*.json", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py")


def staged_path(uri: str, cache: Path, configs_only: bool = False) -> Path:
    """Where a model from `uri` is kept on this node (the cache survives attempts on a claim or cacheDir)."""
    # The store counts: one bucket name on two endpoints is two models, never one copy both reconcile in turn.
    where = json.dumps([_SETTINGS[0].endpoint_url or "", uri.rstrip("/")])
    digest = hashlib.sha256(where.encode()).hexdigest()[:16]
    return cache / "models" / (f"{digest}-configs" if configs_only else digest)


def stage_model(uri: str, cache: Path | None = None, field: str = "spec.model.name", configs_only: bool = False
                ) -> Path:
    """The model (or adapter, tokenizer) at `uri` in the node's cache: every process of the node calls this; a file
    lock lets one download while the others wait. What an earlier attempt (or another job, in a shared cacheDir) left
    there is checked against the store, not trusted: the listing is read again, weights whose size and ETag still
    match are kept, and everything else is fetched again (see `refresh`). Once per process: the files other
    processes already read are replaced atomically, never removed."""
    dest = staged_path(uri, cache or _CACHE[0], configs_only)
    if str(dest) in _STAGED:
        return dest
    import fcntl

    real_directory(dest)
    directory = pinned_directory(dest)
    # Everything below works in the directory opened, whatever its path is made to lead to meanwhile.
    work = Path(f"/proc/self/fd/{directory}") if Path("/proc/self/fd").is_dir() else dest
    try:
        if (work / ".lock").is_symlink():
            (work / ".lock").unlink()
        lock_fd = os.open(work / ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        with os.fdopen(lock_fd, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                files = model_files(listing(uri, CONFIG_FILES if configs_only else MODEL_FILES), uri)
                if not any(relative(f, uri) in ("config.json", "adapter_config.json", "tokenizer_config.json")
                           for f in files):
                    raise ConfigError(f"{field} is {uri}, but it holds no model (no config.json, adapter_config.json "
                                      "or tokenizer_config.json under it); point it at the directory save_pretrained "
                                      "wrote")
                refresh(work, {relative(f, uri) for f in files})
                with_retries(lambda: download(files, uri, work), attempts=5)
            except (ConfigError, StorageRefused):
                raise
            except Exception as exc:  # s3fs and botocore raise many types
                raise failure(exc, uri, ConfigError) from exc
    finally:
        os.close(directory)
    _STAGED.add(str(dest))
    return dest


def real_directory(dest: Path) -> None:
    """`dest` and the cache's models/ above it as directories of their own: a link planted in a shared cache (to
    the job's output, say) would have had `refresh` clear and fill wherever it points."""
    for path in (dest.parent, dest):
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
    if os.path.realpath(dest) != os.path.join(os.path.realpath(dest.parent.parent), "models", dest.name):
        raise ConfigError(f"the model cache {dest} leads elsewhere ({os.path.realpath(dest)}); a cache someone else "
                          "can write (data.cacheDir) is not one to share with them")


def pinned_directory(dest: Path) -> int:
    """`dest`, opened as the directory it is (neither it nor models/ above it followed as a link)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        parent = os.open(dest.parent, flags)
        try:
            return os.open(dest.name, flags, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as exc:
        raise ConfigError(f"the model cache {dest} was replaced by a link while it was staged ({exc}); a cache "
                          "someone else can write (data.cacheDir) is not one to share with them") from exc


# What a cached copy never keeps from an earlier attempt: what decides which code runs and how the weights are read
# (configs, tokenizer files, remote code). Small, so fetched again every time; the weights are kept by size and ETag.
ALWAYS_FETCHED = CONFIG_FILES
STAGING_FILES = (".lock", ".s3-manifest.json")


def refresh(dest: Path, wanted: set[str]) -> None:
    """Before a staged copy is used: remove every file and link the store does not list (a planted module, a stale
    shard, a half-written .part) and every link, and forget the ETags of the files always fetched again, so that
    `download` replaces them. A listed file is replaced by `download`, never removed: another process may be
    reading it."""
    import fnmatch

    manifest_path = dest / ".s3-manifest.json"
    manifest = read_manifest(manifest_path)
    for root, dirs, names in os.walk(dest, topdown=False, followlinks=False):
        for entry in [*names, *dirs]:
            path = Path(root) / entry
            name = path.relative_to(dest).as_posix()
            if name in STAGING_FILES and not path.is_symlink():
                continue
            if path.is_symlink() or (name not in wanted and not path.is_dir()):
                path.unlink()
                manifest.pop(name, None)
            elif path.is_dir():
                with contextlib.suppress(OSError):  # empty: a planted one, or the stores' layout changed
                    path.rmdir()
            elif any(fnmatch.fnmatch(path.name, p) for p in ALWAYS_FETCHED):
                manifest.pop(name, None)
    write_manifest(manifest_path, {k: v for k, v in manifest.items() if k in wanted})


def local_source(name: str | None, field: str = "spec.model.name", configs_only: bool = False) -> str | None:
    """A model, tokenizer or adapter name as from_pretrained should read it: an s3:// URI becomes its staged copy
    on this node (`configs_only`: configs and tokenizer files, for the preflight); a path that names no directory
    here is a ConfigError saying so (the Hub client would call it a malformed repository id)."""
    if name is None:
        return None
    if is_s3(name):
        return str(stage_model(name, field=field, configs_only=configs_only))
    if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().exists():
        raise ConfigError(f"{field} is {name}, a path, but no such file or directory exists here; mount the volume "
                          "that holds it (spec.pod.volumes), fix the path, or give a Hub id (org/name) or an s3:// URI")
    return name
