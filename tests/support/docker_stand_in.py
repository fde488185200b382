"""`docker build` and `docker push` for a page's commands on a machine with no Docker engine and no registry.

The suite's images are built once by hack/build-images.sh (podman); a page's `docker build -t NAME ... .` names
them NAME instead of building again: with images given ("containers" runs), NAME becomes a podman tag of the image
that Dockerfile builds (the operator's, or the trainer's CPU variant), so pods run it by that name; without
(process runs, whose pods run this checkout) it is only recorded. `docker push NAME` checks that NAME was built.
Every call is appended to the log, for the test to read.

    python -m tests.support.docker_stand_in build|push ...
Environment: DOCKER_STAND_IN_LOG (a file), DOCKER_STAND_IN_IMAGES (JSON {"operator": image, "trainer": image}, or
empty), DOCKER_STAND_IN_CACHE (the suite's cache, where hack/podman.sh keeps the images: the page's shell has a HOME
of its own, under which podman.sh would look in an empty store).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.controlplane import ROOT

DOCKERFILES = {"Dockerfile": "operator", "trainer_image/Dockerfile": "trainer"}


def main(argv: list[str]) -> int:
    log = Path(os.environ["DOCKER_STAND_IN_LOG"])
    images = json.loads(os.environ.get("DOCKER_STAND_IN_IMAGES") or "{}")
    built = [json.loads(line)["tag"] for line in log.read_text().splitlines()] if log.exists() else []
    if argv[:1] == ["build"]:
        args = argv[1:]
        tag = args[args.index("-t") + 1]
        dockerfile = args[args.index("-f") + 1] if "-f" in args else "Dockerfile"
        if args[-1] != "." or dockerfile not in DOCKERFILES or not (ROOT / dockerfile).is_file():
            print(f"docker stand-in: expected a build of one of {sorted(DOCKERFILES)} with context '.', got {args}",
                  file=sys.stderr)
            return 2
        if images:
            podman = str(ROOT / "hack" / "podman.sh")
            env = {**os.environ, "FINETUNE_CACHE": os.environ["DOCKER_STAND_IN_CACHE"]}
            subprocess.run([podman, "tag", images[DOCKERFILES[dockerfile]], tag], check=True, env=env)
        with log.open("a") as f:
            f.write(json.dumps({"tag": tag, "image": DOCKERFILES[dockerfile]}) + "\n")
        return 0
    if argv[:1] == ["push"] and len(argv) == 2:
        if argv[1] not in built:
            print(f"An image does not exist locally with the tag: {argv[1]}", file=sys.stderr)
            return 1
        return 0
    print(f"docker stand-in: only `build` and `push NAME`, not {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
