# The image people run in clusters: PyTorch with CUDA, TensorFlow with CUDA, DeepSpeed with GPU ops
# compiled in, Horovod with NCCL, Open MPI and an SSH server for multi-node MPI, the toolkit
# installed, `toolkit doctor` by default.
#
# It installs through the same scripts/setup.sh that CI runs, with TOOLKIT_DEVICE=cuda, so the
# image and CI cannot drift apart. tests/test_pins.py checks that the pins below match
# scripts/setup.sh and constraints.txt.
#
# The base is plain Debian bookworm: CUDA's compiler, headers and libraries come from the
# package registry's NVIDIA packages, the ones PyTorch's CUDA wheel itself depends on (setup.sh
# adds nvcc and the headers of the same CUDA release), so no CUDA base image is needed and the
# compiled engines are built against exactly the CUDA that torch loads. The host's driver is
# all a GPU machine needs (the NVIDIA container toolkit mounts it).
#
#   docker build -t toolkit:latest .
#   docker run --gpus all toolkit:latest                       # toolkit doctor
#   docker run --gpus all toolkit:latest toolkit launch --spec train.yaml -- train.py
#
# scripts/build_image.sh builds both variants with podman, from a Debian bookworm base made
# locally (no registry), and runs checks inside them (docs/container.md):
#   bash scripts/build_image.sh        # the CPU variant (TOOLKIT_DEVICE=cpu), localhost/toolkit:cpu
#   bash scripts/build_image.sh cuda   # this default variant, localhost/toolkit:cuda
ARG BASE_IMAGE=debian:bookworm
FROM ${BASE_IMAGE}

# cuda or cpu: which builds of the pins scripts/setup.sh installs.
ARG TOOLKIT_DEVICE=cuda

# The pip configuration of the RUN steps, and the only one they read: pip reads no configuration
# file at all when PIP_CONFIG_FILE names os.devnull. An image build must not depend on what a
# build machine's pip configuration happens to say; scripts/build_image.sh passes a file it
# wrote and mounted (the CA bundle to trust; for the CPU variant, the folder of the CPU torch
# wheel). An ARG is an environment variable of the RUN steps only, not of the image.
ARG PIP_CONFIG_FILE=/dev/null
# cuda variant: the GPU architectures DeepSpeed's ops and Horovod's kernels are compiled for
# (setup.sh's default when empty: "8.0;9.0+PTX", A100 and H100/H200 plus PTX for newer GPUs).
ARG TORCH_CUDA_ARCH_LIST=

ARG TORCH_VERSION=2.13.0
ARG TF_VERSION=2.21.0
ARG DEEPSPEED_VERSION=0.19.8
ARG MPI4PY_VERSION=4.1.2
ARG HOROVOD_VERSION=0.28.1

# CUDA_HOME: the cuda variant's CUDA toolkit, the registry's NVIDIA packages inside the venv (a
# link setup.sh makes), for DeepSpeed's ops compiled on first use; the CPU variant's torch has
# no CUDA and ignores it. NVIDIA_DRIVER_CAPABILITIES: what the NVIDIA container toolkit mounts
# from the host's driver (the CUDA base images set the same). TOOLKIT_DEVICE comes after the
# first RUN step (below).
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHON=python3.11 \
    TOOLKIT_VENV=/opt/toolkit/.venv \
    TOOLKIT_CACHE=/opt/toolkit-cache \
    CUDA_HOME=/opt/toolkit/.venv/cuda \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PATH=/opt/toolkit/.venv/bin:$PATH

# Python 3.11 for the venv; an SSH server so mpirun and horovodrun can reach the other nodes.
RUN apt-get update && apt-get install -y --no-install-recommends \
        ca-certificates python3.11 python3.11-venv python3.11-dev openssh-server openssh-client \
    && mkdir -p /var/run/sshd \
    && sed -i 's/^#\?PermitRootLogin.*/PermitRootLogin prohibit-password/' /etc/ssh/sshd_config \
    && echo "    StrictHostKeyChecking no" >> /etc/ssh/ssh_config \
    && rm -rf /var/lib/apt/lists/*

# Set from the ARG only after a RUN step: podman 4.3's layer cache keys an ENV step by its text,
# not by the build arguments it expands, so before any RUN (whose key does include them) a cuda
# build reused a cpu build's ENV layer and its TOOLKIT_DEVICE=cpu. tests/test_pins.py keeps it so.
ENV TOOLKIT_DEVICE=${TOOLKIT_DEVICE}

WORKDIR /opt/toolkit
# Open MPI, CMake, torch, TF, DeepSpeed, mpi4py and Horovod (NCCL on cuda) exactly as CI installs
# them, without the test cluster's packages (Slurm, munge); on cuda also CUDA's compiler and
# headers, from the registry. Only the setup scripts and constraints.txt (the tested versions they
# install through) are copied first, so a change to the toolkit's code does not rebuild this layer. When the build mounts a wheel cache at
# $TOOLKIT_CACHE/wheels (scripts/build_image.sh does), setup.sh reuses its Horovod and DeepSpeed
# wheels instead of compiling them.
COPY scripts/setup.sh scripts/build_horovod.sh scripts/build_deepspeed.sh /opt/toolkit/scripts/
COPY constraints.txt /opt/toolkit/
RUN TOOLKIT_INSTALL_SELF=0 TOOLKIT_TEST_CLUSTER=0 \
    TORCH_VERSION=$TORCH_VERSION TF_VERSION=$TF_VERSION DEEPSPEED_VERSION=$DEEPSPEED_VERSION \
    MPI4PY_VERSION=$MPI4PY_VERSION HOROVOD_VERSION=$HOROVOD_VERSION bash scripts/setup.sh \
    && rm -rf /root/.cache/pip /var/lib/apt/lists/*

COPY . /opt/toolkit
# The same script again: every engine step is a no-op now; it installs the toolkit itself.
RUN TOOLKIT_TEST_CLUSTER=0 \
    TORCH_VERSION=$TORCH_VERSION TF_VERSION=$TF_VERSION DEEPSPEED_VERSION=$DEEPSPEED_VERSION \
    MPI4PY_VERSION=$MPI4PY_VERSION HOROVOD_VERSION=$HOROVOD_VERSION bash scripts/setup.sh \
    && rm -rf /root/.cache/pip

EXPOSE 22
CMD ["toolkit", "doctor"]
