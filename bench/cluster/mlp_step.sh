#!/usr/bin/env bash
# The MLP train step on the emulated cluster (issue 23): loom-overlap's modes with loom's
# selector free to pick hierarchical algorithms, against the same job restricted to flat
# algorithms (LOOM_ALLREDUCE=$FLAT), interleaved round by round on one cluster; then the
# simulator's account of both (loom-predict on the last round's loom-mode profiles, with every
# algorithm and with --algorithms ring,rd,rabenseifner). Prints a markdown table: each mode's
# median step over the rounds, free and flat, and their ratio. Needs root (cluster.sh).
#   bench/cluster/mlp_step.sh [BUILD_DIR]
#   ROUNDS=3 SHAPE=2x2 LINK=1gbit DEPTH=8 WIDTH=512 BATCH=32 bench/cluster/mlp_step.sh build
# The model's inputs are validate_predict.sh's: the link at the tbf rate x PAYLOAD, a node's
# memory INTRA (5GB/s), LATENCY 100us across, INTRA_LATENCY 20us inside.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
rounds=${ROUNDS:-3}
shape=${SHAPE:-2x2}
link=${LINK:-1gbit}
depth=${DEPTH:-8}
width=${WIDTH:-512}
batch=${BATCH:-32}
steps=${STEPS:-20}
flat=${FLAT:-"rd:0-64K;ring:64K-max"}
payload=${PAYLOAD:-0.95640687}
intra=${INTRA:-5GB/s}
latency=${LATENCY:-100us}
intra_latency=${INTRA_LATENCY:-20us}
IFS=x read -r nodes per_node <<<"$shape"
np=$((nodes * per_node))
out=$(mktemp -d)
chmod 755 "$out"
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

load_before=$(cut -d' ' -f1 /proc/loadavg)
start=$(date -u +%H:%M:%S)
# One cluster, every round on it: free then flat in each round.
"$here/cluster.sh" --nodes "$nodes" --ranks-per-node "$per_node" --link "$link" --exec -- \
  sh -c "for round in \$(seq $rounds); do
      for config in free flat; do
        extra=''
        [ \$config = flat ] && extra='-x LOOM_ALLREDUCE=$flat'
        \"\$LOOM_CLUSTER_MPIRUN\" -np $np -x LOOM_CALIBRATION=0 \$extra \
          $build/bin/loom-overlap --depth $depth --width $width --batch $batch \
          --steps $steps --warmups 19 --auto-plan --json $out/\$config.\$round.json \
          --profile-json $out/\$config >$out/\$config.\$round.log 2>&1 ||
          { cat $out/\$config.\$round.log >&2; exit 1; }
      done
    done" >&2
load_after=$(cut -d' ' -f1 /proc/loadavg)

rate=$(python3 -c "
import re, sys
m = re.fullmatch(r'([0-9.]+)([gm])bit', '$link'.lower())
if not m: sys.exit('mlp_step.sh: LINK must be <n>gbit or <n>mbit')
bits = float(m.group(1)) * (1e9 if m.group(2) == 'g' else 1e6) * $payload
print(f'{bits / 1e6:.3f}mbit')")
predict() {  # profile, extra flags: the predicted step in ms and the algorithm
  "$build/bin/loom-predict" "$1" --nodes "$nodes" --ranks-per-node "$per_node" --link "$rate" \
    --intra "$intra" --latency "$latency" --intra-latency "$intra_latency" --no-best --json \
    "${@:2}" | python3 -c "import json,sys; r=json.loads(sys.stdin.readline()); print(f\"{r['step_ms']:.1f} {r['algorithm']}\")"
}
read -r free_all free_all_alg < <(predict "$out/free.loom.json")
read -r free_flat free_flat_alg < <(predict "$out/free.loom.json" --algorithms ring,rd,rabenseifner)
read -r flat_all flat_all_alg < <(predict "$out/flat.loom.json")
read -r flat_flat flat_flat_alg < <(predict "$out/flat.loom.json" --algorithms ring,rd,rabenseifner)

python3 - "$out" "$rounds" <<EOF
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
steps = {}
for config in ("free", "flat"):
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/{config}.{r}.json")):
            steps.setdefault((row["mode"], config), []).append(row["step_ms"])
print(f"# mlp_step: $shape ranks, $link per node link, MLP 64 -> $depth x $width -> 16, "
      f"batch $batch per rank; {rounds} rounds $start UTC, load {float('$load_before'):.2f} -> "
      f"{float('$load_after'):.2f}; flat: LOOM_ALLREDUCE='$flat'")
print("| mode | free (hierarchical allowed) step ms | flat only step ms | free / flat | per round free / flat |")
print("| --- | ---: | ---: | ---: | --- |")
for mode in ("sequential", "ddp", "loom", "loom-auto"):
    free, flat = steps.get((mode, "free")), steps.get((mode, "flat"))
    if not free or not flat: continue
    f, g = statistics.median(free), statistics.median(flat)
    per = ", ".join(f"{a / b:.3f}" for a, b in zip(free, flat))
    print(f"| {mode} | {f:.1f} | {g:.1f} | **{f / g:.3f}** | {per} |")
print()
print("The simulator (loom-predict, the last round's loom-mode profiles, link $rate, a node's "
      "memory $intra):")
print("| profile | every algorithm: step ms | flat only: step ms | ratio |")
print("| --- | ---: | ---: | ---: |")
print(f"| free | $free_all ($free_all_alg) | $free_flat ($free_flat_alg) | {$free_all / $free_flat:.3f} |")
print(f"| flat | $flat_all ($flat_all_alg) | $flat_flat ($flat_flat_alg) | {$flat_all / $flat_flat:.3f} |")
EOF
