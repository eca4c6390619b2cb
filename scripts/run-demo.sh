#!/usr/bin/env bash
# Sets up a fresh machine, builds Release and runs loom's training-step demo on 2 ranks (an MLP,
# data-parallel, gradients bucketed and all-reduced while backward runs): under mpirun when
# Open MPI is there, on the local (threads-as-ranks) backend otherwise. Prints the loss, step
# time, overlap efficiency and why each bucket was or wasn't hidden, where the DOT graph and
# every rank's Chrome trace went, and merges the traces into one timeline (JSON and SVG).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
loom_configure_and_build >/dev/null
demo_dir="$LOOM_BUILD_DIR/demo"
mkdir -p "$demo_dir"
args=(--steps 12 --depth 6 --width 384 --batch 128 --bucket-cap-kb 512 --first-bucket-kb 128
      --dot "$demo_dir/train_step.dot" --trace "$demo_dir/train_step_trace.json")
if [[ ! -x "$LOOM_BUILD_DIR/bin/loom-train-step" ]]; then
  echo "run-demo: loom-train-step was not built (it needs OpenBLAS: apt-get install libopenblas-dev)" >&2
  exit 1
fi
if command -v mpirun >/dev/null && grep -q '#define LOOM_HAVE_MPI 1' "$LOOM_BUILD_DIR/generated/include/loom/config.hpp"; then
  echo "== loom train step: 2 ranks under mpirun (mpi backend) =="
  mpirun -np 2 --oversubscribe "$LOOM_BUILD_DIR/bin/loom-train-step" "${args[@]}"
else
  echo "== loom train step: 2 ranks as threads (local backend) =="
  "$LOOM_BUILD_DIR/bin/loom-train-step" --ranks 2 "${args[@]}"
fi
echo "== both ranks on one timeline =="
"$LOOM_BUILD_DIR/bin/loom-trace-merge" -o "$demo_dir/job_trace.json" --svg "$demo_dir/job_trace.svg" \
  "$demo_dir"/train_step_trace.rank*.json
echo "== the same step in sequential, ddp and loom modes: build/bin/loom-overlap --help =="
