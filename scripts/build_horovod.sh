# Sourced by setup.sh: compiles Horovod 0.28.1 once and caches the wheel.
#
# Horovod's last release does not build as released against PyTorch >= 2.1 and TensorFlow 2.21.
# patch_horovod_source applies two fixes (verified building with torch 2.13.0 and TF 2.21.0):
#   1. C++14 -> C++17 in CMakeLists.txt and horovod/torch/CMakeLists.txt (PyTorch >= 2.1 and
#      TF's bundled absl need C++17; upstream PR 3998 fixed it after the release).
#   2. Drop xla_mpi_ops.cc from horovod/tensorflow/CMakeLists.txt: its XLA headers include
#      highwayhash, which the TF wheel does not ship. It only serves HOROVOD_ENABLE_XLA_OPS.
# With TOOLKIT_DEVICE=cuda, three more (verified building with nvcc 13.0 from the registry's wheels):
#   3. A run path $ORIGIN/../../nvidia/nccl/lib on Horovod's libraries: they link the registry's
#      libnccl.so.2, which sits in site-packages/nvidia/nccl/lib, two levels above them, and
#      horovod.tensorflow is imported without torch, which would have loaded it first.
#   4. horovod/tensorflow/mpi_ops.cc takes a TF stream's CUDA stream through
#      stream_executor::gpu::AsGpuStreamValue, which TF 2.21 no longer exports: the import failed
#      with "undefined symbol: _ZN15stream_executor3gpu16AsGpuStreamValueEPNS_6StreamE". TF's
#      Stream::platform_specific_handle() gives the same stream; the patch defines the function
#      with it, after the header that declares Stream.
#   5. Link horovod.tensorflow's library with CUDA's static runtime (CUDA::cudart_static, as
#      Horovod's own default CMAKE_CUDA_RUNTIME_LIBRARY=Static intends): it calls the CUDA
#      runtime (cudaSetDevice, its kernels' registration) but linked none, counting on a CUDA
#      runtime that TF loads; TF's is CUDA 12's, and only where a GPU is seen.

patch_horovod_source() {
  local src="$1"
  sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/CMakeLists.txt" || die "C++17 patch did not apply to $src/CMakeLists.txt"
  if grep -q 'xla_mpi_ops\.cc' "$src/horovod/tensorflow/CMakeLists.txt"; then
    die "xla_mpi_ops.cc patch did not apply"
  fi
  if [ "$DEVICE" = cuda ]; then
    sed -i 's|^project(horovod CXX)$|&\nset(CMAKE_BUILD_RPATH "$ORIGIN/../../nvidia/nccl/lib")|' "$src/CMakeLists.txt"
    grep -q 'CMAKE_BUILD_RPATH' "$src/CMakeLists.txt" || die "run path patch did not apply to $src/CMakeLists.txt"
    local ops="$src/horovod/tensorflow/mpi_ops.cc"
    sed -i -e '/^GpuStreamHandle AsGpuStreamValue(Stream\* stream);$/d' \
      -e 's|^#include "tensorflow/compiler/xla/stream_executor/stream.h"$|&\nnamespace stream_executor { namespace gpu {\ninline GpuStreamHandle AsGpuStreamValue(Stream* stream) {\n  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);\n} } }|' \
      "$ops"
    grep -q 'platform_specific_handle' "$ops" || die "stream patch did not apply to $ops"
    local tf_cmake="$src/horovod/tensorflow/CMakeLists.txt"
    sed -i 's|^set(CMAKE_CXX_FLAGS "${Tensorflow_COMPILE_FLAGS} ${CMAKE_CXX_FLAGS}")$|if(HAVE_CUDA)\n    list(APPEND TF_LINKER_LIBS CUDA::cudart_static)\nendif()\n&|' "$tf_cmake"
    grep -q 'CUDA::cudart_static' "$tf_cmake" || die "CUDA runtime patch did not apply to $tf_cmake"
  fi
}

# Horovod's HOROVOD_BUILD_CUDA_CC_LIST from setup.sh's $CUDA_ARCHS: "8.0;9.0+PTX" is "80,90"
# (Horovod adds the PTX of the highest one itself).
horovod_cuda_cc_list() {
  echo "$CUDA_ARCHS" | tr ';' '\n' | sed -e 's/+PTX$//' -e 's/\.//' | paste -sd, -
}

horovod_wheel_dir() {
  # The wheel links against torch and TF's C++ ABIs, so the cache key names both; a cuda build
  # also the GPU architectures it was compiled for.
  local key="$DEVICE"
  [ "$DEVICE" = cuda ] && key="cuda-sm$(horovod_cuda_cc_list | tr , _)"
  echo "$CACHE/wheels/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-tf$TF_VERSION-$key"
}

build_horovod_wheel() {
  local work="$1" log
  log="$LOG_DIR/horovod-build.log"
  if [ "$DEVICE" = cpu ]; then
    echo "compiling Horovod (about 6 minutes on 2 cores); compiler log: $log"
  else
    echo "compiling Horovod with CUDA (about 16 minutes on 2 cores); compiler log: $log"
  fi
  "$VENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: \
    -d "$work" "horovod==$HOROVOD_VERSION"
  tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
  patch_horovod_source "$work/horovod-$HOROVOD_VERSION"
  local gpu_ops=()
  if [ "$DEVICE" = cuda ]; then
    # NCCL for GPU tensors, from the registry's NCCL (shared: the wheel has no static library);
    # nvcc and CUDA's headers from setup.sh's toolkit ($VENV/cuda), which torch's build also
    # reads (CUDA_HOME) when Horovod asks it whether it has CUDA.
    gpu_ops=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$NCCL_HOME" HOROVOD_NCCL_LINK=SHARED
      HOROVOD_CUDA_HOME="$VENV/cuda" CUDA_HOME="$VENV/cuda"
      HOROVOD_BUILD_CUDA_CC_LIST="$(horovod_cuda_cc_list)")
    echo "with NCCL, CUDA kernels for compute capabilities $(horovod_cuda_cc_list)"
  fi
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
