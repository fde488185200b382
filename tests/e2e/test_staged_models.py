"""s3:// models staged into a cache that outlives the pod (a shared data.cacheDir, `finetune run`'s output): what an
earlier attempt or anyone else who can write that cache left there is checked against the store, never trusted. Real
MinIO; the copies are planted as a writer of the cache would plant them."""

import json
import os

import pytest

from finetune_trainer import objectstore

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
    dest = objectstore.staged_path(uri, cache, configs_only)
    victim = None
    if earlier == "planted-after-a-real-copy":
        objectstore.stage_model(uri, cache, configs_only=configs_only)
        for name in ("config.json", "tokenizer.json"):
            (dest / name).unlink()
        dest.rename(tmp_path / "moved")
    if earlier != "none":
        victim = planted_copy(dest, store_files(minio, uri))
        if earlier == "planted-after-a-real-copy":  # the real weights stay beside the plants
            for p in (tmp_path / "moved").glob("*.safetensors"):
                os.replace(p, dest / p.name)

    staged = objectstore.stage_model(uri, cache, configs_only=configs_only)

    assert staged == dest
    listed = {objectstore.relative(f, uri): f for f in objectstore.model_files(
        objectstore.listing(uri, objectstore.CONFIG_FILES if configs_only else objectstore.MODEL_FILES), uri)}
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
    dest = objectstore.stage_model(uri, cache)
    weights = next(dest.glob("*.safetensors"))
    kept = weights.stat().st_ino, weights.stat().st_mtime_ns
    again = objectstore.stage_model(uri, cache)  # nothing changed: the weights are not downloaded again
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == kept and again == dest

    fs = minio.filesystem()
    config = json.loads(fs.cat_file(f"{uri}/config.json"))
    config["finetune_test_revision"] = 2  # the same URI, a new model: a stale copy would be a silently wrong model
    fs.pipe_file(f"{uri}/config.json", json.dumps(config).encode())
    new_weights = weights.read_bytes()[::-1]
    fs.pipe_file(f"{uri}/{weights.name}", new_weights)
    objectstore.stage_model(uri, cache)
    assert json.loads((dest / "config.json").read_text())["finetune_test_revision"] == 2
    assert weights.read_bytes() == new_weights
