"""Kubernetes' own syntax for label keys and values, annotation keys and object names, as pydantic types.

The apiserver checks these on the children we create; checking them here makes a bad label an error on the
FineTuneJob, with its path and a fix, instead of a Job that fails to be created. Validators, for the message; an
object name carries its pattern into the CRD too, so `kubectl apply` refuses `team-b/x` exactly where the operator
would (the structural schema cannot express rules for map keys: label keys are checked by the operator only).
"""

import re
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_SUBDOMAIN_PATTERN = rf"^{_DNS_SUBDOMAIN}$"
QUALIFIED_NAME = re.compile(rf"^({_DNS_SUBDOMAIN}/)?{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
MAX_ANNOTATIONS_BYTES = 256 * 1024


def qualified_name(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if not QUALIFIED_NAME.match(key) or len(name) > 63 or len(prefix) > 253:
        raise ValueError("must be a qualified name: [prefix/]name, name at most 63 of A-Z a-z 0-9 - _ . starting and "
                         "ending alphanumeric, prefix a DNS subdomain (e.g. example.com/team)")
    return key


def label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise ValueError("must be a label value: empty or at most 63 of A-Z a-z 0-9 - _ . starting and ending "
                         "alphanumeric")
    return value


def dns_subdomain(value: str) -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN.match(value):
        raise ValueError("must be a DNS subdomain: lower case a-z 0-9 - . starting and ending alphanumeric")
    return value


def annotations_size(annotations: dict[str, str]) -> dict[str, str]:
    size = sum(len(k) + len(v) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        raise ValueError(f"annotations total {size} bytes; Kubernetes allows {MAX_ANNOTATIONS_BYTES}")
    return annotations


QualifiedName = Annotated[str, AfterValidator(qualified_name)]
LabelValue = Annotated[str, AfterValidator(label_value)]
DnsSubdomain = Annotated[str, AfterValidator(dns_subdomain),
                         WithJsonSchema({"type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN_PATTERN})]
Labels = dict[QualifiedName, LabelValue]
Annotations = Annotated[dict[QualifiedName, str], AfterValidator(annotations_size)]
