# The image people run in clusters: CUDA, GPU builds of the same pins (Horovod with NCCL),
# Open MPI and an SSH server for multi-node MPI, the toolkit installed, `toolkit doctor` by default.
#
# It installs through the same scripts/setup.sh that CI runs, with TOOLKIT_DEVICE=cuda, so the
# image and CI cannot drift apart. tests/test_pins.py checks that the pins below match
# scripts/setup.sh and pyproject.toml.
#
#   docker build -t toolkit:latest .
#   docker run --gpus all toolkit:latest                       # toolkit doctor
#   docker run --gpus all toolkit:latest toolkit launch --spec train.yaml -- train.py
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04

ARG TORCH_VERSION=2.13.0
ARG TF_VERSION=2.21.0
ARG DEEPSPEED_VERSION=0.19.8
ARG MPI4PY_VERSION=4.1.2
ARG HOROVOD_VERSION=0.28.1

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHON=python3.11 \
    TOOLKIT_DEVICE=cuda \
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
COPY . /opt/toolkit
# Open MPI, CMake, torch, TF, DeepSpeed, mpi4py and Horovod (NCCL) exactly as CI installs them.
RUN TORCH_VERSION=$TORCH_VERSION TF_VERSION=$TF_VERSION DEEPSPEED_VERSION=$DEEPSPEED_VERSION \
    MPI4PY_VERSION=$MPI4PY_VERSION HOROVOD_VERSION=$HOROVOD_VERSION bash scripts/setup.sh \
    && rm -rf /root/.cache/pip

EXPOSE 22
CMD ["toolkit", "doctor"]
