#!/usr/bin/env bash
# Installs what loom needs to build and test on Debian/Ubuntu (as root, or through sudo), or
# says exactly what to install. Sourced by run-tests.sh and run-demo.sh.
set -euo pipefail

LOOM_PACKAGES=(build-essential cmake ninja-build pkg-config libtbb-dev libopenmpi-dev openmpi-bin
  libucx-dev libboost-graph-dev libboost-program-options-dev libgtest-dev libgmock-dev
  libbenchmark-dev libopenblas-dev graphviz clang-format python3 iproute2
  clang libclang-rt-14-dev xz-utils  # these three: libFuzzer and oneTBB's source for TSan
  ccache)
# loom_torch (torch/) and its tests: only the test command (LOOM_SETUP_TORCH=1) needs them; the
# library and the demo never need PyTorch. torch itself comes from PyPI into .venv (below).
if [[ ${LOOM_SETUP_TORCH:-0} == 1 ]]; then
  LOOM_PACKAGES+=(python3-dev python3-venv)
fi

missing=()
for pkg in "${LOOM_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "loom: installing ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "loom: please install: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

# Open MPI refuses root unless told; the tests and the demo run as whoever calls them.
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export LOOM_BUILD_DIR=${LOOM_BUILD_DIR:-build}
JOBS=$(nproc)

# The compiler, and ccache in front of it, for the Release build and the pip build of loom_torch
# alike: the same compiler name, flags and loom configuration make the same command lines, and
# with CCACHE_BASEDIR at the repository (both build directories one level below it) ccache hands
# the library objects one build compiled to the other (the test command: about 100 of 104 hits,
# the pip build's share of libloom, about 2 minutes on 2 cores, saved).
LOOM_COMPILER_DEFINES=(CMAKE_CXX_COMPILER=g++ CMAKE_C_COMPILER=gcc)
if command -v ccache >/dev/null; then
  LOOM_COMPILER_DEFINES+=(CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
    CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$PWD CCACHE_DIR=${CCACHE_DIR:-$PWD/build-ccache} CCACHE_NOHASHDIR=1
fi

loom_configure_and_build() {
  cmake -S . -B "$LOOM_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "${LOOM_COMPILER_DEFINES[@]/#/-D}" "$@"
  cmake --build "$LOOM_BUILD_DIR" -j "$JOBS"
}

# The PyTorch user's install, for the torch tests: a virtual environment of the project's own
# (.venv) with the torch pip installs, then `pip install --no-build-isolation .`, which builds
# libloom and loom_torch against that torch (pyproject.toml): the one build of loom_torch.
# Sets LOOM_TORCH_PYTHON, the python whose environment has it. LOOM_TORCH_SPEC picks the torch
# (default torch==2.13.0, a CPU build).
loom_install_torch_package() {
  local venv=${LOOM_VENV:-$PWD/.venv} spec=${LOOM_TORCH_SPEC:-torch==2.13.0}
  local start=$SECONDS
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  # expecttest: torch.testing._internal imports it (PyTorch's own distributed tests).
  # pytorch-lightning and mpi4py: Lightning's DDPStrategy on loom, under Lightning's launcher,
  # torchrun and mpirun (Lightning finds mpirun's ranks through mpi4py).
  if ! "$venv/bin/python" -c \
    "import torch, pytest, numpy, scikit_build_core, expecttest, pytorch_lightning, mpi4py" \
    2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check "$spec" pytest numpy expecttest \
      'scikit-build-core>=0.10' pytorch-lightning mpi4py
  fi
  # build-pip: one level below the repository, as the Release build's directory (ccache, above);
  # LOOM_WITH_CUDA=AUTO: the Release build's configuration (pyproject.toml's default is OFF).
  local defines=("${LOOM_COMPILER_DEFINES[@]}" LOOM_WITH_CUDA=AUTO)
  # A CUDA build of torch brings its NCCL (pip's nvidia-nccl-cu13): loom's nccl backend is built
  # against that one, which torch has loaded when loom_torch is imported (never a second copy).
  local nccl
  nccl=$("$venv/bin/python" -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else n.__path__[0])' 2>/dev/null) || true
  if [[ -n $nccl && -f $nccl/include/nccl.h && -f $nccl/lib/libnccl.so.2 ]]; then
    defines+=(NCCL_INCLUDE_DIR="$nccl/include" NCCL_LIBRARY="$nccl/lib/libnccl.so.2")
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
    -C build-dir="${LOOM_PIP_BUILD_DIR:-build-pip}" "${defines[@]/#/-Ccmake.define.}" .
  export LOOM_TORCH_PYTHON=$venv/bin/python
  echo "loom: loom_torch installed in $venv ($("$LOOM_TORCH_PYTHON" -c \
    'import torch; print("torch", torch.__version__)'), $((SECONDS - start)) s)"
}
