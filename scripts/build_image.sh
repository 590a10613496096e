#!/usr/bin/env bash
# Builds the CPU variant of the cluster image with Debian's podman on a machine that reaches no
# container registry, then runs `toolkit doctor` and 2-rank jobs inside it.
#
#   bash scripts/build_image.sh          # every step (each one is skipped when already done)
#   bash scripts/build_image.sh run      # only the checks inside an image built before
#
# The base is Debian bookworm made locally with mmdebstrap and imported into podman (no registry
# pull). What these machines need, found by building the image here (Debian 12, podman 4.3):
#   - the runc runtime: Debian's default crun refuses the hybrid cgroup layout;
#   - explicit ulimits (nofile, nproc), both in a containers.conf named by CONTAINERS_CONF;
#   - the host's CA bundle mounted into RUN steps, or pip cannot verify the package registry;
#   - the host's pip configuration and the local folders it names: the registry's torch 2.13.0
#     is the CUDA build; the CPU wheel is only in the host's find-links folder.
# The host's Horovod wheel cache (scripts/setup.sh keeps it in $TOOLKIT_CACHE/wheels, keyed by
# versions and device) is mounted where the image's setup.sh looks for it, so the image build
# reuses the wheel instead of compiling Horovod (and a wheel compiled there lands in the cache).
#
# Settings (environment): TOOLKIT_BASE_IMAGE, TOOLKIT_IMAGE, TOOLKIT_CACHE, TOOLKIT_DEBIAN_MIRROR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_IMAGE="${TOOLKIT_BASE_IMAGE:-localhost/debian-base:bookworm}"
IMAGE="${TOOLKIT_IMAGE:-localhost/toolkit:cpu}"
CACHE="${TOOLKIT_CACHE:-$HOME/.cache/toolkit}"
WORK="$CACHE/image"
export CONTAINERS_CONF="$WORK/containers.conf"
# Where the image's scripts/setup.sh keeps its wheel cache (the Dockerfile's TOOLKIT_CACHE).
IMAGE_WHEELS=/opt/toolkit-cache/wheels
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
# The 2-rank jobs run inside the image: DDP by the toolkit's own launcher, Horovod by horovodrun.
JOB_SPECS=(hvd_examples/specs/ddp_local.yaml hvd_examples/specs/horovod.yaml)

MODE="${1:-all}"
case "$MODE" in all|run) ;; *) echo "usage: $0 [all|run]" >&2; exit 2 ;; esac

TIMINGS=()
step() { printf '\n==> [image] %s\n' "$*"; STEP_NAME="$*"; STEP_START=$(date +%s); }
step_done() {
  local took=$(($(date +%s) - STEP_START))
  TIMINGS+=("$(printf '%6ss  %s' "$took" "$STEP_NAME")")
  echo "[image] took ${took}s"
}
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }
print_timings() {
  ((${#TIMINGS[@]})) || return 0
  echo
  echo "[image] timings:"
  printf '  %s\n' "${TIMINGS[@]}"
}
trap print_timings EXIT

apt_ensure() {
  local missing=() pkg SUDO=""
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    echo "already installed: $*"
    return
  fi
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}"
  mkdir -p "$WORK"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${missing[@]}" >"$WORK/apt.log" 2>&1 \
    || { tail -n 30 "$WORK/apt.log" >&2; die "apt-get install failed; full log: $WORK/apt.log"; }
}

# The Debian mirror this host's apt sources name for bookworm (the base is made from it).
debian_mirror() {
  if [ -n "${TOOLKIT_DEBIAN_MIRROR:-}" ]; then
    echo "$TOOLKIT_DEBIAN_MIRROR"
    return
  fi
  apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
    | awk '$2 == "bookworm" { print $1; exit }' | grep . || echo "http://deb.debian.org/debian"
}

# -v options for `podman build`: the CA bundle, the host's pip configuration files and every
# local folder they name (find-links, file:// indexes), all read-only, and the host's wheel cache
# read-write. RUN steps do not see the host's environment, so PIP_* variables do not reach them:
# the configuration files must say what the build needs.
build_volumes() {
  local file dir configs=()
  [ -f "$CA_BUNDLE" ] && echo "-v=$CA_BUNDLE:$CA_BUNDLE:ro"
  for file in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
    [ -f "$file" ] && configs+=("$file") && echo "-v=$file:$file:ro"
  done
  if ((${#configs[@]})); then
    grep -hoE "(file://)?/[^' ,]+" "${configs[@]}" | sed 's|^file://||' | sort -u \
      | while read -r dir; do
          # an index URL names .../simple; its files sit beside it, so mount the parent folder
          [ "$(basename "$dir")" = simple ] && dir="$(dirname "$dir")"
          [ -d "$dir" ] && echo "-v=$dir:$dir:ro"
        done | sort -u
  fi
  mkdir -p "$CACHE/wheels"
  echo "-v=$CACHE/wheels:$IMAGE_WHEELS"
}

run_inside() {
  podman run --rm --network=none "$IMAGE" "$@"
}

if [ "$MODE" = all ]; then
  step "1/7 container tools (podman, buildah, runc, mmdebstrap, uidmap)"
  apt_ensure podman buildah runc mmdebstrap uidmap
  step_done

  step "2/7 containers.conf ($CONTAINERS_CONF)"
  mkdir -p "$WORK"
  cat >"$CONTAINERS_CONF" <<'EOF'
# Written by scripts/build_image.sh. crun (Debian's default) refuses this host's hybrid cgroup
# layout; runc works. Containers get no usable ulimits by default here, so name them.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
EOF
  echo "runtime runc, ulimits nofile=20000 nproc=32768"
  step_done

  step "3/7 Debian bookworm base $BASE_IMAGE"
  if podman image exists "$BASE_IMAGE"; then
    echo "already made: $BASE_IMAGE"
  else
    mirror="$(debian_mirror)"
    echo "mmdebstrap from $mirror"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm - "$mirror" | podman import - "$BASE_IMAGE"
  fi
  step_done

  step "4/7 CPU image $IMAGE (Dockerfile, BASE_IMAGE=$BASE_IMAGE, TOOLKIT_DEVICE=cpu)"
  mapfile -t volumes < <(build_volumes)
  printf '  mount %s\n' "${volumes[@]#-v=}"
  podman build --force-rm --layers \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TOOLKIT_DEVICE=cpu \
    "${volumes[@]}" -t "$IMAGE" "$ROOT"
  # A rebuild leaves the previous image untagged; drop it and any other dangling image.
  podman image prune --force >/dev/null
  podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -F "$IMAGE" || true
  step_done
else
  [ -f "$CONTAINERS_CONF" ] || die "$CONTAINERS_CONF is missing: run 'bash $0' first"
  podman image exists "$IMAGE" || die "image $IMAGE is missing: run 'bash $0' first"
fi

step "5/7 inside $IMAGE: toolkit doctor"
run_inside toolkit doctor
step_done

n=6
for spec in "${JOB_SPECS[@]}"; do
  step "$n/7 inside $IMAGE: 2-rank job, toolkit launch --spec $spec"
  # One epoch reaches about 0.8 held-out accuracy (chance is 0.1); the script's default bar
  # (0.9) is for full runs.
  run_inside toolkit launch --spec "$spec" -- \
    hvd_examples/torch_digits.py --spec "$spec" --epochs 1 --min-accuracy 0.5
  step_done
  n=$((n + 1))
done
echo
echo "[image] done: $IMAGE"
