#!/usr/bin/env bash
# The README's first command: sets up the Python environment, builds a tiny Llama-architecture model locally
# (no download), and fine-tunes it from examples/tiny-cpu-sft.yaml with `finetune run`: the same validation,
# rendering and trainer a cluster runs, as local processes. Run it again after Ctrl-C and it resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash hack/setup-python.sh | tail -n 1)"
model="$PWD/runs/models/tiny-llama"
if [[ ! -f "$model/config.json" ]]; then
  "$venv/bin/python" -m finetune_trainer.tiny_model "$model" >/dev/null
fi
"$venv/bin/finetune" run examples/tiny-cpu-sft.yaml --set "spec.model.name=$model" "$@"
