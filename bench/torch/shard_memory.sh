#!/usr/bin/env bash
# Memory per rank of each mode (bench/torch/shard_memory.py: one mode per process), rounds
# interleaved, every run with glibc's MALLOC_MMAP_THRESHOLD_ fixed alike (64 KiB: allocations
# above it are mapped and given back when freed, so resident memory follows what is alive);
# prints per mode the median over rounds of its resident memory, its peak and the tensors torch
# sees, and the bound the sharded plans are held to: DDP's minus 0.9 x (1 - 1/N) of the optimizer
# state and gradients DDP's run measured.
#   bench/torch/shard_memory.sh                      # NP=2, gpt-wide, AdamW, 2 rounds
#   NP=3 ROUNDS=3 MODEL=gpt-wide bench/torch/shard_memory.sh
# PYTHON: default the project's venv ($root/.venv/bin/python).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
np=${NP:-2}
rounds=${ROUNDS:-2}
model=${MODEL:-gpt-wide}
optimizer=${OPTIMIZER:-adamw}
modes=${MODES:-ddp-gloo ddp-gloo-zero fsdp2-gloo parallelize parallelize:shard=optimizer parallelize:shard=gradients}
python=${PYTHON:-$root/.venv/bin/python}
[[ -x $python ]] || python=python3
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-65536}
export LOOM_CALIBRATION=${LOOM_CALIBRATION:-0}
for round in $(seq 1 "$rounds"); do
  for mode in $modes; do
    name=$(echo "$mode" | tr ':=' '__')
    mpirun -np "$np" --oversubscribe --bind-to none -x MALLOC_MMAP_THRESHOLD_ -x LOOM_CALIBRATION \
      "$python" "$here/shard_memory.py" --mode "$mode" --model "$model" --optimizer "$optimizer" \
      --json "$out/$name.r$round.json" >"$out/$name.r$round.txt" 2>&1 ||
      { cat "$out/$name.r$round.txt" >&2; exit 1; }
    grep -v '^$' "$out/$name.r$round.txt" | tail -1
  done
done
"$python" - "$out" "$np" "$rounds" $modes <<'EOF'
import json
import statistics
import sys

out, n, rounds, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = {}
for mode in modes:
    name = mode.replace(":", "_").replace("=", "_")
    runs = [json.load(open("%s/%s.r%d.json" % (out, name, r))) for r in range(1, rounds + 1)]
    rows[mode] = {k: statistics.median(run[k] for run in runs)
                  for k in ("resident", "peak", "tensors", "parameters", "gradients",
                            "optimizer_state")}
    rows[mode]["loss"] = runs[0]["per_rank"][0]["loss"]
mb = 1e6
print("| mode | resident MB | peak MB | tensors MB (params + grads + state) | loss |")
print("| --- | ---: | ---: | ---: | ---: |")
for mode, r in rows.items():
    print("| %s | %.1f | %.1f | %.1f (%.1f + %.1f + %.1f) | %.5f |" % (
        mode, r["resident"] / mb, r["peak"] / mb, r["tensors"] / mb, r["parameters"] / mb,
        r["gradients"] / mb, r["optimizer_state"] / mb, r["loss"]))
if "ddp-gloo" in rows:
    ddp = rows["ddp-gloo"]
    saving = 0.9 * (1 - 1.0 / n) * (ddp["optimizer_state"] + ddp["gradients"])
    print("\nbound for shard=gradients (DDP - 0.9 x (1 - 1/%d) x (state %.1f + grads %.1f MB)): "
          "resident <= %.1f MB, peak <= %.1f MB, tensors <= %.1f MB" % (
              n, ddp["optimizer_state"] / mb, ddp["gradients"] / mb,
              (ddp["resident"] - saving) / mb, (ddp["peak"] - saving) / mb,
              (ddp["tensors"] - saving) / mb))
    for mode in ("parallelize:shard=gradients", "parallelize:shard=gradients:rebuild=1"):
        if mode in rows:
            r = rows[mode]
            print("%s: resident %s, peak %s, tensors %s" % (
                mode, "within" if r["resident"] <= ddp["resident"] - saving else "OVER",
                "within" if r["peak"] <= ddp["peak"] - saving else "OVER",
                "within" if r["tensors"] <= ddp["tensors"] - saving else "OVER"))
EOF
echo "(runs kept in $out)"
