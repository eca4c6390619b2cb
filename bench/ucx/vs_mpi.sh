#!/usr/bin/env bash
# The ucx backend against Open MPI's own collectives, in one run, interleaved: ROUNDS rounds, each
# timing `mpirun -np 2 loom-collectives -a native` (MPI's allreduce) and then `loom-launch -n 2
# loom-collectives -a native,auto` (ucx: native is loom's algorithms by the cost model, auto the
# selector's choice, calibrated as on mpi unless LOOM_CALIBRATION=0), 8 B to 64 MiB, over shared
# memory and over TCP on a loopback shaped to 10 Gbit/s (bench/netem.sh: Open MPI on btl tcp, UCX
# on UCX_TLS=tcp). Prints one table per link: the median of the rounds per size and ucx / mpi.
#   bench/ucx/vs_mpi.sh [ROUNDS] [OUT_DIR]     (default 3, bench/results/ucx_vs_mpi)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
out=${2:-bench/results/ucx_vs_mpi}
bin=${LOOM_BIN:-build/bin}
mkdir -p "$out"
root=()
[[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
sizes=(-b 8 -e 64M -f 2 -c 0 -n 20 -w 5 --min_time 20 -o allreduce)

run_link() {  # link: shm or tcp
  local link=$1 r
  for ((r = 1; r <= rounds; r++)); do
    if [[ $link == shm ]]; then
      mpirun -np 2 "${root[@]}" --mca btl self,vader "$bin/loom-collectives" -a native "${sizes[@]}" \
        --json "$out/mpi_${link}_$r.json" >/dev/null
      python3 tools/loom-launch -n 2 -- "$bin/loom-collectives" -a native,auto "${sizes[@]}" \
        --json "$out/ucx_${link}_$r.json" >/dev/null
    else
      bench/netem.sh 10gbit -- mpirun -np 2 "${root[@]}" "$bin/loom-collectives" -a native \
        "${sizes[@]}" --json "$out/mpi_${link}_$r.json" >/dev/null
      bench/netem.sh 10gbit -- python3 tools/loom-launch -n 2 -- "$bin/loom-collectives" \
        -a native,auto "${sizes[@]}" --json "$out/ucx_${link}_$r.json" >/dev/null
    fi
    echo "vs_mpi.sh: $link round $r done" >&2
  done
}

run_link shm
run_link tcp
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for link in ("shm", "tcp"):
    times = {}
    for r in range(1, rounds + 1):
        for who in ("mpi", "ucx"):
            for row in json.load(open(f"{out}/{who}_{link}_{r}.json")):
                times.setdefault((row["bytes"], f"{who} {row['algo']}"), []).append(row["time_us"])
    print(f"\n{link}: median of {rounds} interleaved rounds, microseconds; ratio = ucx / mpi native")
    print(f"{'bytes':>10} {'mpi native':>11} {'ucx native':>11} {'ucx auto':>11} {'native/mpi':>10} {'auto/mpi':>9}")
    for size in sorted({b for b, _ in times}):
        m = statistics.median(times[(size, "mpi native")])
        n = statistics.median(times[(size, "ucx native")])
        a = statistics.median(times[(size, "ucx auto")])
        print(f"{size:>10} {m:>11.2f} {n:>11.2f} {a:>11.2f} {n / m:>10.3f} {a / m:>9.3f}")
PY
