#!/usr/bin/env bash
# Sets everything up (Python venv, Kubernetes control-plane binaries; both cached) and runs the whole test suite:
# unit tests, and cluster tests against a real etcd + kube-apiserver + controller-manager + scheduler + kwok.
# Extra arguments go to pytest, e.g. ./hack/test.sh -m unit
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash hack/setup-python.sh | tail -n 1)"
bash hack/build-controlplane.sh >/dev/null
exec "$venv/bin/python" -m pytest -m "not gpu" "$@"
