# Sourced by setup.sh: installs DeepSpeed with its CPU ops compiled into the package, from a
# wheel built once and cached.
#
# DeepSpeed compiles its C++ ops on first use by default (JIT), into ~/.cache/torch_extensions.
# That build is keyed by nothing but the op's name, while its compiler flags name the venv's
# include paths: every new venv (each fresh clone, CI's among them) recompiled cpu_adam and
# shm_comm, 155 s of a 339 s setup here, and a venv used after another one had built them
# recompiled them again inside its first job, racing the job's timeouts. Built ahead of time
# (DeepSpeed's documented DS_BUILD_<OP>=1 install), the ops live inside the installed package
# and `OpBuilder.load()` imports them without touching the extension cache.
#
# The ops are compiled with -march=native (DeepSpeed's choice), so the cached wheel is only
# good on CPUs with the same instruction set: the cache key carries a digest of the CPU's flags.

deepspeed_wheel_dir() {
  local cpu_flags
  cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)"
  echo "$CACHE/wheels/deepspeed-$DEEPSPEED_VERSION-torch$TORCH_VERSION-$DEVICE-cpu$cpu_flags"
}

# Each op DeepSpeed builds here on CPU machines: cpu_adam serves ZeRO-Offload; shm_comm is the
# CPU accelerator's collective op, which plain `deepspeed.initialize` scripts load at start (the
# toolkit's backend skips it). The CUDA image gets cpu_adam only; its GPU ops stay JIT.
# DS_ENABLE_NINJA: without it setuptools compiles one file at a time (5 minutes here, not 2.4).
deepspeed_build_env() {
  if [ "$DEVICE" = cpu ]; then
    echo DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1 DS_ENABLE_NINJA=1
  else
    echo DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_ENABLE_NINJA=1
  fi
}

build_deepspeed_wheel() {
  local work="$1" log
  log="$LOG_DIR/deepspeed-build.log"
  echo "compiling DeepSpeed's CPU ops (about 2.5 minutes on 2 cores); compiler log: $log"
  # --no-build-isolation: DeepSpeed's setup.py imports torch, which must be the venv's.
  # shellcheck disable=SC2046  # the build variables are words by design
  run_logged_build DeepSpeed "$log" env $(deepspeed_build_env) PATH="$VENV/bin:$PATH" \
    MAX_JOBS="$(nproc)" "$VENV/bin/python" -m pip wheel --no-build-isolation --no-deps \
    --no-cache-dir --no-binary deepspeed -w "$work/dist" "deepspeed==$DEEPSPEED_VERSION"
}

# True when the venv holds this DeepSpeed version with cpu_adam compiled in.
deepspeed_installed_with_ops() {
  # DeepSpeed prints its accelerator choice at import.
  "$VENV/bin/python" - "$DEEPSPEED_VERSION" >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version
from deepspeed.git_version_info import installed_ops
sys.exit(version("deepspeed") != sys.argv[1] or not installed_ops.get("cpu_adam"))
EOF
}

install_deepspeed() {
  if deepspeed_installed_with_ops; then
    echo "already installed: deepspeed $DEEPSPEED_VERSION with its CPU ops compiled in"
    return
  fi
  local wheel_dir
  wheel_dir="$(deepspeed_wheel_dir)"
  ensure_cached_wheel deepspeed "$wheel_dir" build_deepspeed_wheel
  # Its dependencies (pydantic, hjson, ...) come from the registry; torch is already in place.
  pip_install "$wheel_dir"/deepspeed-*.whl
  # A venv that had the same version without the ops keeps it on a plain install.
  deepspeed_installed_with_ops || pip_install --force-reinstall --no-deps "$wheel_dir"/deepspeed-*.whl
  deepspeed_installed_with_ops || die "DeepSpeed installed without its compiled CPU ops"
}
