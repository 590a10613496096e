# Sourced by setup.sh: installs DeepSpeed with some of its ops compiled into the package (CPU ops
# on cpu, GPU ops on cuda), from a wheel built once and cached.
#
# DeepSpeed compiles its C++ ops on first use by default (JIT), into ~/.cache/torch_extensions.
# That build is keyed by nothing but the op's name, while its compiler flags name the venv's
# include paths: every new venv (each fresh clone, CI's among them) recompiled cpu_adam and
# shm_comm, 155 s of a 339 s setup here, and a venv used after another one had built them
# recompiled them again inside its first job, racing the job's timeouts. Built ahead of time
# (DeepSpeed's documented DS_BUILD_<OP>=1 install), the ops live inside the installed package
# and `OpBuilder.load()` imports them without touching the extension cache.
#
# DeepSpeed compiles its CPU ops with -march=native, so a wheel holding them is only good on CPUs
# with the same instruction set: the cpu cache key carries a digest of the CPU's flags. The cuda
# wheel holds GPU ops, compiled for the architectures in $CUDA_ARCHS (setup.sh), which its key
# names instead.

deepspeed_wheel_dir() {
  local key
  if [ "$DEVICE" = cpu ]; then
    key="cpu$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)"
  else
    key="sm$(echo "$CUDA_ARCHS" | tr -c '0-9A-Za-z.+\n' '_')"
  fi
  echo "$CACHE/wheels/deepspeed-$DEEPSPEED_VERSION-torch$TORCH_VERSION-$DEVICE-$key"
}

# The ops built ahead here, and the one whose presence says a venv has them (deepspeed_installed_with_ops).
#   cpu: cpu_adam serves ZeRO-Offload; shm_comm is the CPU accelerator's collective op, which plain
#     `deepspeed.initialize` scripts load at start (the toolkit's backend skips it).
#   cuda (DS_ACCELERATOR=cuda: there is no GPU to detect at build time): fused_adam, the GPU Adam
#     DeepSpeed's configs name by default, and utils (flatten/unflatten of ZeRO's buffers), for
#     the GPU architectures in $CUDA_ARCHS. cpu_adam stays JIT there, compiled where it is first
#     used: built here it would carry this machine's -march=native into an image run on other
#     CPUs. So do DeepSpeed's other ops (CUDA_HOME in the image lets them compile).
# DS_ENABLE_NINJA: without it setuptools compiles one file at a time (5 minutes here, not 2.4).
deepspeed_build_env() {
  if [ "$DEVICE" = cpu ]; then
    echo DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1 DS_ENABLE_NINJA=1
  else
    echo DS_ACCELERATOR=cuda DS_BUILD_OPS=0 DS_BUILD_FUSED_ADAM=1 DS_BUILD_UTILS=1 DS_ENABLE_NINJA=1 \
      CUDA_HOME="$VENV/cuda" TORCH_CUDA_ARCH_LIST="$CUDA_ARCHS"
  fi
}

deepspeed_marker_op() {
  if [ "$DEVICE" = cpu ]; then echo cpu_adam; else echo fused_adam; fi
}

build_deepspeed_wheel() {
  local work="$1" log
  log="$LOG_DIR/deepspeed-build.log"
  if [ "$DEVICE" = cpu ]; then
    echo "compiling DeepSpeed's CPU ops (about 2.5 minutes on 2 cores); compiler log: $log"
  else
    echo "compiling DeepSpeed's GPU ops for $CUDA_ARCHS; compiler log: $log"
  fi
  # --no-build-isolation: DeepSpeed's setup.py imports torch, which must be the venv's.
  # shellcheck disable=SC2046  # the build variables are words by design
  run_logged_build DeepSpeed "$log" env $(deepspeed_build_env) PATH="$VENV/bin:$PATH" \
    MAX_JOBS="$(nproc)" "$VENV/bin/python" -m pip wheel --no-build-isolation --no-deps \
    --no-cache-dir --no-binary deepspeed -w "$work/dist" "deepspeed==$DEEPSPEED_VERSION"
}

# True when the venv holds this DeepSpeed version with the device's ops compiled in.
deepspeed_installed_with_ops() {
  # DeepSpeed prints its accelerator choice at import.
  "$VENV/bin/python" - "$DEEPSPEED_VERSION" "$(deepspeed_marker_op)" >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version
from deepspeed.git_version_info import installed_ops
sys.exit(version("deepspeed") != sys.argv[1] or not installed_ops.get(sys.argv[2]))
EOF
}

install_deepspeed() {
  if deepspeed_installed_with_ops; then
    echo "already installed: deepspeed $DEEPSPEED_VERSION with its $DEVICE ops compiled in"
    return
  fi
  local wheel_dir
  wheel_dir="$(deepspeed_wheel_dir)"
  ensure_cached_wheel deepspeed "$wheel_dir" build_deepspeed_wheel
  # Its dependencies (pydantic, hjson, ...) come from the registry; torch is already in place.
  pip_install "$wheel_dir"/deepspeed-*.whl
  # A venv that had the same version without the ops keeps it on a plain install.
  deepspeed_installed_with_ops || pip_install --force-reinstall --no-deps "$wheel_dir"/deepspeed-*.whl
  deepspeed_installed_with_ops || die "DeepSpeed installed without its compiled $(deepspeed_marker_op) op"
}
