#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kube-scheduler from Go modules (wrapper module in
# hack/controlplane) and installs kwok and helm, into a per-version cache outside the work tree. Skips what is present.
# Prints the cache directory on its last line. Cold: ~20-40 min on 2 cores; warm: instant.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
# The go.sum hash is part of the key so a changed wrapper module rebuilds instead of reusing stale binaries.
key="$(cat "$here/controlplane/go.sum" "$here/controlplane/go.mod" | sha256sum | cut -c1-12)"
dest="$cache/k8s-v${K8S_VERSION}-${key}"
bins=(etcd kube-apiserver kube-controller-manager kube-scheduler)
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

missing=()
for b in "${bins[@]}"; do [[ -x "$dest/$b" ]] || missing+=("$b"); done
if ((${#missing[@]})); then
  echo "building ${missing[*]} (kubernetes v${K8S_VERSION}) into $dest; a cold build takes 20-40 minutes" >&2
  minor="${K8S_VERSION#1.}"; minor="${minor%%.*}"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v${K8S_VERSION}"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
  tmp="$(mktemp -d "$cache/.build.XXXXXX" 2>/dev/null || { mkdir -p "$cache"; mktemp -d "$cache/.build.XXXXXX"; })"
  pkgs=(); for b in "${missing[@]}"; do pkgs+=("./cmd/$b"); done
  # One binary at a time: each link needs ~2 GiB and the compile cache is shared anyway.
  for p in "${pkgs[@]}"; do
    (cd "$here/controlplane" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" "$p")
  done
  mkdir -p "$dest"
  for b in "${missing[@]}"; do mv "$tmp/$b" "$dest/$b"; done
  rmdir "$tmp"
fi

if [[ ! -x "$dest/kwok" || ! -d "$dest/kwok-stages" ]]; then
  echo "installing kwok v${KWOK_VERSION} into $dest" >&2
  GOBIN="$dest" go install "sigs.k8s.io/kwok/cmd/kwok@v${KWOK_VERSION}"
  src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@v${KWOK_VERSION}/kustomize/stage"
  rm -rf "$dest/kwok-stages.tmp" && mkdir -p "$dest/kwok-stages.tmp"
  cp -r "$src"/. "$dest/kwok-stages.tmp/" && chmod -R u+w "$dest/kwok-stages.tmp"
  mv "$dest/kwok-stages.tmp" "$dest/kwok-stages"
fi
if [[ ! -x "$dest/helm" ]]; then
  echo "installing helm v${HELM_VERSION} into $dest" >&2
  GOBIN="$dest" go install -ldflags "-X helm.sh/helm/v3/internal/version.version=v${HELM_VERSION}" \
    "helm.sh/helm/v3/cmd/helm@v${HELM_VERSION}"
fi
echo "$dest"
