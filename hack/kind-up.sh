#!/usr/bin/env bash
# For users with Docker: a kind cluster, the operator and trainer images built and loaded, the chart installed,
# and the tiny CPU example run in the cluster. Not run by our CI (its machines have no Docker engine and reach no
# registry for kind's node image); CI builds the same images with podman (hack/build-images.sh) and runs them.
# The trainer image is its CPU variant: what the tiny demo needs, without prebuilding DeepSpeed's CUDA ops.
# Needs: docker, kind, kubectl, helm, and ./hack/setup-python.sh done (for the tiny model and the YAML edit).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash hack/setup-python.sh | tail -n 1)"
kind create cluster --config kind-config.yaml
docker build -t finetunejob-operator:dev .
docker build -t finetunejob-trainer:dev --build-arg VARIANT=cpu -f trainer_image/Dockerfile .
kind load docker-image finetunejob-operator:dev finetunejob-trainer:dev --name finetunejob
helm install finetunejob charts/finetunejob --namespace finetunejob-system --create-namespace \
  --set image.repository=finetunejob-operator --set image.tag=dev --set image.pullPolicy=Never \
  --set trainerImage=finetunejob-trainer:dev
kubectl -n finetunejob-system rollout status deployment/finetunejob-operator --timeout=300s

# The example's model lives on the job's output claim; a one-off pod builds the tiny model there first.
kubectl apply -f - <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: finetune-shared}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 2Gi}}}
YAML
kubectl run tiny-model --image=finetunejob-trainer:dev --image-pull-policy=Never --restart=Never \
  --overrides='{"spec":{"securityContext":{"runAsUser":1000,"fsGroup":1000},"volumes":[{"name":"o","persistentVolumeClaim":{"claimName":"finetune-shared"}}],"containers":[{"name":"tiny-model","image":"finetunejob-trainer:dev","command":["python","-m","finetune_trainer.tiny_model","/output/tiny-cpu-sft/models/tiny-llama"],"volumeMounts":[{"name":"o","mountPath":"/output"}]}]}}'
kubectl wait pod/tiny-model --for=jsonpath='{.status.phase}'=Succeeded --timeout=600s
"$venv/bin/python" - <<'PY' | kubectl apply -f -
import sys, yaml
doc = yaml.safe_load(open("examples/tiny-cpu-sft.yaml"))
doc["spec"]["model"]["name"] = "/output/models/tiny-llama"
doc["spec"]["output"] = {"claimName": "finetune-shared"}
sys.stdout.write(yaml.safe_dump(doc))
PY
kubectl wait ftj/tiny-cpu-sft --for=jsonpath='{.status.phase}'=Succeeded --timeout=1200s
kubectl get finetunejobs
