"""s3:// models, adapters and tokenizers staged into the node's cache for from_pretrained: only the files a model
needs, fetched once per node under a file lock, and a copy an earlier attempt (or anyone who can write a shared
cacheDir) left there checked against the store's listing, never trusted (`refresh`)."""

import contextlib
import hashlib
import json
import os
from pathlib import Path

from finetune_operator.api.storage import is_s3
from finetune_trainer import objectstore
from finetune_trainer.errors import ConfigError, StorageRefused

# What from_pretrained reads: configs, tokenizer files, weights (safetensors when there are any), an adapter's.
MODEL_FILES = ("*.json", "*.safetensors", "*.model", "*.tiktoken", "tokenizer*", "*.txt", "*.jinja", "*.py",
               "*.bin", "*.pt")
NEVER_MODEL_FILES = ("optimizer*", "scheduler*", "rng_state*", "trainer_state.json", "training_args.bin")


def model_files(files: list[objectstore.RemoteFile], uri: str) -> list[objectstore.RemoteFile]:
    """Only the files a model needs: no optimizer states or training leftovers, and no *.bin weights beside
    safetensors ones."""
    import fnmatch

    names = {objectstore.relative(f, uri): f for f in files}
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
    where = json.dumps([objectstore.settings().endpoint_url or "", uri.rstrip("/")])
    digest = hashlib.sha256(where.encode()).hexdigest()[:16]
    return cache / "models" / (f"{digest}-configs" if configs_only else digest)


def stage_model(uri: str, cache: Path | None = None, field: str = "spec.model.name", configs_only: bool = False
                ) -> Path:
    """The model (or adapter, tokenizer) at `uri` in the node's cache: every process of the node calls this; a file
    lock lets one download while the others wait. What an earlier attempt (or another job, in a shared cacheDir) left
    there is checked against the store, not trusted: the listing is read again, weights whose size and ETag still
    match are kept, and everything else is fetched again (see `refresh`). Once per process: the files other
    processes already read are replaced atomically, never removed."""
    dest = staged_path(uri, cache or objectstore.model_cache(), configs_only)
    if str(dest) in objectstore.staged_copies():
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
                files = model_files(objectstore.listing(uri, CONFIG_FILES if configs_only else MODEL_FILES), uri)
                names = {objectstore.relative(f, uri) for f in files}
                if not names & {"config.json", "adapter_config.json", "tokenizer_config.json"}:
                    raise ConfigError(f"{field} is {uri}, but it holds no model (no config.json, adapter_config.json "
                                      "or tokenizer_config.json under it); point it at the directory save_pretrained "
                                      "wrote")
                refresh(work, names)
                objectstore.with_retries(lambda: objectstore.download(files, uri, work), attempts=5)
            except (ConfigError, StorageRefused):
                raise
            except Exception as exc:  # s3fs and botocore raise many types
                raise objectstore.failure(exc, uri, ConfigError) from exc
    finally:
        os.close(directory)
    objectstore.staged_copies().add(str(dest))
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
    manifest = objectstore.read_manifest(manifest_path)
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
    objectstore.write_manifest(manifest_path, {k: v for k, v in manifest.items() if k in wanted})


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
