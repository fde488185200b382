"""s3:// models staged into a cache that outlives the pod (a shared data.cacheDir, `finetune run`'s output): what an
earlier attempt or anyone else who can write that cache left there is checked against the store, never trusted. Real
MinIO; the copies are planted as a writer of the cache would plant them."""

import json
import os

import pytest

from finetune_trainer import model_staging, objectstore

PLANTS = {
    "evil.py": "import os; os.system('id > /tmp/pwned')\n",
    "sub/evil.py": "raise SystemExit('planted')\n",
    "model-00002-of-00002.safetensors": "a shard the store does not list",
    ".model.safetensors.part": "half a download",
}


def planted_copy(dest, store_files):
    """What a hostile writer leaves: modules, a config that maps the model to them, a manifest that vouches for it,
    a completion marker, and a lock linked to a file of someone else's."""
    dest.mkdir(parents=True)
    for name, text in PLANTS.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    config = json.loads(store_files["config.json"])
    config["auto_map"] = {"AutoModelForCausalLM": "evil.M"}
    (dest / "config.json").write_text(json.dumps(config))
    (dest / ".complete").write_text("")
    (dest / ".s3-manifest.json").write_text(json.dumps({"config.json": "vouched", "evil.py": "vouched"}))
    victim = dest.parent.parent.parent / "victim.txt"
    victim.write_text("someone else's file")
    (dest / ".lock").symlink_to(victim)
    (dest / "tokenizer.json").unlink(missing_ok=True)
    (dest / "tokenizer.json").symlink_to(victim)
    return victim


def store_files(minio, uri):
    fs = minio.filesystem()
    return {name: fs.cat_file(f"{uri}/{name}").decode(errors="replace") for name in ("config.json",)}


def tree(dest):
    return {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if not p.name.startswith(".")}


@pytest.mark.parametrize("configs_only", [False, True], ids=["model", "configs-only"])
@pytest.mark.parametrize("earlier", ["none", "planted", "planted-after-a-real-copy"])
def test_a_staged_copy_holds_what_the_store_lists_and_nothing_planted(minio, uploaded, tmp_path, configs_only,
                                                                      earlier):
    uri = f"{uploaded}/models/tiny"
    cache = tmp_path / "shared-cache"
    dest = model_staging.staged_path(uri, cache, configs_only)
    victim = None
    if earlier == "planted-after-a-real-copy":
        model_staging.stage_model(uri, cache, configs_only=configs_only)
        for name in ("config.json", "tokenizer.json"):
            (dest / name).unlink()
        dest.rename(tmp_path / "moved")
    if earlier != "none":
        victim = planted_copy(dest, store_files(minio, uri))
        if earlier == "planted-after-a-real-copy":  # the real weights stay beside the plants
            for p in (tmp_path / "moved").glob("*.safetensors"):
                os.replace(p, dest / p.name)

    objectstore.configure(objectstore.settings())  # a process of the next attempt
    staged = model_staging.stage_model(uri, cache, configs_only=configs_only)

    assert staged == dest
    listed = {objectstore.relative(f, uri): f for f in model_staging.model_files(
        objectstore.listing(uri, model_staging.CONFIG_FILES if configs_only else model_staging.MODEL_FILES), uri)}
    here = tree(dest)
    assert set(here) == set(listed), sorted(set(here) ^ set(listed))
    fs = minio.filesystem()
    for name, path in here.items():
        assert not path.is_symlink(), name
        assert path.read_bytes() == fs.cat_file(listed[name].uri), name
    assert not (dest / ".lock").is_symlink()
    if victim is not None:
        assert victim.read_text() == "someone else's file"  # never written through a planted link


def test_a_model_replaced_in_the_store_is_staged_again_and_unchanged_weights_are_kept(minio, uploaded, tmp_path):
    uri = f"{uploaded}/models/tiny"
    cache = tmp_path / "shared-cache"
    dest = model_staging.stage_model(uri, cache)
    weights = next(dest.glob("*.safetensors"))
    kept = weights.stat().st_ino, weights.stat().st_mtime_ns
    objectstore.configure(objectstore.settings())  # another process (this one reconciles a copy once)
    again = model_staging.stage_model(uri, cache)  # nothing changed: the weights are not downloaded again
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == kept and again == dest

    fs = minio.filesystem()
    config = json.loads(fs.cat_file(f"{uri}/config.json"))
    config["finetune_test_revision"] = 2  # the same URI, a new model: a stale copy would be a silently wrong model
    fs.pipe_file(f"{uri}/config.json", json.dumps(config).encode())
    new_weights = weights.read_bytes()[::-1]
    fs.pipe_file(f"{uri}/{weights.name}", new_weights)
    objectstore.configure(objectstore.settings())
    model_staging.stage_model(uri, cache)
    assert json.loads((dest / "config.json").read_text())["finetune_test_revision"] == 2
    assert weights.read_bytes() == new_weights


def test_a_process_that_stages_again_never_takes_a_file_from_one_reading_the_copy(minio, uploaded, tmp_path):
    """Every rank of a node stages the same model, and one may already be loading it: the configs fetched again
    replace the old ones atomically, so a reader never finds one missing (a review saw config.json gone for 0.4 s)."""
    import threading

    uri = f"{uploaded}/models/tiny"
    cache = tmp_path / "cache"
    dest = model_staging.stage_model(uri, cache)
    readable = [p for p in tree(dest).values() if p.is_file()]
    missing, stop = [], threading.Event()

    def read_all():
        while not stop.is_set():
            missing.extend(p.name for p in readable if not p.exists())

    reader = threading.Thread(target=read_all)
    reader.start()
    try:
        for _ in range(3):
            objectstore.configure(objectstore.settings())  # another rank's process
            model_staging.stage_model(uri, cache)
    finally:
        stop.set()
        reader.join()
    assert not missing, sorted(set(missing))


@pytest.mark.parametrize("where", ["the copy", "the cache's models/"])
def test_a_link_planted_for_the_copy_never_lets_staging_clear_what_it_points_to(minio, uploaded, tmp_path, where):
    """A writer of a shared cache links the copy's directory to the job's output: staging would have removed the
    checkpoints there as files the store does not list."""
    uri = f"{uploaded}/models/tiny"
    cache = tmp_path / "shared-cache"
    dest = model_staging.staged_path(uri, cache)
    victim = tmp_path / "output"
    (victim / "checkpoint-100").mkdir(parents=True)
    (victim / "checkpoint-100" / "model.safetensors").write_text("weights of a run")
    (victim / "status.json").write_text("{}")
    link = dest if where == "the copy" else dest.parent
    link.parent.mkdir(parents=True)
    link.symlink_to(victim, target_is_directory=True)
    staged = model_staging.stage_model(uri, cache)
    assert not staged.is_symlink() and not staged.parent.is_symlink() and (staged / "config.json").is_file()
    assert sorted(p.relative_to(victim).as_posix() for p in victim.rglob("*")) == [
        "checkpoint-100", "checkpoint-100/model.safetensors", "status.json"]


@pytest.mark.parametrize("manifest", ["{\"config.json\": \"abc", "[1, 2]", "{\"config.json\": 3}"])
def test_a_torn_or_foreign_manifest_is_no_manifest(minio, uploaded, tmp_path, manifest):
    uri = f"{uploaded}/models/tiny"
    cache = tmp_path / "cache"
    dest = model_staging.stage_model(uri, cache)
    (dest / ".s3-manifest.json").write_text(manifest)
    objectstore.configure(objectstore.settings())
    assert model_staging.stage_model(uri, cache) == dest
    assert json.loads((dest / ".s3-manifest.json").read_text()).keys() == tree(dest).keys() - {"sub"}


def test_a_copy_swapped_for_a_link_while_the_store_is_listed_clears_nothing_it_leads_to(minio, uploaded, tmp_path,
                                                                                          monkeypatch):
    """Another tenant of a shared cache swaps the copy's directory for a link to the job's output while staging
    waits on the store (or the lock): the work goes on in the directory opened, never through the link."""
    uri = f"{uploaded}/models/tiny"
    cache = tmp_path / "shared-cache"
    victim = tmp_path / "output"
    (victim / "checkpoint-100").mkdir(parents=True)
    (victim / "checkpoint-100" / "model.safetensors").write_text("weights of a run")
    dest = model_staging.staged_path(uri, cache)
    real_listing = objectstore.listing

    def listing_while_swapped(*args, **kwargs):
        if not dest.is_symlink():
            os.rename(dest, dest.with_name("moved-away"))
            dest.symlink_to(victim, target_is_directory=True)
        return real_listing(*args, **kwargs)

    monkeypatch.setattr(objectstore, "listing", listing_while_swapped)
    model_staging.stage_model(uri, cache)
    assert sorted(p.relative_to(victim).as_posix() for p in victim.rglob("*")) == [
        "checkpoint-100", "checkpoint-100/model.safetensors"]
    assert (dest.with_name("moved-away") / "config.json").is_file()  # staged where it was opened


def test_a_download_that_fails_midway_leaves_no_part_behind(minio, uploaded, tmp_path, monkeypatch):
    uri = f"{uploaded}/models/tiny"
    cache = tmp_path / "cache"
    real = objectstore.filesystem()
    failures = []

    class DropsTheFirstWeights:  # the real client, whose first weights download breaks off halfway
        def __getattr__(self, name):
            return getattr(real, name)

        def get_file(self, rpath, lpath):
            if rpath.endswith(".safetensors") and not failures:
                failures.append(rpath)
                with open(lpath, "wb") as f:
                    f.write(b"half")
                raise ConnectionError("connection reset by peer")
            return real.get_file(rpath, lpath)

    monkeypatch.setattr(objectstore, "filesystem", lambda: DropsTheFirstWeights())
    monkeypatch.setattr(objectstore.time, "sleep", lambda seconds: None)
    dest = model_staging.stage_model(uri, cache)
    assert failures and not [p.name for p in dest.rglob("*.part")]
    assert (dest / "model.safetensors").read_bytes() == real.cat_file(f"{uri}/model.safetensors")
