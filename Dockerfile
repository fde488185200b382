# The operator image: the operator's locked dependencies and our wheel on a slim Python 3.11 (the Python the tests
# run), non-root. Two stages: the build stage makes the virtualenv, the runtime stage gets only the virtualenv.
# BASE: any Debian-based Python 3.11 image; hack/build-images.sh passes a stand-in built from Debian's packages on
# machines that reach no container registry.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# The runtime venv has no pip of its own: the build venv's pip installs into it (--python).
RUN python3 -m venv --without-pip /opt/venv && python3 -m venv /opt/build
COPY requirements/operator.lock requirements/build.lock /src/requirements/
RUN /opt/build/bin/pip install --require-hashes --no-deps -r /src/requirements/build.lock \
 && /opt/build/bin/pip --python /opt/venv/bin/python install --require-hashes --no-deps \
      -r /src/requirements/operator.lock
COPY pyproject.toml README.md /src/
COPY operator/ /src/operator/
COPY trainer_image/ /src/trainer_image/
# Our wheel is built with the locked setuptools (no build isolation: nothing unhashed is fetched).
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /src/dist /src \
 && /opt/build/bin/pip --python /opt/venv/bin/python install --no-deps /src/dist/*.whl

FROM ${BASE}
ARG BASE
LABEL org.opencontainers.image.title="finetunejob-operator" org.opencontainers.image.base.name="${BASE}"
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# OPERATOR_UID in the API constants; the chart's securityContext runs the same uid with a read-only root.
USER 65532:65532
WORKDIR /tmp
# The chart passes --all-namespaces or --namespace=..., the health port and --leader-elect as args.
ENTRYPOINT ["python", "-m", "finetune_operator.controller"]
CMD ["--all-namespaces"]
