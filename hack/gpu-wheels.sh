#!/usr/bin/env bash
# The carry for a GPU machine that reaches no package registry: the wheels its Python 3.12 lacks
# (requirements/gpu-carry.txt, cp312 manylinux) and DeepSpeed's sdist (it builds there, against the machine's
# torch), into DIR (default .gpu-wheels/, ignored by git). At most 60 MiB in all: checked here and by
# tests/e2e/test_gpu_kit.py. On the GPU machine (benchmarks/gpu_suite.py's docstring has the one line):
#   pip install --no-index --no-deps --no-build-isolation --target .gpu-site .gpu-wheels/*
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$root/.gpu-wheels}"
py="${PYTHON:-python3}"
mkdir -p "$dest"
pip=("$py" -m pip download --quiet --disable-pip-version-check --no-deps -d "$dest")
"${pip[@]}" --python-version 3.12 --implementation cp --abi cp312 --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -r "$root/requirements/gpu-carry.txt"
deepspeed="$(grep -o '^deepspeed==[^ ]*' "$root/requirements/trainer-nobuildisolation.lock")"
"${pip[@]}" --no-binary=:all: "$deepspeed"
size="$(du -sb "$dest" | cut -f1)"
if (( size > 60 * 1024 * 1024 )); then
  echo "the carry is $((size / 1024 / 1024)) MiB, over 60 MiB" >&2
  exit 1
fi
echo "$dest: $(ls "$dest" | wc -l) files, $((size / 1024 / 1024)) MiB" >&2
echo "$dest"
