"""The FineTuneJob API: pydantic models (one module per concern), constants and the CRD generator.

Pure: imports no Kubernetes client, kopf or torch (an import-linter contract enforces it).
"""

from .constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from .errors import FieldError, InvalidSpec
from .spec import FineTuneJobSpec
from .status import FineTuneJobStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "FieldError",
    "FineTuneJobSpec",
    "FineTuneJobStatus",
    "InvalidSpec",
]
