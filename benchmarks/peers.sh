#!/usr/bin/env bash
# The peer the benchmarks compare against, built from its published Go module (like kwok and helm in
# hack/build-controlplane.sh) into a cache outside the work tree; rebuilt when missing. Prints the binary and the
# PyTorchJob CRD it ships, one per line.
set -euo pipefail
version=v1.8.1
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}/peers/training-operator-${version}"
module="github.com/kubeflow/training-operator"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
if [[ ! -x "$cache/training-operator.v1" ]]; then
  echo "building kubeflow training-operator ${version} into $cache (a few minutes)" >&2
  GOBIN="$cache" go install "${module}/cmd/training-operator.v1@${version}"
fi
src="$(go env GOMODCACHE)/${module}@${version}"
[[ -f "$src/go.mod" ]] || go mod download "${module}@${version}"
echo "$cache/training-operator.v1"
echo "$src/manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
