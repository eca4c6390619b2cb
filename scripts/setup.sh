#!/usr/bin/env bash
# Installs what loom needs to build and test on Debian/Ubuntu (as root, or through sudo), or
# says exactly what to install. Sourced by run-tests.sh and run-demo.sh.
set -euo pipefail

LOOM_PACKAGES=(build-essential cmake ninja-build pkg-config libtbb-dev libopenmpi-dev openmpi-bin
  libboost-graph-dev libboost-program-options-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev graphviz clang-format python3 iproute2
  clang libclang-rt-14-dev xz-utils)  # these three: libFuzzer and oneTBB's source for TSan
# loom_torch (torch/) and its tests: only the test command (LOOM_SETUP_TORCH=1) installs them; the
# library and the demo never need PyTorch.
if [[ ${LOOM_SETUP_TORCH:-0} == 1 ]]; then
  LOOM_PACKAGES+=(libtorch-dev python3-torch pybind11-dev python3-dev python3-pytest)
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

loom_configure_and_build() {
  cmake -S . -B "$LOOM_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build "$LOOM_BUILD_DIR" -j "$JOBS"
}
