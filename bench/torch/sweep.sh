#!/usr/bin/env bash
# Issue 22's sweep of real models: bench/torch/real_models.sh at every point of RATES x NPS x
# COMPRESSIONS (default 2gbit 10gbit x 2 3 x none float16), each point one launch per model with
# the modes interleaved in rounds, then one line per point and mode: the worst (largest) ratio
# to DDP on Gloo over the models, and the model it came from, so "never slower than DDP" reads
# off the last column. Every point's full table stays in OUT/<rate>.np<n>.<compression>.txt.
#   bench/torch/sweep.sh [BUILD_DIR]               # as root (netem); about 30 min on 2 cores at
#                                                  # STEPS=3 ROUNDS=6 (18 timed steps per mode)
#   MODELS="transformer convnet" RATES=2gbit NPS=2 bench/torch/sweep.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${OUT:-$root/build/sweep}
rates=${RATES:-2gbit 10gbit}
nps=${NPS:-2 3}
compressions=${COMPRESSIONS:-none float16}
export MODES=${MODES:-ddp-gloo,ddp-loom,parallelize,parallelize-auto}
mkdir -p "$out"
for rate in $rates; do
  for np in $nps; do
    for compression in $compressions; do
      name="$rate.np$np.$compression"
      echo "sweep: $name (models: ${MODELS:-transformer resnet18 convnet mlp})" >&2
      NP=$np COMPRESSION=$compression OUT="$out/$name" \
        "$here/real_models.sh" "$rate" "$build" >"$out/$name.txt"
      cat "$out/$name.txt"
    done
  done
done
# The worst ratio to DDP on Gloo per point and mode, from each point's table.
python3 - "$out" <<'PY'
import glob, os, sys
rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.txt"))):
    point = os.path.basename(path)[:-4]
    for line in open(path):
        f = line.split()
        if len(f) < 4 or line.startswith("#") or f[0] == "model" or f[3] == "-":
            continue
        try:
            ratio = float(f[3])
        except ValueError:
            continue
        key = (point, f[1])
        if key not in rows or ratio > rows[key][0]:
            rows[key] = (ratio, f[0])
print("# sweep: the worst step / DDP-on-Gloo step over the models, per point and mode")
print("%-22s %-18s %8s  %s" % ("point", "mode", "worst", "model"))
for (point, mode), (ratio, model) in sorted(rows.items()):
    if mode not in ("ddp-gloo", "local"):
        print("%-22s %-18s %8.3f  %s%s" % (point, mode, ratio, model,
                                           "  (slower than DDP)" if ratio > 1 else ""))
PY
