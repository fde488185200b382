#!/usr/bin/env bash
# Builds the real components the tests run beside the control plane, from their Go modules, into per-version
# caches outside the work tree; skips what is present. Prints one "name=directory" line per component.
#   minio: an S3-compatible server (the object storage tests: data, models and checkpoints in buckets)
#   kueue: Kueue's manager, with its CRDs copied from the same module (the Kueue tests)
#   promql: promql-eval (hack/promql), Prometheus' PromQL engine over a test's scrapes (the dashboard test)
# Linked without symbol tables and DWARF (-s -w: a faster link; nothing here is debugged). Cold: ~5-10 min each for
# MinIO and Kueue, ~1 min for promql-eval on 2 cores; warm: instant. Kueue 0.17 needs Kubernetes 1.35's libraries
# (Kubeflow Trainer's API types do not compile against 1.36's), so it cannot join the control plane's module.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
# No DWARF from the compiler: the links strip it anyway (-s -w), and not generating it is ~11% less compile CPU,
# the cold set-up's critical path (measured on k8s.io/api and apimachinery).
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -gcflags=all=-dwarf=false"

minio="$cache/minio-${MINIO_VERSION}"
if [[ ! -x "$minio/minio" ]]; then
  echo "building minio ${MINIO_VERSION} into $minio" >&2
  mkdir -p "$minio"
  GOBIN="$minio.tmp" go install -trimpath -ldflags "-s -w" "github.com/minio/minio@${MINIO_VERSION}"
  mv "$minio.tmp/minio" "$minio/minio" && rmdir "$minio.tmp"
fi

# `go install ...@version` asks the proxy for Kueue's version list, which it refuses: a wrapper module
# (hack/kueue) requires the release instead; its go.sum is part of the cache key.
key="$(cat "$here/kueue/go.mod" "$here/kueue/go.sum" | sha256sum | cut -c1-12)"
kueue="$cache/kueue-v${KUEUE_VERSION}-${key}"
if [[ ! -x "$kueue/kueue" || ! -d "$kueue/crds" || ! -f "$kueue/webhooks.yaml" ]]; then
  echo "building kueue v${KUEUE_VERSION} into $kueue" >&2
  mkdir -p "$kueue.tmp"
  export GONOSUMDB="sigs.k8s.io/kueue${GONOSUMDB:+,$GONOSUMDB}"
  (cd "$here/kueue" && go build -trimpath -o "$kueue.tmp/kueue" \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v${KUEUE_VERSION}" sigs.k8s.io/kueue/cmd/kueue)
  src="$(go env GOMODCACHE)/sigs.k8s.io/kueue@v${KUEUE_VERSION}/config/components/crd/bases"
  mkdir -p "$kueue" && rm -rf "$kueue/crds.tmp" && mkdir -p "$kueue/crds.tmp"
  cp "$src"/*.yaml "$kueue/crds.tmp/" && chmod -R u+w "$kueue/crds.tmp"
  # Its webhook configurations, which the tests register with a 127.0.0.1 URL and their own CA bundle.
  cp "$src/../../webhook/manifests.yaml" "$kueue/webhooks.yaml.tmp" && chmod u+w "$kueue/webhooks.yaml.tmp"
  mv "$kueue/webhooks.yaml.tmp" "$kueue/webhooks.yaml"
  mkdir -p "$kueue" && mv "$kueue.tmp/kueue" "$kueue/kueue" && rmdir "$kueue.tmp"
  rm -rf "$kueue/crds" && mv "$kueue/crds.tmp" "$kueue/crds"
fi
# The source is ours (hack/promql): its files are the cache key.
key="$(cat "$here/promql/go.mod" "$here/promql/go.sum" "$here/promql/"*.go | sha256sum | cut -c1-12)"
promql="$cache/promql-eval-${key}"
if [[ ! -x "$promql/promql-eval" ]]; then
  echo "building promql-eval (Prometheus $(sed -n 's#^require github.com/prometheus/prometheus ##p' \
    "$here/promql/go.mod")) into $promql" >&2
  mkdir -p "$promql.tmp"
  (cd "$here/promql" && go build -trimpath -ldflags "-s -w" -o "$promql.tmp/promql-eval" .)
  mkdir -p "$promql" && mv "$promql.tmp/promql-eval" "$promql/promql-eval" && rmdir "$promql.tmp"
fi
echo "minio=$minio"
echo "kueue=$kueue"
echo "promql=$promql"
