#!/usr/bin/env bash
# Builds the cluster image with Debian's podman on a machine that reaches no container registry,
# in either variant, then runs checks inside it:
#   cpu  (localhost/toolkit:cpu):  `toolkit doctor`, then 2-rank jobs (DDP, Horovod);
#   cuda (localhost/toolkit:cuda, the Dockerfile's default variant): `toolkit doctor`, which on a
#        machine without a GPU must pass and say "no GPU visible", then the same 2-rank jobs on
#        the CPU (the CUDA builds of torch and Horovod run there too).
#
#   bash scripts/build_image.sh            # cpu: every step (each one is skipped when already done)
#   bash scripts/build_image.sh run        # cpu: only the checks inside an image built before
#   bash scripts/build_image.sh cuda       # cuda: every step
#   bash scripts/build_image.sh cuda-run   # cuda: only the checks inside an image built before
#
# The base is Debian bookworm made locally with mmdebstrap and imported into podman (no registry
# pull); the cuda variant takes CUDA from the package registry's NVIDIA packages (see the
# Dockerfile), so it needs no CUDA base image either. What these machines need, found by building
# the images here (Debian 12, podman 4.3):
#   - the runc runtime: Debian's default crun refuses the hybrid cgroup layout;
#   - explicit ulimits (nofile, nproc), both in a containers.conf named by CONTAINERS_CONF;
#   - the host's CA bundle mounted into RUN steps, or pip cannot verify the package registry.
# An image build reads nothing from the host that it does not carry in. The RUN steps read one
# pip configuration, a pip.conf this script writes into a folder of its own ($STAGE) and mounts
# (the Dockerfile's PIP_CONFIG_FILE), never the host's, whose files may name further files and
# folders that the build does not see (a constraints file, local indexes). For cpu, that folder
# also holds the CPU build of torch, which the registry does not have (its torch is the CUDA
# build): it is fetched here, through the host's pip configuration, which on this project's
# machines names a local folder that holds it.
# The host's wheel cache of scripts/setup.sh ($TOOLKIT_CACHE/wheels, keyed by versions and device)
# is mounted where the image's setup.sh looks for it, so the image build reuses a Horovod or
# DeepSpeed wheel instead of compiling it (and a wheel compiled there lands in the cache).
#
# Settings (environment): TOOLKIT_BASE_IMAGE, TOOLKIT_IMAGE (cpu), TOOLKIT_CUDA_IMAGE (cuda),
# TOOLKIT_CACHE, TOOLKIT_DEBIAN_MIRROR, TORCH_CUDA_ARCH_LIST (cuda: the GPU architectures
# compiled for; setup.sh's default otherwise).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_IMAGE="${TOOLKIT_BASE_IMAGE:-localhost/debian-base:bookworm}"
CACHE="${TOOLKIT_CACHE:-$HOME/.cache/toolkit}"
WORK="$CACHE/image"
export CONTAINERS_CONF="$WORK/containers.conf"
# Where the image's scripts/setup.sh keeps its wheel cache (the Dockerfile's TOOLKIT_CACHE).
IMAGE_WHEELS=/opt/toolkit-cache/wheels
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
# Where RUN steps see the staged pip folder.
IMAGE_PIP=/opt/toolkit-pip
# The 2-rank jobs run inside the image: DDP by the toolkit's own launcher, Horovod by horovodrun.
JOB_SPECS=(hvd_examples/specs/ddp_local.yaml hvd_examples/specs/horovod.yaml)

MODE="${1:-all}"
case "$MODE" in
  all) VARIANT=cpu BUILD=1 ;;
  run) VARIANT=cpu BUILD=0 ;;
  cuda) VARIANT=cuda BUILD=1 ;;
  cuda-run) VARIANT=cuda BUILD=0 ;;
  *) echo "usage: $0 [all|run|cuda|cuda-run]" >&2; exit 2 ;;
esac
if [ "$VARIANT" = cpu ]; then
  IMAGE="${TOOLKIT_IMAGE:-localhost/toolkit:cpu}"
  BUILD_MODE=all
else
  IMAGE="${TOOLKIT_CUDA_IMAGE:-localhost/toolkit:cuda}"
  BUILD_MODE=cuda
fi
STAGE="$WORK/pip-$VARIANT"
# Steps: 5 to build, the doctor, one per job.
LAST=$((6 + ${#JOB_SPECS[@]}))

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

# One pin of the Dockerfile (its `ARG NAME=VALUE`): what is staged matches what is built.
dockerfile_pin() {
  sed -n "s/^ARG $1=//p" "$ROOT/Dockerfile" | grep . || die "no ARG $1=... in $ROOT/Dockerfile"
}

# The CPU build of torch for the image's Python (Debian bookworm's 3.11, whatever Python runs
# here), into $STAGE/wheels, found through the host's pip configuration: PyPI's torch is the CUDA
# build. Only that wheel stays there, so pip in the image sees no other.
stage_cpu_torch() {
  local version wheel
  version="$(dockerfile_pin TORCH_VERSION)"
  mkdir -p "$STAGE/wheels"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
    --python-version 3.11 --abi cp311 --platform manylinux_2_28_x86_64 \
    -d "$STAGE/wheels" "torch==$version" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) \
    || die "pip download torch==$version failed (the host's pip configuration: pip config list -v)"
  wheel="$(find "$STAGE/wheels" -name "torch-$version+cpu-*.whl" | head -n 1)"
  [ -n "$wheel" ] || die "pip found no CPU build of torch $version (it took" \
    "$(cd "$STAGE/wheels" && ls | tr '\n' ' ')): the registry's is the CUDA build; give pip a" \
    "folder holding torch-$version+cpu (PIP_FIND_LINKS=DIR bash $0)"
  # The CPU build depends on no CUDA package; the name alone could lie.
  python3 - "$wheel" <<'PYTHON' || die "$wheel depends on CUDA packages: not the CPU build"
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    (metadata,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    lines = wheel.read(metadata).decode().splitlines()
requires = [line for line in lines if line.startswith("Requires-Dist:")]
sys.exit(any("nvidia" in line or "cuda" in line for line in requires))
PYTHON
  find "$STAGE/wheels" -type f ! -name "$(basename "$wheel")" -delete
}

# $STAGE/pip.conf: the RUN steps' whole pip configuration, folders named as they see them.
write_pip_conf() {
  mkdir -p "$STAGE"
  {
    echo "# Written by scripts/build_image.sh: the only pip configuration of the image build's RUN"
    echo "# steps (the Dockerfile's PIP_CONFIG_FILE); the host's is not read there."
    echo "[global]"
    # The host's CA bundle, mounted at the same path (build_volumes): pip's own CA list does
    # not end the registry's certificate chain on these machines.
    if [ -f "$CA_BUNDLE" ]; then echo "cert = $CA_BUNDLE"; fi
    if [ "$VARIANT" = cpu ]; then echo "find-links = $IMAGE_PIP/wheels"; fi
  } >"$STAGE/pip.conf"
}

# -v options for `podman build`: the CA bundle and the staged pip folder, read-only, and the
# host's wheel cache, read-write. RUN steps see nothing else of the host (nor its environment).
build_volumes() {
  if [ -f "$CA_BUNDLE" ]; then echo "-v=$CA_BUNDLE:$CA_BUNDLE:ro"; fi
  echo "-v=$STAGE:$IMAGE_PIP:ro"
  mkdir -p "$CACHE/wheels"
  echo "-v=$CACHE/wheels:$IMAGE_WHEELS"
}

run_inside() {
  podman run --rm --network=none "$IMAGE" "$@"
}

if [ "$BUILD" = 1 ]; then
  step "1/$LAST container tools (podman, buildah, runc, mmdebstrap, uidmap)"
  apt_ensure podman buildah runc mmdebstrap uidmap
  step_done

  step "2/$LAST containers.conf ($CONTAINERS_CONF)"
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

  step "3/$LAST Debian bookworm base $BASE_IMAGE"
  if podman image exists "$BASE_IMAGE"; then
    echo "already made: $BASE_IMAGE"
  else
    mirror="$(debian_mirror)"
    echo "mmdebstrap from $mirror"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm - "$mirror" | podman import - "$BASE_IMAGE"
  fi
  step_done

  step "4/$LAST the build's pip configuration ($STAGE)"
  write_pip_conf
  if [ "$VARIANT" = cpu ]; then stage_cpu_torch; fi
  sed 's/^/  /' "$STAGE/pip.conf"
  find "$STAGE" -name '*.whl' -printf '  + %P (%s bytes)\n'
  step_done

  build_args=(--build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TOOLKIT_DEVICE="$VARIANT"
    --build-arg PIP_CONFIG_FILE="$IMAGE_PIP/pip.conf")
  if [ -n "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    build_args+=(--build-arg TORCH_CUDA_ARCH_LIST="$TORCH_CUDA_ARCH_LIST")
  fi
  step "5/$LAST $VARIANT image $IMAGE (Dockerfile, BASE_IMAGE=$BASE_IMAGE, TOOLKIT_DEVICE=$VARIANT)"
  mapfile -t volumes < <(build_volumes)
  printf '  mount %s\n' "${volumes[@]#-v=}"
  podman build --force-rm --layers "${build_args[@]}" "${volumes[@]}" -t "$IMAGE" "$ROOT"
  # A rebuild leaves the previous image untagged; drop it and any other dangling image.
  podman image prune --force >/dev/null
  podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -F "$IMAGE" || true
  step_done
else
  [ -f "$CONTAINERS_CONF" ] || die "$CONTAINERS_CONF is missing: run 'bash $0 $BUILD_MODE' first"
  podman image exists "$IMAGE" || die "image $IMAGE is missing: run 'bash $0 $BUILD_MODE' first"
fi

step "6/$LAST inside $IMAGE: toolkit doctor"
if [ "$VARIANT" = cpu ]; then
  run_inside toolkit doctor
else
  # The container sees no GPU (none is passed in): the CUDA builds must say so, not fail.
  doctor_output="$(run_inside toolkit doctor 2>&1)" || { echo "$doctor_output"; die "toolkit doctor failed"; }
  echo "$doctor_output"
  grep -q "no GPU visible" <<<"$doctor_output" || die "toolkit doctor did not say 'no GPU visible'"
fi
step_done

n=7
for spec in "${JOB_SPECS[@]}"; do
  step "$n/$LAST inside $IMAGE: 2-rank job, toolkit launch --spec $spec"
  # One epoch reaches about 0.8 held-out accuracy (chance is 0.1); the script's default bar
  # (0.9) is for full runs.
  run_inside toolkit launch --spec "$spec" -- \
    hvd_examples/torch_digits.py --spec "$spec" --epochs 1 --min-accuracy 0.5
  step_done
  n=$((n + 1))
done
echo
echo "[image] done: $IMAGE"
