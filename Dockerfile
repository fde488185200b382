# The operator image: slim Python, only the operator's dependencies (no torch), non-root.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements/operator.txt requirements/
RUN pip install -r requirements/operator.txt
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer_image/ trainer_image/
RUN pip install --no-deps . && rm -rf /src

USER 65532:65532
# The chart passes --all-namespaces or --namespace=... and the liveness endpoint as args.
ENTRYPOINT ["kopf", "run", "--standalone", "-m", "finetune_operator.controller.handlers"]
CMD ["--all-namespaces"]
