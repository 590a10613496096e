#!/usr/bin/env bash
# The GPU check (docs/gpu/README.md): the GPT example at GPT-2 small's shape on one GPU under
# DDP, FSDP and DeepSpeed ZeRO-1, 2 and 3, held to a plain torch loop; the report into OUTDIR.
#
#   bash scripts/gpu_check.sh OUTDIR            # on the lent GPU machine, with .whl carried
#   bash scripts/gpu_check.sh --dry-run OUTDIR  # here, on a CPU: everything but the GPU
#
# On the GPU machine it installs the carried wheels (scripts/gpu_wheels.sh builds them) into
# /tmp/site, runs hvd_examples/gpu_check.py with that machine's python3 (PyTorch 2.11, CUDA 13),
# then the gpu-marked tests (tests/test_gpu_check.py), and writes OUTDIR/gpu_check.json,
# gpu_check.md and check.log (everything both printed). Exit status 0 when both passed. Without
# a GPU it refuses: one line on stderr, exit status 2. TOOLKIT_GPU_WHEELS names another
# wheelhouse than .whl.
#
# The dry run checks on a CPU what the GPU run needs: the wheelhouse exists and fits the device
# tool's 64 MiB with the working tree; the wheels install for CPython 3.12 on manylinux (into a
# scratch folder, with pip's --python-version); and the check runs at its tiny size (a 2-layer
# model, 4 steps, device auto: the CPU here) through the plain loop and every engine, with this
# checkout's .venv (PYTHON). It prints how long that took beside the GPU run's time budget.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELHOUSE="${TOOLKIT_GPU_WHEELS:-$ROOT/.whl}"
CHECK="$ROOT/hvd_examples/gpu_check.py"
BUDGET_S=480  # the whole GPU run: the install, the check (gpu_check.py's own 300) and the tests
TESTS_S=150  # the gpu-marked tests after the check
PLATFORMS=(
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
)

refuse() { printf 'gpu_check: %s\n' "$*" >&2; exit 2; }
usage() { refuse "usage: bash scripts/gpu_check.sh [--dry-run] OUTDIR"; }

dry_run=0
if [ "${1:-}" = --dry-run ]; then dry_run=1; shift; fi
[ $# -eq 1 ] || usage
OUT="$1"

install_wheels() {  # install_wheels PYTHON TARGET [pip flags...]
  local python="$1" target="$2"
  shift 2
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$target" "$@" "$WHEELHOUSE"/*.whl
}

gpu_visible() {
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' \
    && python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null
}

if [ "$dry_run" = 1 ]; then
  PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
  [ -x "$PYTHON" ] || refuse "no Python at $PYTHON: run make setup first, or set PYTHON"
  [ -d "$WHEELHOUSE" ] || refuse "no wheelhouse at $WHEELHOUSE: run bash scripts/gpu_wheels.sh"
  started=$SECONDS
  echo "== the wheelhouse and the working tree against the device tool's 64 MiB"
  "$PYTHON" "$CHECK" wheels "$WHEELHOUSE"
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  echo "== installing the wheels for CPython 3.12 (manylinux) into a scratch folder"
  install_wheels "$PYTHON" "$scratch/site" --python-version 3.12 --implementation cp \
    --only-binary=:all: "${PLATFORMS[@]}"
  echo "installed: $(cd "$scratch/site" && ls -d ./*.dist-info | sed 's|^\./||; s|\.dist-info$||' | tr '\n' ' ')"
  echo "== the check at its tiny size on this machine's device"
  status=0
  "$PYTHON" "$CHECK" check "$OUT" --size tiny || status=$?
  echo "dry run: $((SECONDS - started)) s here; the GPU run has ${BUDGET_S} s for the install, the check and the gpu tests"
  exit "$status"
fi

gpu_visible || refuse "no GPU visible (nvidia-smi lists none, or python3's torch sees none); run it on the lent GPU machine, or use --dry-run here"
[ -d "$WHEELHOUSE" ] || refuse "no wheelhouse at $WHEELHOUSE: build it with bash scripts/gpu_wheels.sh and carry .whl"
mkdir -p "$OUT"
install_wheels python3 /tmp/site
export PYTHONPATH="/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/check.log"
status=0
python3 "$CHECK" check "$OUT" 2>&1 | tee -a "$OUT/check.log" || status=1
timeout "$TESTS_S" python3 -m pytest -q -p no:cacheprovider -m gpu "$ROOT/tests/test_gpu_check.py" \
  2>&1 | tee -a "$OUT/check.log" || status=1
exit "$status"
