#!/usr/bin/env bash
# Builds the wheelhouse the GPU check carries to the lent GPU machine (docs/gpu/README.md): the
# packages it needs there beyond what that machine has (Python 3.12 with PyTorch 2.11, CUDA 13,
# NCCL, nvcc, ninja, transformers; no DeepSpeed, no pydantic, no network).
#
#   bash scripts/gpu_wheels.sh [FOLDER]      # default $TOOLKIT_GPU_WHEELS, else .whl (git-ignored)
#
# - pydantic with pydantic-core, annotated-types, typing-inspection and typing-extensions
#   (pydantic-core 2.50 needs typing-extensions >= 4.16, newer than the machine may have), and
#   PyYAML: what the toolkit imports; hjson: DeepSpeed's one requirement the machine lacks.
#   Downloaded as CPython 3.12 manylinux wheels, at the versions this checkout's .venv runs its
#   tests with.
# - DeepSpeed at constraints.txt's version: a source distribution, built here as a pure-Python
#   wheel (DS_BUILD_OPS=0; cached in $TOOLKIT_CACHE/wheels). The check uses no compiled op; one
#   that a later use needs is JIT-compiled there, where nvcc and ninja are.
#
# The folder is made anew each time (two versions of one package stop the install there). Then
# `gpu_check.py wheels` lists the wheels, checks every wheel's requirements against the wheels and
# the machine's packages, and exits 1 when the wheels and the working tree together exceed the
# device tool's 64 MiB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WHEELHOUSE="${1:-${TOOLKIT_GPU_WHEELS:-$ROOT/.whl}}"
CACHE="${TOOLKIT_CACHE:-$HOME/.cache/toolkit}"
BINARY=(pydantic pydantic-core annotated-types typing-inspection typing-extensions pyyaml hjson)
# pip matches each manylinux tag exactly, so every tag these x86-64 wheels may carry is named.
PLATFORMS=(
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
)

die() { printf 'gpu_wheels: %s\n' "$*" >&2; exit 1; }
# pip's configuration on these machines names local index folders that lack most packages.
quiet_pip() { "$PYTHON" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor' >&2); }

[ -x "$PYTHON" ] || die "no Python at $PYTHON: run make setup first, or set PYTHON"
installed_version() {
  "$PYTHON" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" \
    || die "$1 is not installed in $PYTHON's environment: run make setup"
}
if [ -d "$WHEELHOUSE" ] && find "$WHEELHOUSE" -mindepth 1 ! -name '*.whl' | grep -q .; then
  die "$WHEELHOUSE holds more than wheels: not replacing it (name an empty or new folder)"
fi
DEEPSPEED_VERSION="$(sed -n 's/^deepspeed==//p' "$ROOT/constraints.txt")"
[ -n "$DEEPSPEED_VERSION" ] || die "constraints.txt pins no deepspeed version"

pins=()
for name in "${BINARY[@]}"; do pins+=("$name==$(installed_version "$name")"); done

fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT
echo "downloading ${pins[*]}"
quiet_pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$fresh" "${pins[@]}"

built="$CACHE/wheels/deepspeed-$DEEPSPEED_VERSION-pure"
if [ ! -f "$built/deepspeed-$DEEPSPEED_VERSION-py3-none-any.whl" ]; then
  echo "building deepspeed $DEEPSPEED_VERSION as a pure-Python wheel (DS_BUILD_OPS=0)"
  mkdir -p "$built"
  # --no-build-isolation: DeepSpeed's setup.py imports torch, the venv's.
  DS_BUILD_OPS=0 quiet_pip wheel -q --no-deps --no-build-isolation --no-cache-dir \
    --no-binary deepspeed -w "$built" "deepspeed==$DEEPSPEED_VERSION"
fi
cp "$built/deepspeed-$DEEPSPEED_VERSION-py3-none-any.whl" "$fresh/"

rm -rf "$WHEELHOUSE"
mkdir -p "$WHEELHOUSE"
mv "$fresh"/*.whl "$WHEELHOUSE/"
echo "wheelhouse $WHEELHOUSE:"
"$PYTHON" "$ROOT/hvd_examples/gpu_check.py" wheels "$WHEELHOUSE"
