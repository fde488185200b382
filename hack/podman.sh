#!/usr/bin/env bash
# podman with the project's settings: its own storage in the cache (kept between runs, outside the work tree) and
# a containers.conf that works on machines whose cgroups crun refuses (runc, cgroupfs, the hard ulimits). Used by
# hack/build-images.sh and the container tests; `hack/podman.sh images` lists what they built.
set -euo pipefail
cache="${FINETUNE_CACHE:-$HOME/.cache/finetunejob}"
conf="$cache/containers"
mkdir -p "$conf/storage"
# podman's default ulimits are above the hard limits of some sandboxes (refused), and runc is refused an nproc
# limit above 32768 on some where the hard limit is higher: the smaller of the two.
nofile="$(ulimit -Hn)"; nproc="$(ulimit -Hu)"
[[ "$nofile" == unlimited || "$nofile" -gt 65536 ]] && nofile=65536
[[ "$nproc" == unlimited || "$nproc" -gt 32768 ]] && nproc=32768
# Written to a file of this call's own and renamed over the old one: calls run at once (a test starts two pods'
# containers while it reads another's state), and a shared temporary name let one call rename another's away.
containers_conf="$(mktemp "$conf/containers.conf.XXXXXX")"
storage_conf="$(mktemp "$conf/storage.conf.XXXXXX")"
cat > "$containers_conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
cat > "$storage_conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$conf/storage"
runroot = "${XDG_RUNTIME_DIR:-/run}/finetunejob-containers"
CONF
chmod 644 "$containers_conf" "$storage_conf"
mv "$containers_conf" "$conf/containers.conf"
mv "$storage_conf" "$conf/storage.conf"
export CONTAINERS_CONF="$conf/containers.conf" CONTAINERS_STORAGE_CONF="$conf/storage.conf"
exec podman "$@"
