#!/usr/bin/env bash
# Which transport each rank pair of an emulated-cluster job uses, and its latency and bandwidth.
# Run inside `bench/cluster/cluster.sh ... --exec --`: it runs the probe's --pairs table
# (tests/cluster/cluster_probe.cpp: 8 B latency, median of 1000; 4 MiB bandwidth, fastest of 3)
# with Open MPI's btl verbose output, and names a pair's transport from it: "tcp" when the two
# ranks opened a TCP connection (btl:tcp logs every connect), else "vader" (with btl
# self,vader,tcp, a pair that moved data without TCP did so through shared memory).
#   bench/cluster/cluster.sh --nodes 2 --ranks-per-node 2 --exec -- \
#       bench/cluster/pair_report.sh build/bin/cluster_probe
set -euo pipefail

probe=${1:?usage: pair_report.sh PATH/TO/cluster_probe}
[[ -n ${LOOM_CLUSTER_MPIRUN:-} ]] || { echo "pair_report.sh: run it under cluster.sh --exec" >&2; exit 2; }
read -r -a nodes <<<"$LOOM_CLUSTER_NODES"
ranks=$((${#nodes[@]} * LOOM_CLUSTER_RANKS_PER_NODE))
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$LOOM_CLUSTER_MPIRUN" -np "$ranks" --tag-output --mca btl self,vader,tcp \
  --mca btl_base_verbose 100 "$probe" --pairs >"$log" 2>&1 ||
  { tail -20 "$log" >&2; echo "pair_report.sh: the probe failed" >&2; exit 1; }
# "[1,R]<stderr>:... connect() to [[J,1],P] ..." and "... now connected to A, process [[J,1],P]"
tcp_pairs=$(grep -E 'attempting to connect\(\) to|now connected to' "$log" |
  sed -E 's/^\[1,([0-9]+)\]<stderr>:.*\[\[[0-9]+,[0-9]+\],([0-9]+)\].*/\1 \2/' |
  awk '{ a = $1 < $2 ? $1 : $2; b = $1 < $2 ? $2 : $1; print a "-" b }' | sort -u)
grep -E '^\[1,0\]<stdout>:' "$log" | sed 's/^\[1,0\]<stdout>://' |
  while read -r from to placement latency bandwidth; do
    if [[ $from == from ]]; then
      printf '%-5s %-5s %-11s %-10s %11s %14s\n' from to placement transport "$latency" "$bandwidth"
      continue
    fi
    transport=vader
    grep -qx "$from-$to" <<<"$tcp_pairs" && transport=tcp
    printf '%-5s %-5s %-11s %-10s %11s %14s\n' "$from" "$to" "$placement" "$transport" \
      "$latency" "$bandwidth"
  done
