"""spec.s3: the S3-compatible object storage that s3:// URIs in the spec (data paths, model name, output.uri) use.

Credentials only by reference: a Secret whose keys become the trainer's environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, or any other AWS_* variable boto reads), or none at all (workload
identity: EKS IRSA or Pod Identity, GKE's, through the pod's ServiceAccount). `finetune run` uses the credentials of
the user's own environment (AWS_* variables, ~/.aws)."""

import re
from typing import Literal

from pydantic import Field

from .base import ApiModel
from .k8s_names import DNS_SUBDOMAIN_PATTERN

S3_SCHEME = "s3://"
# s3://bucket[/key...]: a bucket name as S3 allows it (3-63 lowercase letters, digits, dots and hyphens).
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$"
_S3_URI = re.compile(S3_URI_PATTERN)


def is_s3(path: str | None) -> bool:
    return bool(path) and str(path).startswith(S3_SCHEME)


def valid_s3_uri(path: str) -> bool:
    return bool(_S3_URI.match(path))


def split_s3(uri: str) -> tuple[str, str]:
    """s3://bucket/a/b -> (bucket, a/b)."""
    bucket, _, key = uri[len(S3_SCHEME):].partition("/")
    return bucket, key


class S3Spec(ApiModel):
    endpoint_url: str | None = Field(
        default=None, alias="endpointURL", max_length=2048, pattern=r"^https?://[^\s@/]+(/[^\s@]*)?$",
        description="The S3 API's endpoint for MinIO, Ceph RGW, Cloudflare R2 or GCS's XML API, e.g. "
        "http://minio.storage:9000; unset for AWS. Never carries credentials.",
    )
    region: str | None = Field(default=None, max_length=64, pattern=r"^[a-z0-9-]+$",
                               description="The region, e.g. us-east-1 (MinIO accepts any).")
    credentials_secret: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="A Secret in the job's namespace whose keys become the trainer's environment: "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary credentials). Unset: "
        "the pod's own identity (IRSA / Pod Identity through spec.pod.serviceAccountName), or no credentials.",
    )
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto", description="How bucket names reach the server: path (http://host/bucket/key: MinIO and "
        "Ceph without wildcard DNS), virtual (http://bucket.host/key), auto (what boto picks).",
    )
