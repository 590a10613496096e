# The image people run in clusters: CUDA, GPU builds of the same pins (Horovod with NCCL),
# Open MPI and an SSH server for multi-node MPI, the toolkit installed, `toolkit doctor` by default.
#
# It installs through the same scripts/setup.sh that CI runs, with TOOLKIT_DEVICE=cuda, so the
# image and CI cannot drift apart. tests/test_pins.py checks that the pins below match
# scripts/setup.sh and constraints.txt.
#
#   docker build -t toolkit:latest .
#   docker run --gpus all toolkit:latest                       # toolkit doctor
#   docker run --gpus all toolkit:latest toolkit launch --spec train.yaml -- train.py
#
# The CPU variant takes another base and device; scripts/build_image.sh builds it with podman
# from a Debian bookworm base made locally (no registry) and runs jobs inside it:
#   podman build --build-arg BASE_IMAGE=localhost/debian-base:bookworm \
#       --build-arg TOOLKIT_DEVICE=cpu -t toolkit:cpu .
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04
FROM ${BASE_IMAGE}

# cuda or cpu: which builds of the pins scripts/setup.sh installs.
ARG TOOLKIT_DEVICE=cuda

ARG TORCH_VERSION=2.13.0
ARG TF_VERSION=2.21.0
ARG DEEPSPEED_VERSION=0.19.8
ARG MPI4PY_VERSION=4.1.2
ARG HOROVOD_VERSION=0.28.1

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHON=python3.11 \
    TOOLKIT_DEVICE=${TOOLKIT_DEVICE} \
    TOOLKIT_VENV=/opt/toolkit/.venv \
    TOOLKIT_CACHE=/opt/toolkit-cache \
    PATH=/opt/toolkit/.venv/bin:$PATH

# Python 3.11 for the venv; an SSH server so mpirun and horovodrun can reach the other nodes.
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev openssh-server openssh-client \
    && mkdir -p /var/run/sshd \
    && sed -i 's/^#\?PermitRootLogin.*/PermitRootLogin prohibit-password/' /etc/ssh/sshd_config \
    && echo "    StrictHostKeyChecking no" >> /etc/ssh/ssh_config \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/toolkit
# Open MPI, CMake, torch, TF, DeepSpeed, mpi4py and Horovod (NCCL on cuda) exactly as CI installs
# them, without the test cluster's packages (Slurm, munge). Only the setup scripts and
# constraints.txt (the tested versions they install through) are copied first, so a change to the
# toolkit's code does not rebuild this layer. When the build mounts a wheel cache at
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
