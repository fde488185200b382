#!/usr/bin/env bash
# Sets everything up (Python venv, Kubernetes control-plane binaries, our two images built with podman; all cached)
# and runs the whole test suite: unit tests, cluster tests against a real etcd + kube-apiserver +
# controller-manager + scheduler + kwok, the images' checks, and the e2e with the images run as containers.
# Extra arguments go to pytest, e.g. ./hack/test.sh -m unit
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash hack/setup-python.sh | tail -n 1)"
bash hack/build-controlplane.sh >/dev/null
# Our images (cold: ~12 min, podman installed and torch's GBs in a layer; cached: ~1.5 min), named for the tests.
FINETUNE_IMAGES="$(bash hack/build-images.sh | tr '\n' ' ')"
export FINETUNE_IMAGES
exec "$venv/bin/python" -m pytest -m "not gpu" "$@"
