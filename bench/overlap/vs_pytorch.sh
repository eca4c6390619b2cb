#!/usr/bin/env bash
# PyTorch DDP as a row of loom-overlap: trains loom-overlap's MLP with DDP on Gloo
# (bench/torch/ddp_step.py --backend gloo) and with loom-overlap's three modes and loom-auto (its
# automatic plan, TrainConfig::automatic_plan), rounds interleaved
# (loom-overlap, then DDP, then again), at NP ranks and at 1 rank, all in one netem namespace (or
# on shared memory with RATE "shm"), and prints one table: each row's median step, its ratio to
# PyTorch DDP and the communication it adds over its own 1-rank step. loom mode and loom-auto
# also run with LOOM_PROGRESS_PRIORITY=normal (rows "progress thread normal"): what the progress
# thread's priority buys in the same run.
#   bench/overlap/vs_pytorch.sh [RATE] [BUILD_DIR]        e.g. bench/overlap/vs_pytorch.sh 2gbit
#   ROUNDS=3 NP=2 HOOK=fp16 bench/overlap/vs_pytorch.sh 2gbit   (DDP's fp16_compress_hook vs
#                                                         loom-overlap --compression float16)
# Needs the project's .venv (scripts/setup.sh makes it, with pip's torch 2.x; PYTHON= another
# interpreter with torch) and, for a RATE, root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [[ ${1:-} == --inner ]]; then  # re-invoked inside the namespace: --inner RATE BUILD OUT
  rate=$2 build=$3 out=$4
else
  rate=${1:-2gbit}
  build=$(cd "${2:-$root/build}" && pwd)
  out=${OUT:-$(mktemp -d)}
fi
rounds=${ROUNDS:-3}
np=${NP:-2}
hook=${HOOK:-none}
steps=${STEPS:-20}
python=${PYTHON:-$root/.venv/bin/python}  # the project's torch; not the Python first on PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [[ ${1:-} == --inner ]]; then
  compression=none
  [[ $hook == fp16 ]] && compression=float16
  model=(--depth 8 --width 512 --input 64 --output 16 --batch 512 --bucket-cap-kb 1024
         --first-bucket-kb 1024 --compression "$compression")
  for round in $(seq 1 "$rounds"); do
    for n in "$np" 1; do
      # --auto-plan adds loom-auto, whose plan is decided within its warm-ups (18 runs).
      mpirun -np "$n" --bind-to none "$build/bin/loom-overlap" --threads 1 --steps "$steps" \
        --warmups 20 --auto-plan "${model[@]}" --json "$out/loom.np$n.r$round.json" \
        --profile-json "$out/profile.np$n.r$round" >"$out/loom.np$n.r$round.txt" 2>&1
      if ((n > 1)); then  # the same with the progress thread at normal priority
        LOOM_PROGRESS_PRIORITY=normal mpirun -np "$n" --bind-to none -x LOOM_PROGRESS_PRIORITY \
          "$build/bin/loom-overlap" --threads 1 --steps "$steps" --warmups 20 --auto-plan \
          "${model[@]}" --json "$out/loom-normal.np$n.r$round.json" \
          >"$out/loom-normal.np$n.r$round.txt" 2>&1
      fi
      # Gloo's rendezvous port: a fresh one per run (the last run's may linger in TIME_WAIT).
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29500 + round * 10 + n)) \
        mpirun -np "$n" --bind-to none -x MASTER_ADDR -x MASTER_PORT "$python" \
        "$root/bench/torch/ddp_step.py" --backend gloo --hook "$hook" --steps "$steps" \
        --warmups 3 --json "$out/ddp.np$n.r$round.json" >"$out/ddp.np$n.r$round.txt" 2>&1
    done
  done
  exit 0
fi

mkdir -p "$out"
load=$(cut -d' ' -f1 /proc/loadavg)
if [[ $rate == shm ]]; then
  "$0" --inner "$rate" "$build" "$out"
else
  "$root/bench/netem.sh" "$rate" -- "$0" --inner "$rate" "$build" "$out" 2>"$out/netem.txt"
fi
"$python" - "$out" "$rounds" "$np" "$rate" "$hook" "$load" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, statistics, sys
out, rounds, np, rate, hook, load0, load1 = sys.argv[1:]
rounds, np = int(rounds), int(np)
def loom(n, mode, run="loom"):
    v = []
    for r in range(1, rounds + 1):
        for row in json.load(open("%s/%s.np%d.r%d.json" % (out, run, n, r))):
            if row["mode"] == mode:
                v.append(row["step_ms"])
    return statistics.median(v)
def ddp(n):
    return statistics.median(json.load(open("%s/ddp.np%d.r%d.json" % (out, n, r)))["gloo_step_ms"]
                             for r in range(1, rounds + 1))
rows = [("PyTorch DDP (gloo)", ddp(np), ddp(1))]
rows += [("loom-overlap %s" % m, loom(np, m), loom(1, m))
         for m in ("sequential", "ddp", "loom", "loom-auto")]
rows += [("loom-overlap %s, progress thread normal" % m, loom(np, m, "loom-normal"), loom(1, m))
         for m in ("loom", "loom-auto")]
priority = [l for l in open("%s/loom.np%d.r1.txt" % (out, np)) if l.startswith("# progress thread")]
base, base1 = rows[0][1], rows[0][1] - rows[0][2]
print("# vs_pytorch: %d ranks, %s, hook %s, MLP 64 -> 8 x 512 -> 16, batch 512 per rank, 1 MiB "
      "buckets, one thread per rank; median of %d interleaved rounds; load average %s -> %s"
      % (np, rate, hook, rounds, load0, load1))
print(priority[0].rstrip() if priority else "# progress thread: not reported")
print("| row | step ms | / DDP | 1-rank step ms | comm added ms | comm added / DDP's |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name, step, one in rows:
    added = step - one
    print("| %s | %.1f | %.3f | %.1f | %.1f | %.2f |" % (name, step, step / base, one, added, added / base1))
PY
