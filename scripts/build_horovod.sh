# Sourced by setup.sh: compiles Horovod 0.28.1 once and caches the wheel.
#
# Horovod's last release does not build as released against PyTorch >= 2.1 and TensorFlow 2.21.
# patch_horovod_source applies two fixes (verified building with torch 2.13.0 and TF 2.21.0):
#   1. C++14 -> C++17 in CMakeLists.txt and horovod/torch/CMakeLists.txt (PyTorch >= 2.1 and
#      TF's bundled absl need C++17; upstream PR 3998 fixed it after the release).
#   2. Drop xla_mpi_ops.cc from horovod/tensorflow/CMakeLists.txt: its XLA headers include
#      highwayhash, which the TF wheel does not ship. It only serves HOROVOD_ENABLE_XLA_OPS.

patch_horovod_source() {
  local src="$1"
  sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/CMakeLists.txt" || die "C++17 patch did not apply to $src/CMakeLists.txt"
  if grep -q 'xla_mpi_ops\.cc' "$src/horovod/tensorflow/CMakeLists.txt"; then
    die "xla_mpi_ops.cc patch did not apply"
  fi
}

horovod_wheel_dir() {
  # The wheel links against torch and TF's C++ ABIs, so the cache key names both.
  echo "$CACHE/wheels/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-tf$TF_VERSION-$DEVICE"
}

build_horovod_wheel() {
  local work="$1" log
  log="$LOG_DIR/horovod-build.log"
  echo "compiling Horovod (about 6 minutes on 2 cores); compiler log: $log"
  "$VENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: \
    -d "$work" "horovod==$HOROVOD_VERSION"
  tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
  patch_horovod_source "$work/horovod-$HOROVOD_VERSION"
  local gpu_ops=()
  [ "$DEVICE" = cuda ] && gpu_ops=(HOROVOD_GPU_OPERATIONS=NCCL)
  run_logged_build Horovod "$log" env --chdir="$work/horovod-$HOROVOD_VERSION" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" "${gpu_ops[@]}" PATH="$VENV/bin:$PATH" \
    "$VENV/bin/python" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$work/dist" .
}

install_horovod() {
  if "$VENV/bin/python" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HOROVOD_VERSION')" 2>/dev/null \
     && "$VENV/bin/python" -c "import horovod.torch, horovod.tensorflow" 2>/dev/null; then
    echo "already installed: horovod $HOROVOD_VERSION"
    return
  fi
  local wheel_dir
  wheel_dir="$(horovod_wheel_dir)"
  ensure_cached_wheel horovod "$wheel_dir" build_horovod_wheel
  pip_install --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
}
