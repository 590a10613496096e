#!/usr/bin/env bash
# One idempotent setup for every place the toolkit runs: a developer's machine, CI and the
# cluster image (the Dockerfile calls this same script with TOOLKIT_DEVICE=cuda).
#
#   bash scripts/setup.sh            # CPU stack into ./.venv
#   TOOLKIT_DEVICE=cuda bash scripts/setup.sh     # CUDA builds (TORCH_CUDA_ARCH_LIST: which GPUs)
#   TOOLKIT_TEST_CLUSTER=0 bash scripts/setup.sh   # without the test cluster's packages
#   TOOLKIT_INSTALL_SELF=0 bash scripts/setup.sh   # the engines only, not the toolkit itself
#
# Steps are named as they run. Re-running is cheap: apt packages already present are skipped,
# pinned pip packages already installed are no-ops, and Horovod is compiled only once; its wheel
# is kept in $TOOLKIT_CACHE (default ~/.cache/toolkit), outside the repository, keyed by the
# versions it was built against.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${TOOLKIT_DEVICE:-cpu}"
PYTHON="${PYTHON:-python3}"
VENV="${TOOLKIT_VENV:-$ROOT/.venv}"
CACHE="${TOOLKIT_CACHE:-$HOME/.cache/toolkit}"
LOG_DIR="$CACHE/logs"
# The test cluster's packages (sshd, Slurm, munge, pdsh) serve tests/cluster; the CUDA image
# (TOOLKIT_DEVICE=cuda) has no use for Slurm, so they are skipped there unless asked for.
if [ "$DEVICE" = cuda ]; then TEST_CLUSTER="${TOOLKIT_TEST_CLUSTER:-0}"; else TEST_CLUSTER="${TOOLKIT_TEST_CLUSTER:-1}"; fi

# The versions tested together (constraints.txt's), each overridable. The Dockerfile passes its
# ARGs of the same names; tests/test_pins.py checks that constraints.txt, the Dockerfile's ARGs
# and pyproject.toml's extras agree with these defaults.
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TF_VERSION="${TF_VERSION:-2.21.0}"
DEEPSPEED_VERSION="${DEEPSPEED_VERSION:-0.19.8}"
MPI4PY_VERSION="${MPI4PY_VERSION:-4.1.2}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
# TOOLKIT_DEVICE=cuda: the GPU architectures (compute capabilities) DeepSpeed's prebuilt ops and
# Horovod's CUDA kernels are compiled for, in torch's TORCH_CUDA_ARCH_LIST syntax: 8.0 is the
# A100, 9.0 the H100/H200; +PTX adds 9.0's PTX, which newer GPUs compile when they load it. Each
# architecture adds compile time (nvcc 13 has dropped those below 7.5).
CUDA_ARCHS="${TORCH_CUDA_ARCH_LIST:-8.0;9.0+PTX}"

step() { printf '\n==> [setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

case "$DEVICE" in cpu|cuda) ;; *) die "TOOLKIT_DEVICE=$DEVICE: allowed values are cpu, cuda" ;; esac

# The toolkit needs Python >= 3.11 (pyproject's requires-python): refuse before anything installs
# or compiles. A venv already there runs its own Python, so that is the one checked.
if [ -x "$VENV/bin/python" ]; then
  CHECKED_PYTHON="$VENV/bin/python" PYTHON_FIX="remove $VENV and run again with PYTHON=python3.11"
else
  CHECKED_PYTHON="$PYTHON" PYTHON_FIX="install it and run again with PYTHON=python3.11"
fi
PYTHON_FOUND="$("$CHECKED_PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)" \
  || die "no Python at PYTHON=$CHECKED_PYTHON; the toolkit needs Python >= 3.11: $PYTHON_FIX"
"$CHECKED_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$CHECKED_PYTHON is Python $PYTHON_FOUND; the toolkit needs Python >= 3.11: $PYTHON_FIX"

mkdir -p "$CACHE/wheels" "$LOG_DIR"

# pip_install uses constraints.txt with its engine lines set from the variables: overrides win.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
sed -e "s/^torch==.*/torch==$TORCH_VERSION/" \
  -e "s/^tensorflow\(-cpu\)\{0,1\}==.*/tensorflow\1==$TF_VERSION/" \
  -e "s/^deepspeed==.*/deepspeed==$DEEPSPEED_VERSION/" \
  -e "s/^mpi4py==.*/mpi4py==$MPI4PY_VERSION/" \
  -e "s/^horovod==.*/horovod==$HOROVOD_VERSION/" \
  "$ROOT/constraints.txt" >"$CONSTRAINTS" || die "cannot read $ROOT/constraints.txt (the tested versions)"

# Install the Debian packages not installed yet; `apt-get update` runs only when one is missing.
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
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >"$LOG_DIR/apt.log" 2>&1 || { tail -n 30 "$LOG_DIR/apt.log" >&2; die "apt-get install failed"; }
}

step "1/7 system packages (Open MPI, CMake, compilers)"
apt_ensure libopenmpi-dev openmpi-bin cmake g++ make git

step "2/7 test cluster packages (OpenSSH server, Slurm, munge, pdsh, iproute2)"
# tests/cluster starts its own sshd, munged, slurmctld and slurmd with private configurations
# under a temporary directory; it never uses the system services. On a machine with systemd,
# installing these packages also enables their system services (sshd on port 22, munge).
# iproute2's `ip netns` makes the namespace hosts (tests/cluster/netns.py).
if [ "$TEST_CLUSTER" = 1 ]; then
  apt_ensure openssh-server openssh-client slurm-wlm slurmctld slurmd munge pdsh iproute2
else
  echo "skipped (TOOLKIT_TEST_CLUSTER=$TEST_CLUSTER): tests/cluster will skip"
fi

step "3/7 virtual environment at $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# This machine's pip config names local index folders that may not exist; pip warns about each
# one for every package. Drop those lines so the named steps stay readable.
pip_install() {
  "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" "$@" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
echo "python: $("$VENV/bin/python" --version)"

# Runs one build command with its output in LOG; when it fails, shows the log's tail and stops.
run_logged_build() {
  local what="$1" log="$2"
  shift 2
  if ! "$@" >"$log" 2>&1; then
    echo "---- last 40 lines of $log ----" >&2
    tail -n 40 "$log" >&2
    die "$what build failed; full log: $log"
  fi
}

# Makes sure WHEEL_DIR holds NAME's wheel. When it does not, BUILD_FUNCTION WORK_DIR builds it
# into WORK_DIR/dist, in a temporary folder, and the wheel moves to WHEEL_DIR: the compiled
# engines (scripts/build_*.sh) are built once per cache key and installed from there.
ensure_cached_wheel() {
  local name="$1" wheel_dir="$2" build_function="$3" work
  if ls "$wheel_dir/$name"-*.whl >/dev/null 2>&1; then
    echo "reusing cached wheel in $wheel_dir (no compile)"
    return
  fi
  work="$(mktemp -d)"
  "$build_function" "$work"
  mkdir -p "$wheel_dir"
  mv "$work/dist/$name"-*.whl "$wheel_dir/"
  rm -rf "$work"
}

# TOOLKIT_DEVICE=cuda: a CUDA toolkit made of the registry's NVIDIA packages, so that no CUDA needs
# to be installed on the machine (the image's base has none). torch's CUDA wheel depends on those
# of one CUDA release (the cuda-toolkit package pins them), which install its libraries and
# headers into site-packages/nvidia/cu<major>, laid out as a CUDA toolkit; added here from the
# same release: nvcc and the CUDA C++ headers (cuda-toolkit's nvcc and cccl extras), and the two
# links a compiler expects there (lib64; libcudart.so for -lcudart), and libnccl.so beside NCCL's
# libnccl.so.2 (nvidia/nccl) for Horovod's link. DeepSpeed's ops and Horovod then compile against
# exactly the CUDA and NCCL that torch loads. $VENV/cuda links to the tree: the CUDA_HOME of those
# builds, and of the image (for DeepSpeed's ops compiled on first use).
setup_cuda_toolkit() {
  local torch_cuda site toolkit_version
  torch_cuda="$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)"
  [ -n "$torch_cuda" ] || die "TOOLKIT_DEVICE=cuda, but the torch in the venv is a CPU build" \
    "($("$VENV/bin/python" -m pip show torch 2>/dev/null | sed -n 's/^Version: //p')): pip's" \
    "configuration offers a local CPU wheel (pip config list -v: find-links); run with" \
    "PIP_CONFIG_FILE=/dev/null or a configuration without it, in a new venv (TOOLKIT_VENV)"
  CUDA_MAJOR="${torch_cuda%%.*}"
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  CUDA_TREE="$site/nvidia/cu$CUDA_MAJOR"
  NCCL_HOME="$site/nvidia/nccl"
  toolkit_version="$("$VENV/bin/python" -c 'from importlib.metadata import version as v; print(v("cuda-toolkit"))' 2>/dev/null)" \
    || die "torch $TORCH_VERSION (CUDA $torch_cuda) does not depend on the cuda-toolkit package: this setup takes CUDA's compiler from that package's release"
  [ -d "$CUDA_TREE/lib" ] && [ -f "$NCCL_HOME/include/nccl.h" ] \
    || die "torch's CUDA packages are not where this setup expects them ($CUDA_TREE, $NCCL_HOME)"
  pip_install "cuda-toolkit[nvcc,cccl]==$toolkit_version"
  [ -e "$CUDA_TREE/lib64" ] || ln -s lib "$CUDA_TREE/lib64"
  ln -sfn "libcudart.so.$CUDA_MAJOR" "$CUDA_TREE/lib/libcudart.so"
  ln -sfn libnccl.so.2 "$NCCL_HOME/lib/libnccl.so"
  ln -sfn "$(realpath --relative-to="$VENV" "$CUDA_TREE")" "$VENV/cuda"
  echo "CUDA toolkit $toolkit_version at $VENV/cuda: $("$VENV/cuda/bin/nvcc" --version | tail -n 1)"
}

# tensorflow[and-cuda] depends on CUDA 12's packages while torch's are CUDA 13's. Two of them share
# folders: nvidia-cudnn-cu12 and nvidia-nccl-cu12 install into nvidia/cudnn and nvidia/nccl, as
# torch's nvidia-cudnn-cu13 and nvidia-nccl-cu13 do, and overwrite their libraries. Reinstalled
# after TensorFlow, torch's builds are the ones on disk: what torch and DeepSpeed load and what
# Horovod compiles and links against. TensorFlow loads them too (the same C APIs of newer builds;
# not checked on a GPU here).
restore_torch_cuda_libraries() {
  local package version restore=()
  for package in "nvidia-cudnn-cu$CUDA_MAJOR" "nvidia-nccl-cu$CUDA_MAJOR"; do
    # Its libraries on disk are its own when their digests are those of its RECORD: a re-run,
    # such as the image's second setup.sh run, reinstalls nothing.
    version="$("$VENV/bin/python" - "$package" <<'EOF'
import base64, hashlib, sys
from importlib.metadata import PackageNotFoundError, distribution

try:
    dist = distribution(sys.argv[1])
except PackageNotFoundError:
    sys.exit(f"{sys.argv[1]} is not installed: torch does not depend on it")
for file in dist.files or []:
    path = file.locate()
    if file.hash and "/lib/" in str(file):
        digest = hashlib.sha256(path.read_bytes()).digest() if path.exists() else b""
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != file.hash.value:
            print(dist.version)
            break
EOF
)" || die "cannot check torch's $package"
    if [ -n "$version" ]; then restore+=("$package==$version"); fi
  done
  if ((${#restore[@]} == 0)); then
    echo "torch's cuDNN and NCCL are in place"
    return
  fi
  echo "reinstalling torch's own builds over TensorFlow's: ${restore[*]}"
  pip_install --force-reinstall --no-deps "${restore[@]}"
}

step "4/7 PyTorch $TORCH_VERSION ($DEVICE)"
# Pin exactly: an open range pulls the registry's newest build with several GB of CUDA packages.
# On Linux the registry's torch 2.13.0 wheel is the CUDA build (what the cluster image wants).
# On the CPU machines this project develops on, pip's find-links folder holds the CPU wheel
# (2.13.0+cpu), which pip prefers; no CUDA packages are downloaded.
pip_install "torch==$TORCH_VERSION"
if [ "$DEVICE" = cuda ]; then
  setup_cuda_toolkit
fi

step "5/7 TensorFlow $TF_VERSION, DeepSpeed $DEEPSPEED_VERSION, mpi4py $MPI4PY_VERSION"
if [ "$DEVICE" = cpu ]; then TF_PACKAGE="tensorflow-cpu==$TF_VERSION"; else TF_PACKAGE="tensorflow[and-cuda]==$TF_VERSION"; fi
# ninja: torch compiles DeepSpeed's ops with it, in parallel (scripts/build_deepspeed.sh).
pip_install "$TF_PACKAGE" "mpi4py==$MPI4PY_VERSION" cloudpickle psutil pyyaml packaging ninja
if [ "$DEVICE" = cuda ]; then
  restore_torch_cuda_libraries
fi
# shellcheck source=scripts/build_deepspeed.sh
source "$ROOT/scripts/build_deepspeed.sh"
install_deepspeed

if [ "$DEVICE" = cpu ]; then HOROVOD_WITH="PyTorch, TensorFlow, Gloo, MPI"; else HOROVOD_WITH="PyTorch, TensorFlow, Gloo, MPI, NCCL"; fi
step "6/7 Horovod $HOROVOD_VERSION ($HOROVOD_WITH)"
# shellcheck source=scripts/build_horovod.sh
source "$ROOT/scripts/build_horovod.sh"
install_horovod

step "7/7 the toolkit itself, with its development tools and the GPT example's transformers"
# The Dockerfile installs the engines before it copies the source (TOOLKIT_INSTALL_SELF=0), so a
# change to the code does not rebuild the engines' layer.
if [ "${TOOLKIT_INSTALL_SELF:-1}" = 1 ]; then
  pip_install --no-build-isolation -e "$ROOT[dev,gpt]"
  # pip compiles the bytecode of every package it installs, but not of an editable one's source;
  # where PYTHONDONTWRITEBYTECODE is set (it is on these machines) every rank would compile the
  # toolkit's modules again as it imports them: 165 ms a rank instead of 85 here.
  "$VENV/bin/python" -m compileall -q "$ROOT/toolkit" >/dev/null \
    || die "a toolkit module does not compile; $VENV/bin/python -m compileall -q toolkit names it"
else
  echo "skipped (TOOLKIT_INSTALL_SELF=0)"
fi

echo
echo "[setup] done: $VENV ($DEVICE). Check it with: $VENV/bin/toolkit doctor"
