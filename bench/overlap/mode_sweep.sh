#!/usr/bin/env bash
# loom mode against its ddp mode at every point of a sweep: links (shared memory and netem
# rates), rank counts and model shapes, including one whose parameters are registered last
# layer first (DDP's in-order gate then gives loom no head start). Each point is one
# loom-overlap run with its modes interleaved step by step, so each ratio is a same-run ratio;
# the table gives every point's loom/ddp and the verdict counts the points where loom mode is
# not slower than ddp mode.
#   bench/overlap/mode_sweep.sh [BUILD_DIR]
#   LINKS="shm 2gbit" RANKS="2 3" STEPS=10 bench/overlap/mode_sweep.sh build
#   BLOCK=5 STEPS=3 ...: each sample is 5 steps back to back after one barrier (loom-overlap
#   --block), as training runs them; the default (1) puts a barrier before every step.
# Netem rates need root (bench/netem.sh); ranks above 2 run oversubscribed on a 2-core machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
links=${LINKS:-shm 1gbit 2gbit 10gbit}
ranks=${RANKS:-2 3 4}
steps=${STEPS:-10}
block=${BLOCK:-1}
warmups=${WARMUPS:-3}
out=${OUT:-$(mktemp -d)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# name|loom-overlap flags
shapes=(
  "mlp8x512|--input 64 --depth 8 --width 512 --output 16 --batch 512"
  "mlp8x512-reversed|--input 64 --depth 8 --width 512 --output 16 --batch 512 --registration reverse"
  "mlp4x1024|--input 64 --depth 4 --width 1024 --output 16 --batch 256"
)

mkdir -p "$out"
load0=$(cut -d' ' -f1 /proc/loadavg)
for link in $links; do
  for n in $ranks; do
    for shape in "${shapes[@]}"; do
      name=${shape%%|*}
      read -r -a flags <<<"${shape#*|}"
      json="$out/$link.np$n.$name.json"
      cmd=(mpirun -np "$n" --oversubscribe --bind-to none "$build/bin/loom-overlap" --threads 1
           --steps "$steps" --block "$block" --warmups "$warmups" --bucket-cap-kb 1024 --first-bucket-kb 1024
           "${flags[@]}" --json "$json")
      if [[ $link == shm ]]; then
        "${cmd[@]}" >"$out/$link.np$n.$name.txt" 2>&1
      else
        "$root/bench/netem.sh" "$link" -- "${cmd[@]}" >"$out/$link.np$n.$name.txt" 2>&1
      fi
    done
  done
done

python3 - "$out" "$load0" "$(cut -d' ' -f1 /proc/loadavg)" "$steps" "$block" <<'PY'
import glob, json, os, sys
out, load0, load1, steps, block = sys.argv[1:]
rows = []
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    link, np, shape = os.path.basename(path)[:-len(".json")].split(".", 2)
    modes = {r["mode"]: r for r in json.load(open(path))}
    rows.append((link, int(np[2:]), shape, modes["sequential"]["step_ms"],
                 modes["ddp"]["step_ms"], modes["loom"]["step_ms"], modes["ddp"]["cpu_ms"],
                 modes["loom"]["cpu_ms"]))
order = {"shm": 0}
rows.sort(key=lambda r: (order.get(r[0], 1), r[0], r[1], r[2]))
per = ("%s steps per mode" % steps if block == "1" else
       "%s samples of %s steps back to back per mode" % (steps, block))
print("# mode_sweep: loom-overlap, 1 MiB buckets, one thread per rank, %s, modes interleaved, "
      "medians; load average %s -> %s" % (per, load0, load1))
print("# cpu ms: every rank's CPU time per step, summed (2 cores x the step = saturated)")
print("| link | ranks | model | sequential ms | ddp ms | loom ms | loom / ddp | ddp cpu ms "
      "| loom cpu ms |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for link, n, shape, seq, ddp, loom, ddp_cpu, loom_cpu in rows:
    print("| %s | %d | %s | %.1f | %.1f | %.1f | %.3f | %.1f | %.1f |" % (
        link, n, shape, seq, ddp, loom, loom / ddp, ddp_cpu, loom_cpu))
ratios = [loom / ddp for _, _, _, _, ddp, loom, _, _ in rows]
print("# loom mode <= ddp mode at %d of %d points (worst %.3f, median %.3f)" % (
    sum(r <= 1.0 for r in ratios), len(ratios), max(ratios), sorted(ratios)[len(ratios) // 2]))
PY
