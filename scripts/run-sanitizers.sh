#!/usr/bin/env bash
# Builds loom with sanitizers and runs the suite under them; called by run-tests.sh.
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (g++), the whole ctest suite (but the
#         install test: a consumer built without -fsanitize cannot load an instrumented libloom;
#         and the fault matrices (mpi and ucx), label `fault`: it stops and kills ranks under mpirun and asserts
#         wall-clock bounds, which an instrumented build on a loaded machine cannot promise; the
#         paths it drives are the local fault tests', which do run here and under TSan).
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
  # Without the benchmark tools (their flag parsing and runs are the Release suite's; the
  # library code they drive runs here under every other test), as the TSan and fuzz builds.
  cmake -S . -B build-asan -G Ninja "${sanitizer_flags[@]}" \
    -DLOOM_SANITIZE=address,undefined,float-cast-overflow \
    -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_BUILD_BENCH=OFF
  cmake --build build-asan -j "$JOBS"
  # halt_on_error + print_stacktrace: a UBSan finding fails the test instead of scrolling by.
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$suppressions/ubsan.supp
  local asan=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
  # The algorithm matrices at 1, 2, 3 and 5 ranks and on five of the nine hierarchical layouts
  # (even, uneven, one rank per node, one node, single ranks beside a pair); the Release suite
  # runs them all.
  local sampled='^AllCases/LocalAlgorithms\.MatchIndependentValues/np4_'
  sampled+='|^Layouts/HierarchicalLayouts\.MatchIndependentValues/n(000111|01011|001112222|00112233)$'
  ASAN_OPTIONS=$asan LSAN_OPTIONS=suppressions=$suppressions/lsan.supp:print_suppressions=0 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" --timeout 1200 \
    -LE 'mpi|cluster|fault|launched' -E "^install_consumer\$|$sampled"
  # (The emulated-cluster tests, label cluster, time shaped links across namespaces: not here.
  # Nor the ucx fault cases, label fault, for the fault matrix's reason: they assert wall-clock
  # bounds; and a survivor of a stopped peer leaves its UCX worker alive on purpose, which
  # LeakSanitizer would report.)
  # The ucx backend's tests (label launched: processes started by loom-launch): ASan and UBSan as
  # above, LeakSanitizer off. At 5 ranks its stop-the-world tracer crashed at process exit after
  # every test had passed ("Tracer caught signal 11", as under mpirun below); the transport
  # itself is leak-checked by ucx_transport_test in the run above.
  # 1, 2 and 3 ranks here (the 5-rank run is the Release suite's: 5 instrumented processes on 2
  # cores add half a minute and no path the others miss).
  ASAN_OPTIONS=$asan:detect_leaks=0 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" --timeout 1200 -L launched \
    -LE 'fault|torch' -E '\.np5$'

  # Under mpirun: Open MPI leaves its own allocations at MPI_Finalize (see lsan.supp). Full
  # stacks (no fast unwinding: Open MPI has no frame pointers) and components kept loaded
  # (no dlclose) let the suppressions match Open MPI's frames and only those.
  OMPI_MCA_mca_base_component_disable_dlclose=1 \
    ASAN_OPTIONS=$asan:fast_unwind_on_malloc=0 \
    LSAN_OPTIONS=suppressions=$suppressions/lsan.supp:print_suppressions=0 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" --timeout 1200 -L mpi \
    -LE '^fault$' -E '^mpi_algorithms_test'
  # mpi_algorithms_test under mpirun: ASan and UBSan as above, LeakSanitizer off. At 3 ranks
  # LeakSanitizer's own stop-the-world tracer crashes at process exit after every test has
  # passed ("Tracer caught signal 11 ... LeakSanitizer has encountered a fatal error", twice in
  # a row on a clean clone), so the leak check cannot run there; the same algorithms are
  # leak-checked on the local backend (algorithms_test, in the run above).
  OMPI_MCA_mca_base_component_disable_dlclose=1 \
    ASAN_OPTIONS=$asan:fast_unwind_on_malloc=0:detect_leaks=0 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" --timeout 1200 -L mpi \
    -R '^mpi_algorithms_test\.np3$'
  # (At 3 ranks only: not a power of two, every algorithm's uneven paths; 2 and 4 ranks are the
  # Release suite's, and every algorithm runs at 1-5 ranks under ASan in algorithms_test.)
}

# oneTBB built with -fsanitize=thread, into build-tsan-tbb/ (kept between runs). The system
# libtbb is not instrumented: ThreadSanitizer then cannot see the synchronisation inside TBB's
# scheduler and small-object pool, and reports every hand-over of data from the thread calling
# Executor::run() to a TBB worker as a race (false positives, in every executor test). The
# source is Debian's own, the version of the installed libtbb-dev, fetched with apt-get source
# through a private source list (the system's apt configuration is left alone).
build_tsan_tbb() {
  local root=$PWD/build-tsan-tbb
  tsan_tbb_dir=$root/install/lib/cmake/TBB
  [[ -f $tsan_tbb_dir/TBBConfig.cmake ]] && return
  local version
  version=$(dpkg-query -W -f '${source:Version}' libtbb-dev)
  mkdir -p "$root/apt/lists/partial" "$root/src"
  local key=/usr/share/keyrings/debian-archive-keyring.gpg
  printf 'deb-src [signed-by=%s] http://deb.debian.org/%s main\n' \
    "$key" "debian bookworm" "$key" "debian bookworm-updates" \
    "$key" "debian-security bookworm-security" >"$root/apt/sources.list"
  local apt=(-o "Dir::Etc::sourcelist=$root/apt/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::Lists=$root/apt/lists" -o APT::Get::List-Cleanup=0)
  apt-get "${apt[@]}" update -qq
  (cd "$root/src" && apt-get "${apt[@]}" source --download-only -qq "onetbb=$version")
  tar -xf "$root"/src/onetbb_*.orig.tar.* -C "$root/src"
  local source_dir
  source_dir=$(echo "$root"/src/oneTBB-*)
  cmake -S "$source_dir" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DTBB_SANITIZE=thread -DTBB_TEST=OFF -DTBB_EXAMPLES=OFF -DTBB_STRICT=OFF \
    -DTBBMALLOC_BUILD=OFF -DTBB_ENABLE_IPO=OFF -DCMAKE_INSTALL_PREFIX="$root/install"
  cmake --build "$root/build" -j "$JOBS"
  cmake --install "$root/build" >/dev/null
}

run_tsan() {
  build_tsan_tbb
  cmake -S . -B build-tsan -G Ninja "${sanitizer_flags[@]}" -DLOOM_SANITIZE=thread \
    -DTBB_DIR="$tsan_tbb_dir" -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_BUILD_BENCH=OFF
  # tests/CMakeLists.txt lists the binaries (LOOM_TSAN_TESTS): their tests are labelled tsan.
  cmake --build build-tsan -j "$JOBS" --target loom_tsan_tests
  # The local collectives matrix runs every op and rank count with float32 and int32 only: the
  # other dtypes change the kernels, not the threading (ASan runs them all). ctest names of
  # parameterised tests end in " # GetParam() = ...", hence "( |$)".
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$suppressions/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$JOBS" --timeout 1200 -L tsan \
    -E 'LocalCollectives.MatchIndependentValues/np[0-9]_[a-z_]+_(float16|bfloat16|float64|int64|uint8)( |$)'
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
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$suppressions/ubsan.supp \
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
