#!/usr/bin/env bash
# Builds loom with sanitizers and runs the suite under them; called by run-tests.sh.
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (g++), the whole ctest suite (but the
#         install test: a consumer built without -fsanitize cannot load an instrumented libloom).
#   tsan: ThreadSanitizer (g++), the concurrency-heavy tests: executor, progress engine, pinned
#         pool, local backend, and the local fault and soak tests.
#   fuzz: libFuzzer (clang) over the parsers of LOOM_* environment variables, time-bounded.
# Usage: scripts/run-sanitizers.sh [asan] [tsan] [fuzz]   (default: all three, in that order)
# Each part prints how long it took; a finding fails the run (no part continues past one).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

parts=("$@")
((${#parts[@]})) || parts=(asan tsan fuzz)
suppressions=$PWD/tests/sanitizers

# -O1 keeps stack traces readable and the instrumented build quick; -g1 gives line numbers.
sanitizer_flags=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS_RELEASE=-O1 -g1"
  "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -g1")

run_asan() {
  # float-cast-overflow: g++ leaves it out of "undefined" (clang includes it).
  cmake -S . -B build-asan -G Ninja "${sanitizer_flags[@]}" \
    -DLOOM_SANITIZE=address,undefined,float-cast-overflow \
    -DLOOM_BUILD_EXAMPLES=OFF
  cmake --build build-asan -j "$JOBS"
  # halt_on_error + print_stacktrace: a UBSan finding fails the test instead of scrolling by.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    LSAN_OPTIONS=suppressions=$suppressions/lsan.supp:print_suppressions=0 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" --timeout 1200 -E '^install_consumer$'
}


run_tsan() {
  cmake -S . -B build-tsan -G Ninja "${sanitizer_flags[@]}" -DLOOM_SANITIZE=thread \
    -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_BUILD_BENCH=OFF
  # tests/CMakeLists.txt lists the binaries (LOOM_TSAN_TESTS): their tests are labelled tsan.
  cmake --build build-tsan -j "$JOBS" --target loom_tsan_tests
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$suppressions/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$JOBS" --timeout 1200 -L tsan
}

run_fuzz() {
  local clang_rt
  clang_rt=$(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
  if [[ ! -f $clang_rt ]]; then
    echo "run-sanitizers: libFuzzer not found (apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
  fi
  cmake -S . -B build-fuzz -G Ninja "${sanitizer_flags[@]}" -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DLOOM_SANITIZE=address,undefined -DLOOM_FUZZ=ON \
    -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_BUILD_BENCH=OFF -DLOOM_WITH_CUDA=OFF
  cmake --build build-fuzz -j "$JOBS" --target loom_fuzzers
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-fuzz --output-on-failure -j "$JOBS" -L fuzz
}

for part in "${parts[@]}"; do
  start=$SECONDS
  case $part in
    asan) run_asan ;;
    tsan) run_tsan ;;
    fuzz) run_fuzz ;;
    *)
      echo "run-sanitizers: unknown part '$part' (asan, tsan or fuzz)" >&2
      exit 2
      ;;
  esac
  echo "run-sanitizers: $part took $((SECONDS - start)) s"
done
