#!/usr/bin/env bash
# Sets everything up (Python venv, Kubernetes control-plane binaries, MinIO and Kueue's manager from their Go modules,
# our two images built with podman; all cached)
# and runs the whole test suite: unit tests, cluster tests against a real etcd + kube-apiserver +
# controller-manager + scheduler + kwok, the images' checks, and the e2e with the images run as containers.
# Extra arguments go to pytest, e.g. ./hack/test.sh -m unit
set -euo pipefail
cd "$(dirname "$0")/.."
# The Go builds (control plane, then MinIO and Kueue's manager, which share its build cache) run while pip installs.
mkdir -p "${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
go_log="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}/go-builds.log"
(bash hack/build-controlplane.sh && bash hack/build-components.sh) >"$go_log" 2>&1 &
go_builds=$!
venv="$(bash hack/setup-python.sh | tail -n 1)"
wait "$go_builds" || { tail -n 40 "$go_log" >&2; echo "the Go builds failed (log: $go_log)" >&2; exit 1; }
# Our images (cold: ~12 min, podman installed and torch's GBs in a layer; cached: ~1.5 min), named for the tests.
FINETUNE_IMAGES="$(bash hack/build-images.sh | tr '\n' ' ')"
export FINETUNE_IMAGES
exec "$venv/bin/python" -m pytest -m "not gpu" --durations=30 "$@"  # the slowest tests: where the budget goes
