#!/usr/bin/env bash
# Regenerates every file derived from the API models: the CRD and the Helm chart's copy of it.
# Tests fail when the committed files differ from what this writes.
set -euo pipefail
cd "$(dirname "$0")/.."
finetune="${FINETUNE:-.venv/bin/finetune}"
"$finetune" crd > crds/finetunejob.yaml
cp crds/finetunejob.yaml charts/finetunejob/crds/finetunejob.yaml
"$(dirname "$finetune")/python" -m finetune_operator.chart_values charts/finetunejob
"$(dirname "$finetune")/python" -c "from finetune_operator.api.reference import spec_reference; print(spec_reference(), end=\"\")" > docs/spec-reference.md
