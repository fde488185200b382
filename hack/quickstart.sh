#!/usr/bin/env bash
# The README's first command. Sets up the Python environment, validates the tiny CPU example and renders every
# Kubernetes object the operator would create for it. (`finetune run`, the local fine-tune, replaces the render
# step once it lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash hack/setup-python.sh | tail -n 1)"
example="${1:-examples/tiny-cpu-sft.yaml}"
"$venv/bin/finetune" validate "$example"
"$venv/bin/finetune" render "$example"
