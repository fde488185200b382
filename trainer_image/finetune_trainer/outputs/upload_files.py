"""`python -m finetune_trainer.outputs.upload_files LOCAL URI NAME...`: a checkpoint's files to the bucket, in a
process of its own at the lowest CPU priority (remote_output starts it for each checkpoint). Training keeps the
CPU (on a GPU node the uploads use what the data loader leaves; on a small CPU machine they would otherwise take
a third of every step), and no upload holds the trainer's GIL. The store's settings come in FINETUNE_S3 (spec.s3 as
JSON), the credentials in the AWS_* environment as everywhere else.

Exit codes: 0 uploaded, 77 refused (credentials), 74 unreachable (retried by the caller), 1 anything else; the
store's explanation is the last line of stderr."""

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from finetune_operator.api import exit_codes
from finetune_operator.api.storage import S3Spec
from finetune_trainer import objectstore

ENV_S3 = "FINETUNE_S3"


def main(argv: Sequence[str] | None = None) -> int:
    local, uri, *names = list(argv if argv is not None else sys.argv[1:])
    objectstore.configure(S3Spec.model_validate(json.loads(os.environ.get(ENV_S3) or "{}")))
    try:
        objectstore.upload(Path(local), uri, names)
    except Exception as exc:  # s3fs and botocore raise many types
        print(objectstore.explain(exc, uri), file=sys.stderr, flush=True)
        if objectstore.refused(exc):
            return exit_codes.PUSH_REFUSED
        return exit_codes.PUSH_FAILED if objectstore.unreachable(exc) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
