#!/usr/bin/env bash
# Sets everything up (Python venv, Kubernetes control-plane binaries, MinIO and Kueue's manager from their Go
# modules, our two images built with podman; all cached) and runs the whole test suite: unit tests, cluster tests
# against a real etcd + kube-apiserver + controller-manager + scheduler + kwok, the images' checks, and the e2e with
# the images run as containers. Extra arguments go to pytest, e.g. ./hack/test.sh -m unit
#   FINETUNE_TEST_WORKERS: pytest-xdist workers (default 4 on 2 cores: with 3 the cores idled while cases waited on
#   pods and timeouts; 0 runs in this process). Each worker starts its own control plane; a test file is the unit of
#   distribution (its operator and namespaces stay together), started in the order of tests/support/ordering.py
#   (from tests/durations.json).
# Prints where the time went at the end: each setup phase, and the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
mkdir -p "$cache"
logs="$(mktemp -d "${TMPDIR:-/tmp}/finetune-test.XXXXXX")"
started=$SECONDS
# The three set-ups are independent and run at once: the Go builds are CPU-bound (control plane, then MinIO and
# Kueue's manager, which share its build cache), pip and the image builds mostly download and unpack.
( s=$SECONDS; bash hack/build-controlplane.sh && bash hack/build-components.sh
  echo "$((SECONDS - s))" >"$logs/go.seconds" ) >"$logs/go.log" 2>&1 &
go_builds=$!
# Our images (cold: ~10 min, podman installed and torch's GBs in a layer; cached: seconds), named for the tests.
( s=$SECONDS; bash hack/build-images.sh >"$logs/images.out"
  echo "$((SECONDS - s))" >"$logs/images.seconds" ) 2>"$logs/images.log" &
images=$!
s=$SECONDS
venv="$(bash hack/setup-python.sh | tail -n 1)"
# DeepSpeed's CPU collective op, compiled once per venv (cold: ~2 min, beside the other builds; cached: seconds).
( "$venv/bin/python" hack/build-extensions.py ) >"$logs/extensions.log" 2>&1 &
extensions=$!
python_seconds=$((SECONDS - s))
wait "$go_builds" || { tail -n 40 "$logs/go.log" >&2; echo "the Go builds failed (log: $logs/go.log)" >&2; exit 1; }
wait "$images" || { tail -n 40 "$logs/images.log" >&2; echo "the image builds failed (log: $logs/images.log)" >&2
                    exit 1; }
wait "$extensions" || { tail -n 40 "$logs/extensions.log" >&2
                        echo "building DeepSpeed's CPU op failed (log: $logs/extensions.log)" >&2; exit 1; }
FINETUNE_IMAGES="$(tr '\n' ' ' <"$logs/images.out")"
export FINETUNE_IMAGES
setup_seconds=$((SECONDS - started))
s=$SECONDS
workers="${FINETUNE_TEST_WORKERS:-4}"
parallel=()
if [[ "$workers" != 0 ]]; then parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder); fi
rc=0
# An e2e case written for both runtimes runs once, with our images as containers (tests/support/twins.py, mark_twins).
"$venv/bin/python" -m pytest -m "not gpu" "${parallel[@]}" --durations=30 "$@" || rc=$?  # the slowest tests
tests_seconds=$((SECONDS - s))
{
  echo "where the time went (cold: everything built; warm: all cached):"
  printf '  %-48s %6ds\n' "Python venv (hack/setup-python.sh)" "$python_seconds" \
    "Go builds (control plane, kwok, helm, MinIO, Kueue)" "$(cat "$logs/go.seconds")" \
    "images (hack/build-images.sh)" "$(cat "$logs/images.seconds")" \
    "set-up, all three at once" "$setup_seconds" \
    "tests (pytest, $workers workers)" "$tests_seconds" \
    "total" "$((SECONDS - started))"
} >&2
exit "$rc"
