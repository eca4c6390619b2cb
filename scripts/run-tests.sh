#!/usr/bin/env bash
# Sets up a fresh machine, checks formatting, builds Release and runs the whole suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
scripts/check-format.sh
loom_configure_and_build
ctest --test-dir "$LOOM_BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900
