"""spec.pod.volumes: the user's own volumes in the trainer pods, e.g. a claim holding models and datasets.

A typed subset of core/v1 volumes, not a pass-through (no hostPath), and a mount can never hide the paths the trainer
itself needs. Claims, ConfigMaps and Secrets are admitted under the `restricted` Pod Security Standard; an nfs volume
is not (restricted allows only claims, ConfigMaps, Secrets, emptyDir, projected, downwardAPI, CSI and ephemeral
volumes): in such a namespace, mount the export through a PersistentVolumeClaim bound to an NFS PersistentVolume.
Who may mount what: a runtime's allowedVolumeKinds and allowedClaims, and the user's own rights (an NFS export needs
the right to create pods, a ConfigMap or Secret the right to get it: api/job_rights.py)."""

import posixpath
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator
from pydantic.alias_generators import to_camel

from . import constants as c
from .base import ApiModel
from .errors import FieldError, SpecRuleErrors
from .k8s_names import DnsSubdomain

# The trainer's own mounts (render/workload.py): a user volume on, above or inside one would hide it; and the image's
# code (a volume there runs code beside whatever a runtime lends, whatever allowTrustRemoteCode says).
RESERVED_MOUNT_PATHS = (c.CONFIG_MOUNT_PATH, c.OUTPUT_MOUNT_PATH, c.CACHE_MOUNT_PATH, c.TMP_MOUNT_PATH,
                        c.SHM_MOUNT_PATH, c.TERMINATION_MESSAGE_PATH, c.REWARD_CODE_MOUNT_PATH, *c.IMAGE_CODE_PATHS)
SOURCE_FIELDS = ("claim_name", "config_map", "secret", "nfs")
# The kinds (SOURCE_FIELDS) the restricted Pod Security Standard refuses: tested against the API server.
NOT_RESTRICTED = ("nfs",)


def absolute_clean_path(path: str) -> str:
    if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or "\x00" in path:
        raise ValueError("must be an absolute path without '..', '.', '//' or a trailing '/', e.g. /models")
    if ":" in path:
        raise ValueError("may not contain ':' (Kubernetes refuses it in a mount path)")
    return path


def overlaps(a: str, b: str) -> bool:
    """True when one path is the other or lies inside it."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


AbsolutePath = Annotated[str, AfterValidator(absolute_clean_path)]


class NfsVolume(ApiModel):
    server: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:\[\]-]+$",
                        description="NFS server host name or IP address.")
    path: AbsolutePath = Field(max_length=4096, description="Exported path on the server.")


class Volume(ApiModel):
    """Exactly one of claimName, configMap, secret or nfs."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                      description="Volume name (a DNS label), unique in the pod.")
    mount_path: AbsolutePath = Field(max_length=4096, description="Where the trainer sees it, e.g. /models.")
    read_only: bool = Field(default=False, description="Mount read-only (for shared models and datasets).")
    sub_path: str | None = Field(default=None, min_length=1, max_length=4096, pattern=r"^[^/]",
                                 description="Directory inside the volume to mount (relative, no '..').")
    claim_name: DnsSubdomain | None = Field(default=None, max_length=253,
                                            description="A PersistentVolumeClaim in the job's namespace.")
    config_map: DnsSubdomain | None = Field(default=None, max_length=253, description="A ConfigMap's files.")
    secret: DnsSubdomain | None = Field(default=None, max_length=253,
                                        description="A Secret's files (e.g. credentials read as files).")
    nfs: NfsVolume | None = Field(default=None, description="An NFS export. Refused in namespaces that enforce the "
                                  "restricted Pod Security Standard: mount it there through a PersistentVolumeClaim "
                                  "bound to an NFS PersistentVolume. Needs the right to create pods.")

    @model_validator(mode="after")
    def _rules(self) -> "Volume":
        errors: list[FieldError] = []
        given = [to_camel(f) for f in SOURCE_FIELDS if getattr(self, f) is not None]
        if len(given) != 1:
            sources = ", ".join(to_camel(f) for f in SOURCE_FIELDS)
            errors.append(FieldError("", given or None, f"a volume needs exactly one of {sources}",
                                     "keep one of them" if given else "add claimName: <your claim>"))
        if self.name in c.TRAINER_VOLUMES or self.name.startswith(c.REWARD_CODE_VOLUME_PREFIX):
            errors.append(FieldError("name", self.name, f"{self.name} is a volume of the trainer itself",
                                     "choose another name"))
        for reserved in RESERVED_MOUNT_PATHS:
            if overlaps(self.mount_path, reserved):
                errors.append(FieldError("mountPath", self.mount_path, f"overlaps the trainer's own {reserved}",
                                         "mount it elsewhere, e.g. /models or /data"))
                break
        if self.sub_path is not None and ".." in self.sub_path.split("/"):
            errors.append(FieldError("subPath", self.sub_path, "subPath may not contain '..'",
                                     "give a directory inside the volume"))
        if errors:
            raise SpecRuleErrors(errors)
        return self

    def source(self) -> dict[str, object]:
        """The core/v1 volume source."""
        if self.claim_name is not None:
            return {"persistentVolumeClaim": {"claimName": self.claim_name, "readOnly": self.read_only}}
        if self.config_map is not None:
            return {"configMap": {"name": self.config_map}}
        if self.secret is not None:
            return {"secret": {"secretName": self.secret}}
        assert self.nfs is not None  # _rules: exactly one source
        return {"nfs": {"server": self.nfs.server, "path": self.nfs.path, "readOnly": self.read_only}}


def volume_list_errors(volumes: list[Volume]) -> list[FieldError]:
    """Names unique, mount paths apart: the apiserver refuses the first, the second hides one mount under another."""
    errors = []
    for i, volume in enumerate(volumes):
        for j, earlier in enumerate(volumes[:i]):
            if volume.name == earlier.name:
                errors.append(FieldError(f"volumes[{i}].name", volume.name, f"volumes[{j}] has the same name",
                                         "give each volume its own name"))
            if overlaps(volume.mount_path, earlier.mount_path):
                errors.append(FieldError(f"volumes[{i}].mountPath", volume.mount_path,
                                         f"overlaps volumes[{j}].mountPath {earlier.mount_path}",
                                         "mount each volume at its own separate path"))
    return errors
