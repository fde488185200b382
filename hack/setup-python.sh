#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv and links it as ./.venv.
# The venv lives outside the work tree, keyed by a hash of requirements/ and the Python version, because torch's
# CUDA wheels are several GB: a clean clone with the same pins reuses it in seconds. Our own packages are
# installed editable on every call, so the venv always points at this checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
py="${PYTHON:-python3}"
key="$( (cat "$root"/requirements/*.txt; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)"
venv="$cache/venv-$key"
if [[ ! -f "$venv/.complete" ]]; then
  echo "creating $venv (first time: downloads torch, several GB; pip's cache makes later builds fast)" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" --upgrade pip wheel setuptools
  "${pip[@]}" -r "$root/requirements/operator.txt" -r "$root/requirements/trainer.txt" -r "$root/requirements/dev.txt"
  DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation -r "$root/requirements/trainer-nobuildisolation.txt"
  touch "$venv/.complete"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$root"
ln -sfn "$venv" "$root/.venv"
echo "$venv"
