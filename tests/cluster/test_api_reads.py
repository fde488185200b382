"""The polling loops' in-process reads (tests/support/api_reads.py) print exactly what kubectl prints."""

import json

from tests.conftest import Kubectl


def test_a_read_answered_in_process_is_what_kubectl_prints(kubectl: Kubectl, namespace: str):
    for i in range(2):
        kubectl.run("create", "configmap", f"cm-{i}", "-n", namespace, f"--from-literal=k={i}")
        kubectl.run("label", "configmap", f"cm-{i}", "-n", namespace, f"app={'x' if i else 'y'}")
    reads = [
        ("get", "configmap", "cm-0", "-n", namespace),
        ("get", "cm", "-n", namespace, "-l", "app=x"),
        ("get", "configmaps", f"--namespace={namespace}", "--field-selector", "metadata.name=cm-1"),
        ("get", "crd/finetunejobs.finetunejob.dev"),
        ("get", "customresourcedefinitions.apiextensions.k8s.io", "finetunejobs.finetunejob.dev"),
        ("get", "namespace", namespace),
        ("get", "ftj", "-n", namespace),
        ("get", "serviceaccounts", "-n", namespace),
    ]
    for args in reads:
        ours = kubectl.reads.get(args)
        assert ours is not None, args
        assert ours == json.loads(kubectl.run(*args, "-o", "json").stdout), args
    # Everything else is kubectl's: other flags, several types, and errors (its own message and exit code).
    for args in [("get", "cm", "cm-0", "-n", namespace, "--show-managed-fields"),
                 ("get", "cm,secrets", "-n", namespace), ("get", "cm", "missing", "-n", namespace),
                 ("get", "nosuchkind"), ("describe", "cm", "cm-0", "-n", namespace)]:
        assert kubectl.reads.get(args) is None, args
    assert kubectl.json_or_none("get", "cm", "missing", "-n", namespace) is None
