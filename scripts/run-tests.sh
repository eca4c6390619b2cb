#!/usr/bin/env bash
# Sets up a fresh machine, checks formatting, builds Release and runs the whole suite with ctest,
# then the sanitizer and fuzz runs (scripts/run-sanitizers.sh). Each part prints its duration.
set -euo pipefail
cd "$(dirname "$0")/.."
export LOOM_SETUP_TORCH=1  # the torch tests need PyTorch; the demo does not
source scripts/setup.sh
scripts/check-format.sh
start=$SECONDS
loom_install_torch_package  # pip install . into .venv: the torch tests' loom_torch
loom_configure_and_build -DLOOM_WITH_TORCH=OFF -DLOOM_TORCH_PYTHON="$LOOM_TORCH_PYTHON"
ctest --test-dir "$LOOM_BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900
echo "run-tests: Release build and tests took $((SECONDS - start)) s"
scripts/run-sanitizers.sh
