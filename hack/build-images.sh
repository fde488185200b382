#!/usr/bin/env bash
# Builds the operator image (Dockerfile) and the trainer image (trainer_image/Dockerfile, on its virtualenv's image
# localhost/finetunejob-trainer-deps, the Dockerfile's `deps` stage) with podman, and prints the operator's and the
# trainer's names, one per line. No Docker engine and no registry needed; with Docker, see
# docs/operations/install.md#the-images.
#   TRAINER_VARIANT=cpu|cuda (default cpu: what the tests and kind run; cuda prebuilds DeepSpeed's CUDA ops)
#   BASE_IMAGE (default python:3.11-slim-bookworm): pulled when a registry answers; otherwise a stand-in with the
#   same Python, built from Debian's packages (debootstrap) and cached, is used instead.
# Installs podman, buildah, runc and debootstrap from Debian's packages when missing (as root). Layers, the base and
# pip's downloads are cached under $FINETUNE_CACHE (default ~/.cache/finetunejob): a second build takes seconds.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
variant="${TRAINER_VARIANT:-cpu}"
base="${BASE_IMAGE:-python:3.11-slim-bookworm}"
podman=("$root/hack/podman.sh")
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")"
operator_image="localhost/finetunejob-operator:$version"
trainer_image="localhost/finetunejob-trainer:$version-$variant"
log() { echo "[build-images $(date +%T)] $*" >&2; }

if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
  log "installing podman, buildah, runc, debootstrap (Debian packages)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah runc debootstrap uidmap >&2
fi

# The base: the real one if it is here or can be pulled, else the stand-in (Debian bookworm's python3 is 3.11, as
# in python:3.11-slim-bookworm). Only the stand-in gets the `python` name and pip's permission to install.
if ! "${podman[@]}" image exists "$base" && ! timeout 120 "${podman[@]}" pull -q "$base" >/dev/null 2>&1; then
  standin="localhost/python-standin:3.11-bookworm"
  if ! "${podman[@]}" image exists "$standin"; then
    tarball="$cache/base/debian-bookworm-python3.11.tar"
    if [[ ! -f "$tarball" ]]; then
      log "no registry answers for $base: building a stand-in from Debian's packages (debootstrap, ~90 s)"
      mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)"
      rootfs="$(mktemp -d)"
      debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
        bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >&2
      ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
      rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
      rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
      mkdir -p "$cache/base"
      tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
      rm -rf "$rootfs"
    fi
    "${podman[@]}" import -q --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$standin" >/dev/null
  fi
  log "base $base is not reachable; using the stand-in $standin"
  base="$standin"
fi

# RUN steps reach PyPI through this machine's TLS-inspecting proxy when there is one: its CA is mounted for the
# build only, never copied into an image.
build=("${podman[@]}" build --network host --layers --build-arg "BASE=$base")
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  build+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi
# A rebuilt tag leaves the previous image untagged (GBs for the trainer): remove it, never the build cache.
replace() {
  local old
  old="$("${podman[@]}" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true)"
  shift
  "$@"
  if [[ -n "$old" ]] && ! "${podman[@]}" image inspect --format '{{.RepoTags}}' "$old" 2>/dev/null | grep -q /; then
    "${podman[@]}" rmi "$old" >/dev/null 2>&1 || true
  fi
}
# Every step of a build, cached or new, is an untagged image; a relock or an edited step leaves the old chain behind
# (GBs for the trainer). Each image's build records the ids its steps used; untagged images no record names are
# superseded and removed after the builds, newest first (a parent goes once its children have).
ids_dir="$cache/build-cache-ids"
mkdir -p "$ids_dir"
ids_file() { echo "$ids_dir/${1//[\/:]/_}.ids"; }
built() {  # IMAGE BUILD-ARGS...: build IMAGE and record the step images it used
  local image="$1" out
  shift
  out="$(mktemp)"
  replace "$image" "${build[@]}" -t "$image" "$@" 2>&1 | tee "$out" >&2
  sed -n 's/^--> \(Using cache \)\{0,1\}\([0-9a-f]\{11,64\}\)$/\2/p' "$out" | cut -c1-11 | sort -u \
    >"$(ids_file "$image")"
  rm -f "$out"
}
prune_superseded() {  # IMAGES...: the images just built, whose records must exist for anything to go
  local pass id removed freed=0 image keep
  for image in "$@"; do
    if [[ ! -s "$(ids_file "$image")" ]]; then
      log "no step ids read from the build of $image (podman's output changed?): nothing pruned"
      return 0
    fi
  done
  keep="$(cat "$ids_dir"/*.ids)"
  for pass in 1 2 3 4 5 6 7 8; do
    removed=0
    while read -r id repo; do
      [[ "$repo" == "<none>" ]] || continue
      grep -qx "${id:0:11}" <<<"$keep" && continue
      "${podman[@]}" rmi "$id" >/dev/null 2>&1 && removed=$((removed + 1))
    done < <("${podman[@]}" images -a --no-trunc --format '{{.ID}} {{.Repository}}' | sed 's/^sha256://')
    freed=$((freed + removed))
    [[ $removed -gt 0 ]] || break
  done
  [[ $freed -eq 0 ]] || log "removed $freed superseded build-cache image(s)"
}
# Every layer cached still costs a warm build ~90 s: podman hashes the GBs of the virtualenv to find the cached
# `COPY --from=build /opt/venv`. An image is labelled with the digest of everything its build reads (the files the
# ignore file lets into the context that it uses, the Dockerfile, this script, the base's id, the build args); when
# the tagged image carries the same digest, nothing it could be built from has changed and the build is skipped.
# The trainer's virtualenv is an image of its own (the Dockerfile's `deps` stage, read from the locks only), so a
# source edit rebuilds only our wheel's layers on top of it.
inputs_label="dev.finetunejob.build-inputs"
inputs_digest() {  # DOCKERFILE "PATHS" BUILD-ARGS...: the digest of what a build of it reads
  local dockerfile="$1" paths="$2" base_id
  shift 2
  base_id="$("${podman[@]}" image inspect --format '{{.Id}}' "$base")"
  {
    printf '%s\n' "$base_id" "$@"
    # shellcheck disable=SC2086  # PATHS is a list of the repository's own paths, split on purpose
    (cd "$root" && find $paths -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
       | xargs -0 sha256sum)
    sha256sum "$dockerfile" "$root/.dockerignore" "$root/hack/build-images.sh" | sed "s#$root/##"
  } | sha256sum | cut -d' ' -f1
}
build_unless_current() {  # IMAGE DOCKERFILE "PATHS" BUILD-ARGS...
  local image="$1" dockerfile="$2" paths="$3" digest start=$SECONDS
  shift 3
  digest="$(inputs_digest "$dockerfile" "$paths" "$@")"
  if [[ "$("${podman[@]}" image inspect --format "{{index .Labels \"$inputs_label\"}}" "$image" 2>/dev/null)" \
        == "$digest" ]]; then
    log "image $image is current (inputs $digest): not rebuilt"
    return 0
  fi
  built "$image" --label "$inputs_label=$digest" "$@" -f "$dockerfile" "$root"
  label_if_cached "$image" "$digest"
  log "image $image built in $((SECONDS - start)) s"
}
# A --target build whose steps were all cached tags the cached image as it was, without this build's --label
# (buildah 1.28): the next call would find an old digest and build again (~140 s of hashing for the trainer's
# deps, at every call). A LABEL step on top says the inputs instead: metadata only, no layer to hash.
label_if_cached() {  # IMAGE DIGEST
  local image="$1" digest="$2" dir
  [[ "$("${podman[@]}" image inspect --format "{{index .Labels \"$inputs_label\"}}" "$image")" == "$digest" ]] \
    && return 0
  dir="$(mktemp -d)"
  printf 'FROM %s\nLABEL %s="%s"\n' "$image" "$inputs_label" "$digest" >"$dir/Containerfile"
  "${podman[@]}" build --layers -q -t "$image" "$dir" >/dev/null
  rm -rf "$dir"
}
sources="pyproject.toml README.md requirements operator trainer_image"
deps_image="localhost/finetunejob-trainer-deps:$version-$variant"
build_unless_current "$operator_image" "$root/Dockerfile" "$sources"
# The deps stage reads only the trainer's three locks of requirements/ (and the Dockerfile, the base, VARIANT).
build_unless_current "$deps_image" "$root/trainer_image/Dockerfile" \
  "requirements/trainer.lock requirements/trainer-nobuildisolation.lock requirements/cuda-build.lock" --target deps \
  --build-arg "VARIANT=$variant"
# The deps image's id is a build argument: a rebuilt virtualenv rebuilds the trainer on it.
# VARIANT too: a podman that builds unused stages (before buildah 1.25) would otherwise build `deps` as cuda.
build_unless_current "$trainer_image" "$root/trainer_image/Dockerfile" "$sources" --build-arg "DEPS=$deps_image" \
  --build-arg "VARIANT=$variant" --label "dev.finetunejob.deps=$("${podman[@]}" image inspect --format '{{.Id}}' "$deps_image")"
prune_superseded "$operator_image" "$deps_image" "$trainer_image"
echo "$operator_image"
echo "$trainer_image"
