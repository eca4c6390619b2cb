#!/bin/bash
# The GPU check in one prepared run: the GPU tests, the tests with GPU cases, the staging and
# MPI tests under orterun (several ranks sharing the GPU), the GPU demos, and loom_torch built
# there against that machine's torch with its CUDA tests and the NCCL overhead at world size 1,
# on a machine with a CUDA device but without loom's build dependencies (the `device` tool's
# H100/H200 machines).
#
#   bench/gpu/device_check.sh bundle [BUILD]   here: BUILD/gpu_bundle (default build-gpu/, a
#                                             CUDA and NCCL build: see below) with the
#                                             binaries, libloom, loom's ucx module, config.hpp,
#                                             and Debian's .debs of oneTBB, Boost.program_options,
#                                             OpenBLAS, UCX and Open MPI
#   bench/gpu/device_check.sh run [BUNDLE]     there, from the repository's root: unpacks the
#                                             libraries (Open MPI only where the machine has
#                                             none), runs everything, prints a summary (rc and
#                                             seconds per step); log in $OUT/gpu.log
#
# BUILD with NCCL: pip's nvidia-nccl-cu13 headers (the CUDA torch's venv has them), e.g.
#   N=.venv-cuda/lib/python3.11/site-packages/nvidia/nccl; source scripts/setup.sh &&
#   LOOM_BUILD_DIR=build-gpu loom_configure_and_build -DLOOM_WITH_TORCH=OFF \
#     -DNCCL_INCLUDE_DIR=$N/include -DNCCL_LIBRARY=$N/lib/libnccl.so.2
set -u
BINARIES="cuda_unavailable_test cuda_runtime_test cuda_kernels_test gpu_executor_test nccl_backend_test
  executor_test bucketer_test dot_test algorithms_test fault_local_test bad_input_test
  data_parallel_step_test gradient_reducer_test train_step_test mpi_staging_test device_buckets_test
  mpi_backend_test
  executor_mpi_test mpi_collectives_test mpi_algorithms_test loom-bench-nccl loom-bench-pinned
  loom-overlap loom-train-step"
DEBS="openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libmunge2 libtbb12 libtbbmalloc2 libboost-program-options1.74.0
  libopenblas0-pthread libgfortran5 libquadmath0 libucx0 libnuma1 libibverbs1 librdmacm1"

bundle() {
  local build=${1:-build-gpu} b
  b=$build/gpu_bundle
  [ -x "$build/bin/cuda_runtime_test" ] ||
    { echo "$build is not a CUDA build (no bin/cuda_runtime_test): configure where nvcc is found"; exit 1; }
  rm -rf "$b" && mkdir -p "$b/bin" "$b/lib" "$b/debs" || exit 1
  for x in $BINARIES; do cp "$build/bin/$x" "$b/bin/" || exit 1; done
  cp -L "$build/lib/libloom.so.0" "$build/lib/libloom_backend_ucx.so" "$b/lib/" || exit 1
  grep -q 'LOOM_HAVE_NCCL 1' "$build/generated/include/loom/config.hpp" ||
    echo "warning: $build has no NCCL: loom_torch's nccl path and its figure will not run"
  mkdir -p "$b/include" && cp -r "$build/generated/include/loom" "$b/include/" || exit 1
  (cd "$b/debs" && apt-get download $DEBS >/dev/null 2>&1) || exit 1
  cp "$0" "$b/device_check.sh"
  du -sh "$b"
  echo "then: the device tool's run with carry [\"$b\"] and: bash $b/device_check.sh run"
}

run() {
  local B R=$PWD
  B=$(cd "${1:-$(dirname "$0")}" && pwd)
  local O=${OUT:-/tmp/out}
  mkdir -p "$O"
  exec > >(tee "$O/gpu.log") 2>&1
    date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
  mkdir -p /tmp/deb
  for f in "$B"/debs/libtbb* "$B"/debs/libboost* "$B"/debs/libopenblas* "$B"/debs/libgfortran* "$B"/debs/libquadmath* "$B"/debs/libucx* "$B"/debs/libnuma* "$B"/debs/libibverbs* "$B"/debs/librdmacm*; do dpkg -x "$f" /tmp/deb; done
  export UCX_MODULE_DIR=/tmp/deb/usr/lib/x86_64-linux-gnu/ucx
  if ! command -v orterun >/dev/null; then
    echo "no Open MPI here: installing Debian 12's from the carried packages"
    for f in "$B"/debs/*openmpi* "$B"/debs/libpmix* "$B"/debs/libmunge* "$B"/debs/libhwloc* "$B"/debs/libevent*; do dpkg -x "$f" /; done
    ldconfig
  fi
  orterun --version | head -1
  NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia
  EXTRA=""; for d in "$NV"/*/lib; do [ -d "$d" ] && EXTRA="$EXTRA:$d"; done
  export LD_LIBRARY_PATH="$B/lib:/tmp/deb/usr/lib/x86_64-linux-gnu:/tmp/deb/usr/lib/x86_64-linux-gnu/openblas-pthread:/usr/local/cuda/lib64:/usr/local/cuda/lib${EXTRA}"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
  missing=$(for b in "$B"/bin/*; do ldd "$b" | grep "not found"; done | sort -u)
  [ -n "$missing" ] && { echo "MISSING LIBRARIES:"; echo "$missing"; }
  ldd "$B/bin/nccl_backend_test" | grep -E "nccl|cublas|cudart"
  declare -a SUMMARY
  t() { # name timeout command...
    local name=$1 to=$2; shift 2; local s=$(date +%s%N)
    echo "=== $name"; timeout "$to" "$@"; local rc=$?
    local ms=$(( ($(date +%s%N) - s) / 1000000 ))
    SUMMARY+=("$(printf '%-44s rc=%-3s %d.%03ds' "$name" "$rc" $((ms/1000)) $((ms%1000)))")
  }
  cd "$B/bin"
  for x in cuda_unavailable_test cuda_runtime_test cuda_kernels_test gpu_executor_test nccl_backend_test executor_test bucketer_test dot_test algorithms_test fault_local_test bad_input_test data_parallel_step_test gradient_reducer_test; do
    t $x 240 ./$x --gtest_brief=1
  done
  t train_step_test.cuda 240 ./train_step_test --gtest_filter='TrainStepCuda.*'
  MR="orterun --oversubscribe --bind-to none -x LD_LIBRARY_PATH"
  for n in 1 2 3; do t mpi_staging_test.np$n 180 $MR -np $n ./mpi_staging_test --gtest_brief=1; done
  for n in 1 2 3; do t device_buckets_test.np$n 180 $MR -np $n ./device_buckets_test --gtest_brief=1; done
  for n in 2 3; do t mpi_backend_test.np$n 180 $MR -np $n ./mpi_backend_test --gtest_brief=1; done
  t executor_mpi_test.np3 180 $MR -np 3 ./executor_mpi_test --gtest_brief=1
  t mpi_collectives_test.np3 240 $MR -np 3 ./mpi_collectives_test --gtest_brief=1
  t mpi_algorithms_test.np3 240 $MR -np 3 ./mpi_algorithms_test --gtest_brief=1
  t loom-train-step.cuda.np2 180 $MR -np 2 ./loom-train-step --device cuda --width 512 --batch 1024 --steps 5
  t loom-bench-pinned 120 ./loom-bench-pinned --repeats 3
  t loom-bench-nccl 180 ./loom-bench-nccl --max-bytes 268435456 --iterations 50
  t loom-overlap.cuda.np2 240 $MR -np 2 ./loom-overlap --device cuda --input 1024 --output 1024 --width 1024 --depth 8 --batch 16384 --bucket-cap-kb 4096 --threads 8
  # loom_torch on this machine's python and torch (its NCCL loaded by torch), then its CUDA
  # tests: 2 and 3 ranks sharing the GPU under mpirun (mpi's staged path) and 2 under torchrun
  # (ucx's), each safeguard switched off (the stream-order tests must then see the wrong
  # result), NCCL at world size 1 under torchrun.
  local PKG=/tmp/loom_torch_pkg
  t build_loom_torch 300 python3 "$R/bench/gpu/build_loom_torch.py" --lib "$B/lib" \
    --config "$B/include" --out "$PKG"
  export PYTHONPATH=$PKG LOOM_TIMEOUT_S=120
  cd "$R/tests/torch"
  # Every case at 2 ranks; at 3, the collectives and one model per bucket memory (the
  # script's time: it must run twice within the device's 15 minutes).
  t torch_cuda.np2 300 $MR -x PYTHONPATH -x LOOM_TIMEOUT_S -x UCX_MODULE_DIR -np 2 \
    python3 mpi_pytest.py --log-dir "$O/torch_cuda.np2" -- -x -q -p no:cacheprovider test_cuda.py
  t torch_cuda.np3 240 $MR -x PYTHONPATH -x LOOM_TIMEOUT_S -x UCX_MODULE_DIR -np 3 \
    python3 mpi_pytest.py --log-dir "$O/torch_cuda.np3" -- -x -q -p no:cacheprovider test_cuda.py \
    -k "not parallelize or (like_ddp and overlapped and mlp)"
  for s in stream_wait input_hold; do
    t torch_cuda.skip_$s.np2 240 $MR -x PYTHONPATH -x LOOM_TIMEOUT_S -x UCX_MODULE_DIR \
      -x LOOM_TORCH_UNSAFE_SKIP=$s -np 2 python3 mpi_pytest.py --log-dir "$O/torch_cuda.skip_$s" \
      -- -x -q -p no:cacheprovider test_cuda.py -k "stream_order or input_kept or after_their_stream"
  done
  # torchrun, 2 ranks on the one GPU: the ucx transport's staged path (NCCL refuses them).
  t torch_cuda.torchrun2 240 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    -m pytest -x -q -p no:cacheprovider test_cuda.py \
    -k "not parallelize or (like_ddp and overlapped and mlp) or after_their_stream"
  # torchrun, 1 rank: NCCL, parallelize's device buckets on it (updates ordered on streams).
  t torch_cuda.torchrun1_nccl 240 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    -m pytest -x -q -p no:cacheprovider test_cuda.py \
    -k "(device and (like_ddp or autocast)) or after_their_stream"
  t torch_nccl_ws1 300 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    "$R/bench/gpu/torch_nccl_overhead.py" --json "$O/torch_nccl_ws1.json"
  # The transformer step on CUDA, 2 ranks sharing the GPU: parallelize (device buckets, and
  # host buckets) against DDP on Gloo, interleaved.
  t torch_parallelize_cuda.np2 300 $MR -x PYTHONPATH -x LOOM_TIMEOUT_S -x UCX_MODULE_DIR -np 2 \
    python3 "$R/bench/gpu/torch_parallelize_cuda.py" --json "$O/torch_parallelize_cuda.json"
  cd "$B/bin"
  echo "=== SUMMARY"; printf '%s\n' "${SUMMARY[@]}"
}

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n 2,12p "$0"; exit 2 ;;
esac
