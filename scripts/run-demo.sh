#!/usr/bin/env bash
# Sets up a fresh machine, builds Release and runs loom's quick start on 2 ranks: under mpirun
# when Open MPI is there, on the local (threads-as-ranks) backend otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
loom_configure_and_build >/dev/null
if command -v mpirun >/dev/null && grep -q '#define LOOM_HAVE_MPI 1' "$LOOM_BUILD_DIR/generated/include/loom/config.hpp"; then
  echo "== loom quickstart: 2 ranks under mpirun (mpi backend) =="
  mpirun -np 2 --oversubscribe "$LOOM_BUILD_DIR/bin/loom-quickstart"
else
  echo "== loom quickstart: 2 ranks as threads (local backend) =="
  "$LOOM_BUILD_DIR/bin/loom-quickstart" --ranks 2
fi
