#!/usr/bin/env bash
# Regenerates every derived file: the CRD (and the chart's copy), the chart's values.yaml and values.schema.json,
# the generated reference pages under docs/reference/ (the status, Events and labels pages from what the operator
# writes: finetune_operator/reference_pages.py), and api/transformers_names.py (names read from the pinned
# transformers).
# Tests fail when the committed files differ from what this writes.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
"$python" -m finetune_operator.generate "$PWD"
"$python" -m finetune_operator.cli.reference "$PWD"
"$python" -m finetune_operator.controller.metrics_reference "$PWD"
"$python" -m finetune_operator.reference_pages "$PWD"
