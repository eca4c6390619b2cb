#!/usr/bin/env bash
# Validates loom-predict's two-level model (sim/cluster_network) on the emulated cluster: for
# every link rate x shape, one cluster (cluster.sh) runs loom-collectives' allreduce with loom's
# algorithms, and loom-predict --collective predicts each (algorithm, size) from the cluster's
# nominal rates. Prints one markdown row per measurement (measured, predicted, error) and the
# median |error|. Needs root (cluster.sh).
#   bench/cluster/validate_predict.sh [BUILD_DIR]
#   RATES="1gbit 2gbit" SHAPES="2x1 2x2 3x1" SIZES=4M,16M,64M bench/cluster/validate_predict.sh
# The model's inputs are fixed here, not fitted to the measurements:
#   link     the tbf rate x PAYLOAD (default 1448/1514: the TCP payload of a 1514-byte Ethernet
#            frame with timestamps; tbf counts whole frames)
#   INTRA    a node's memory (default 5GB/s: the vader pairs of bench/RESULTS.md, 4.2-5.8 GB/s)
#   LATENCY  across nodes (default 100us), INTRA_LATENCY inside (default 20us), GAMMA the
#            reduction (default: the built-in tuning's)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
rates=${RATES:-"1gbit 2gbit"}
shapes=${SHAPES:-"2x1 2x2 3x1"}
sizes=${SIZES:-4M,16M,64M}
iterations=${ITERATIONS:-3}
payload=${PAYLOAD:-0.95640687}
intra=${INTRA:-5GB/s}
latency=${LATENCY:-100us}
intra_latency=${INTRA_LATENCY:-20us}
gamma=${GAMMA:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

smallest=${sizes%%,*}
largest=${sizes##*,}
for rate in $rates; do
  for shape in $shapes; do
    IFS=x read -r nodes per_node <<<"$shape"
    np=$((nodes * per_node))
    algorithms=ring,rd,rabenseifner
    ((per_node > 1)) && algorithms=$algorithms,hierarchical
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$here/cluster.sh" --nodes "$nodes" --ranks-per-node "$per_node" \
      --link "$rate" --exec -- bash -c "\"\$LOOM_CLUSTER_MPIRUN\" -np $np \
        $build/bin/loom-collectives --backend mpi -b $smallest -e $largest -f 4 -o allreduce \
        -d float32 -a $algorithms -n $iterations -w 1 -c 1" >"$out/$rate.$shape.txt" 2>&1 ||
      { cat "$out/$rate.$shape.txt" >&2; exit 1; }
    printf '%s\t%s\t%s\t%s\t%s\n' "$rate" "$nodes" "$per_node" "$load" \
      "$out/$rate.$shape.txt" >>"$out/runs.tsv"
  done
done

python3 - "$out/runs.tsv" "$build/bin/loom-predict" "$sizes" "$payload" "$intra" "$latency" \
  "$intra_latency" "$gamma" <<'PY'
import json, re, statistics, subprocess, sys
runs, predict, sizes, payload, intra, latency, intra_latency, gamma = sys.argv[1:9]
UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
row = re.compile(r"^\s+(\d+)\s+\d+\s+float32\s+sum\s+(\w+)\s+(\d+)\s")
errors = []
print("| rate | shape | load | algorithm | size | measured ms | predicted ms | error |")
print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
for line in open(runs):
    rate, nodes, per_node, load, path = line.rstrip("\n").split("\t")
    text = open(path).read()
    if "Out of bounds values : 0 OK" not in text:
        sys.exit("wrong results in %s:\n%s" % (path, text))
    unit = re.sub(r"^[\d.]+", "", rate)
    bits = float(rate[: len(rate) - len(unit)]) * UNITS[unit] * float(payload)
    cmd = [predict, "--nodes", nodes, "--ranks-per-node", per_node, "--link", "%.0f" % bits,
           "--intra", intra, "--latency", latency, "--intra-latency", intra_latency,
           "--collective", "allreduce", "--sizes", sizes, "--json"]
    if gamma:
        cmd += ["--gamma", gamma]
    predicted = {}
    for obj in map(json.loads, subprocess.run(cmd, check=True, capture_output=True,
                                              text=True).stdout.splitlines()):
        predicted[obj["bytes"]] = obj
    for m in (row.match(l) for l in text.splitlines()):
        if not m:
            continue
        size, algorithm, us = int(m.group(1)), m.group(2), int(m.group(3))
        p = predicted[size][algorithm + "_ms"]
        error = p / (us / 1e3) - 1
        errors.append(abs(error))
        print("| %s | %sx%s | %s | %s | %d MiB | %.1f | %.1f | %+.1f%% |" %
              (rate, nodes, per_node, load, algorithm, size >> 20, us / 1e3, p, 100 * error))
print()
print("median |error| %.1f%% over %d measurements (max %.1f%%)" %
      (100 * statistics.median(errors), len(errors), 100 * max(errors)))
PY
