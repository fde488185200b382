"""spec.runtimeRef: the runtime a job names. Apart from runtime.py, which validates runtimes with the job's own rules
(validation.py -> spec.py): the job's spec needs only this reference, so the spec and the runtime modules do not
import each other."""

from typing import Literal

from pydantic import Field

from .base import ApiModel
from .k8s_names import DnsSubdomain

RuntimeKind = Literal["FineTuneRuntime", "ClusterFineTuneRuntime"]


class RuntimeRef(ApiModel):
    kind: RuntimeKind = Field(default="ClusterFineTuneRuntime", description="ClusterFineTuneRuntime (cluster-wide, "
                              "set by the platform team) or FineTuneRuntime (in the job's namespace).")
    name: DnsSubdomain = Field(description="The runtime's name.")
