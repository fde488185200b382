#!/usr/bin/env bash
# For users with Docker: a kind cluster, the operator and trainer images built and loaded, the chart installed,
# and the tiny CPU example run in the cluster (its model comes from the Hugging Face Hub by id: the kind node needs
# internet). docs/getting-started/first-cluster-job.md is the same on any cluster, step by step, and is what the
# tests run; this script is not run by our CI (its machines have no Docker engine and reach no registry for kind's
# node image).
# Needs: docker, kind, kubectl, helm.
set -euo pipefail
cd "$(dirname "$0")/.."
kind create cluster --config kind-config.yaml
docker build -t finetunejob-operator:dev .
docker build -t finetunejob-trainer:dev --build-arg VARIANT=cpu -f trainer_image/Dockerfile .
kind load docker-image finetunejob-operator:dev finetunejob-trainer:dev --name finetunejob
helm install finetunejob charts/finetunejob --namespace finetunejob-system --create-namespace \
  --set image.repository=finetunejob-operator --set image.tag=dev --set image.pullPolicy=Never \
  --set trainerImage=finetunejob-trainer:dev
kubectl -n finetunejob-system rollout status deployment/finetunejob-operator --timeout=300s
kubectl apply -f examples/tiny-cpu-sft.yaml
kubectl wait ftj/tiny-cpu-sft --for=jsonpath='{.status.phase}'=Succeeded --timeout=1200s
kubectl get finetunejobs
