#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and helm from Go modules (one wrapper
# module, hack/controlplane: kwok and helm are its tools, on the same Kubernetes libraries) into a per-version cache
# outside the work tree, with kwok's stage files. Skips what is present. Prints the cache directory on its last line.
# Cold: ~15-30 min on 2 cores; warm: instant.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
# The go.sum hash is part of the key so a changed wrapper module rebuilds instead of reusing stale binaries.
key="$(cat "$here/controlplane/go.sum" "$here/controlplane/go.mod" | sha256sum | cut -c1-12)"
dest="$cache/k8s-v${K8S_VERSION}-${key}"
bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok helm)
# No DWARF from the compiler: the links strip it anyway (-s -w), and not generating it is ~11% less compile CPU,
# the cold set-up's critical path (measured on k8s.io/api and apimachinery).
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -gcflags=all=-dwarf=false"
package_of() {
  case "$1" in
    kwok) echo sigs.k8s.io/kwok/cmd/kwok ;;
    helm) echo helm.sh/helm/v3/cmd/helm ;;
    *) echo "./cmd/$1" ;;
  esac
}
ldflags_of() {  # k8s_ldflags: set below, before the first build
  case "$1" in
    kwok) echo "-s -w" ;;
    helm) echo "-s -w -X helm.sh/helm/v3/internal/version.version=v${HELM_VERSION}" ;;
    *) echo "$k8s_ldflags" ;;
  esac
}

missing=()
for b in "${bins[@]}"; do [[ -x "$dest/$b" ]] || missing+=("$b"); done
[[ -d "$dest/kwok-stages" ]] || missing+=(kwok-stages)
if ((${#missing[@]})); then
  echo "building ${missing[*]} (kubernetes v${K8S_VERSION}, kwok v${KWOK_VERSION}, helm v${HELM_VERSION}) into $dest;" \
    "a cold build takes 15-30 minutes" >&2
  minor="${K8S_VERSION#1.}"; minor="${minor%%.*}"
  k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v${K8S_VERSION}"
  k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
  tmp="$(mktemp -d "$cache/.build.XXXXXX" 2>/dev/null || { mkdir -p "$cache"; mktemp -d "$cache/.build.XXXXXX"; })"
  # One binary at a time: each link needs ~2 GiB, and the compile cache is shared anyway (one module: kwok and helm
  # reuse the control plane's compiled Kubernetes libraries).
  for b in "${missing[@]}"; do
    case "$b" in
      kwok-stages)
        src="$(cd "$here/controlplane" && go mod download -json sigs.k8s.io/kwok \
               | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/kustomize/stage"
        cp -r "$src" "$tmp/kwok-stages" && chmod -R u+w "$tmp/kwok-stages" ;;
      *) (cd "$here/controlplane" && go build -trimpath -ldflags "$(ldflags_of "$b")" -o "$tmp/$b" "$(package_of "$b")") ;;
    esac
  done
  mkdir -p "$dest"
  for b in "${missing[@]}"; do rm -rf "${dest:?}/$b" && mv "$tmp/$b" "$dest/$b"; done
  rmdir "$tmp"
fi
echo "$dest"
