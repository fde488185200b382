#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv and links it as ./.venv.
# It installs the same locked packages (requirements/*.lock, with hashes) as the images, so the tests run what the
# pods run. The venv lives outside the work tree, keyed by a hash of the trainer's locks and the Python version, because
# torch's CUDA wheels are several GB: a clean clone with the same pins reuses it in seconds. The light pins
# (operator, dev tools) are re-installed into it whenever they change, without rebuilding the heavy layer. Our own
# packages are installed editable on every call, so the venv always points at this checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
py="${PYTHON:-python3}"
pyversion="$("$py" -c 'import sys; print(sys.version)')"
key="$( (cat "$root"/requirements/build.lock "$root"/requirements/trainer*.lock; echo "$pyversion") | sha256sum | cut -c1-12)"
light="$( (cat "$root"/requirements/*; echo "$pyversion") | sha256sum | cut -c1-12)"
venv="$cache/venv-$key"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if [[ ! -f "$venv/.complete" ]]; then
  echo "creating $venv (first time: downloads torch, several GB; pip's cache makes later builds fast)" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py" -m venv "$venv"
  "${pip[@]}" --upgrade pip
  "${pip[@]}" --require-hashes --no-deps -r "$root/requirements/build.lock"
  "${pip[@]}" --require-hashes --no-deps -r "$root/requirements/trainer.lock"
  DS_BUILD_OPS=0 "${pip[@]}" --require-hashes --no-deps --no-build-isolation \
    -r "$root/requirements/trainer-nobuildisolation.lock"
  touch "$venv/.complete"
fi
if [[ ! -f "$venv/.light-$light" ]]; then
  echo "installing the operator's and the test tools' pins into $venv" >&2
  "${pip[@]}" --require-hashes --no-deps -r "$root/requirements/operator.lock"
  "${pip[@]}" -r "$root/requirements/dev.txt"
  "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps -d "$cache/test-data" \
    -r "$root/requirements/test-data.txt"
  rm -f "$venv"/.light-* && touch "$venv/.light-$light"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$root"
ln -sfn "$venv" "$root/.venv"
echo "$venv"
