#!/usr/bin/env bash
# A whole node stopped or killed (issue 23 item 5): 3 nodes x 2 ranks on an emulated cluster run
# PROGRAM (cluster_node_failure) with LOOM_TIMEOUT_S=TIMEOUT; once every rank is ready, every
# process of the last node's namespace (its ranks and its orted) gets SIGSTOP (stop) or SIGKILL
# (kill). Every survivor (ranks 0-3) must end with a named loom error that names the missing
# ranks 4 and 5 and their node's host name, within TIMEOUT + 5 s of the fault. stop-rank stops
# rank 5 alone: its node answers for it, and ranks 0-4 must name rank 5 (0-3 with its host) as
# not arrived. stop-inside: rank 5 stops itself (PROGRAM inside) after it started an allreduce
# that the others hold back, so every rank started it and none can complete it: ranks 0-4 must
# name rank 5 (0-3 with its host) as the one whose process shows no sign of life (its node's
# heartbeat board says so). The cluster is torn down after.
#   node_failure.sh CLUSTER_SH stop|kill|stop-rank|stop-inside PROGRAM [TIMEOUT]
# Exits 77 (the tests' SKIP_RETURN_CODE) where `cluster.sh --check` says no cluster can be built.
set -euo pipefail
(($# >= 3)) || { echo "usage: $0 CLUSTER_SH stop|kill|stop-rank|stop-inside PROGRAM [TIMEOUT]" >&2; exit 2; }
cluster_sh=$1
mode=$2
program=$3
timeout_s=${4:-4}
program_args=""
case $mode in stop | stop-rank) signal=STOP ;; kill) signal=KILL ;; stop-inside) signal=STOP program_args=inside ;; *) echo "node_failure.sh: unknown mode '$mode'" >&2; exit 2 ;; esac
if ! why=$("$cluster_sh" --check 2>&1); then
  echo "SKIP: $why" >&2
  exit 77
fi
name=lf$$
victim_host=$name-node2
log=$(mktemp)
errors=$(mktemp)
trap 'rm -f "$log" "$errors"' EXIT

# OMPI_MCA_* in the environment reach every rank; mpirun keeps the survivors running when a
# rank or a node dies (recovery on, no abort on a non-zero status) so that they can report.
"$cluster_sh" --name "$name" --nodes 3 --ranks-per-node 2 --link 1gbit --timeout 120 --exec -- \
  env OMPI_MCA_orte_enable_recovery=1 OMPI_MCA_orte_abort_on_non_zero_status=0 \
  sh -c "exec \"\$LOOM_CLUSTER_MPIRUN\" -np 6 -x LOOM_TIMEOUT_S=$timeout_s -x LOOM_CALIBRATION=0 \
    $program $program_args" >"$log" 2>"$errors" &
cluster=$!

ready() { grep -c "^loom-node-failure: rank [0-9] ready (pid [0-9]*)$" "$log" || true; }
for ((i = 0; ; i++)); do
  (($(ready) == 6)) && break
  if ((i >= 600)) || ! kill -0 "$cluster" 2>/dev/null; then
    echo "FAIL: the 6 ranks were not ready within 60 s" >&2
    cat "$log" "$errors" >&2
    kill -TERM "$cluster" 2>/dev/null || true
    wait "$cluster" || true
    exit 1
  fi
  sleep 0.1
done

survivors="0 1 2 3"
expected="ranks 4, 5 on host $victim_host are missing"
if [[ $mode == stop-rank ]]; then
  victims=$(sed -n 's/^loom-node-failure: rank 5 ready (pid \([0-9]*\))$/\1/p' "$log")
  survivors="0 1 2 3 4"
  # stopped between two runs (did not arrive) or inside one (started it but shows no life)
  expected="rank 5 on host $victim_host "
elif [[ $mode == stop-inside ]]; then
  survivors="0 1 2 3 4"
  expected="rank 5 on host $victim_host started it but its process has shown no sign of life"
else
  victims=$(ip netns pids "$name-n2" | tr '\n' ' ')
fi
if [[ $mode == stop-inside ]]; then
  # rank 5 stops itself; its line gives the time
  stop_line="^loom-node-failure: rank 5 stops inside collective at \([0-9.]*\) (pid [0-9]*)$"
  for ((i = 0; i < 300; i++)); do
    fault_at=$(sed -n "s/$stop_line/\1/p" "$log")
    [[ -n $fault_at ]] && break
    sleep 0.1
  done
  if [[ -z $fault_at ]]; then
    echo "FAIL: rank 5 did not stop itself within 30 s of being ready" >&2
    cat "$log" "$errors" >&2
    kill -TERM "$cluster" 2>/dev/null || true
    wait "$cluster" || true
    exit 1
  fi
  echo "node_failure.sh: rank 5 stopped itself inside an allreduce at $fault_at (node 2, $victim_host)" >&2
else
  fault_at=$(date +%s.%N)
  echo "node_failure.sh: SIG$signal to $victims (node 2, $victim_host; mode $mode)" >&2
  # shellcheck disable=SC2086  # one word per pid
  kill -"$signal" $victims
fi

# The survivors' reports, at most TIMEOUT + 5 s after the fault (and 5 s more to see a late one).
deadline=$(echo "$fault_at + $timeout_s + 10" | bc)
pattern="^loom-node-failure: rank [${survivors// /}] \(error\|unexpected\|finished\)"
while (($(grep -c "$pattern" "$log" || true) < $(wc -w <<<"$survivors"))); do
  (($(echo "$(date +%s.%N) < $deadline" | bc))) || break
  sleep 0.1
done
kill -TERM "$cluster" 2>/dev/null || true
for ((i = 0; i < 300; i++)); do kill -0 "$cluster" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$cluster" 2>/dev/null; then
  echo "FAIL: cluster.sh still runs 30 s after SIGTERM" >&2
  kill -KILL "$cluster" 2>/dev/null || true
  "$cluster_sh" --remove "$name" || true
  exit 1
fi
wait "$cluster" || true

status=0
for rank in $survivors; do
  line=$(grep -m1 "^loom-node-failure: rank $rank \(error\|unexpected\|finished\)" "$log" || true)
  if [[ -z $line ]]; then
    echo "FAIL: rank $rank reported nothing within $timeout_s + 10 s of the fault" >&2
    status=1
    continue
  fi
  if [[ $line =~ error\ at\ ([0-9.]+):\ \[loom:([a-z_]+)\]\ (.*)$ ]]; then
    at=${BASH_REMATCH[1]} code=${BASH_REMATCH[2]} message=${BASH_REMATCH[3]}
    after=$(echo "$at - $fault_at" | bc)
    echo "node_failure.sh: rank $rank: [loom:$code] $after s after the fault: $message" >&2
    if (($(echo "$after > $timeout_s + 5" | bc))); then
      echo "FAIL: rank $rank reported $after s after the fault (bound: $timeout_s + 5 s)" >&2
      status=1
    fi
    # rank 4 shares rank 5's host: its own board names rank 5 without a host
    if [[ $rank == 4 ]]; then
      [[ $mode == stop-rank ]] && expected="rank 5 "
      [[ $mode == stop-inside ]] && expected="rank 5 started it but its process has shown no sign of life"
    fi
    if [[ $message != *"$expected"* ]]; then
      echo "FAIL: rank $rank's error does not say '$expected'" >&2
      status=1
    fi
  else
    echo "FAIL: rank $rank did not end with a loom error: $line" >&2
    status=1
  fi
done
if ((status != 0)); then
  echo "--- the job's output ---" >&2
  cat "$log" >&2
  echo "--- the job's errors ---" >&2
  cat "$errors" >&2
fi
exit $status
