#!/usr/bin/env bash
# One job on an emulated cluster (bench/cluster/cluster.sh) for ctest, and the proof that the
# cluster is gone afterwards: no namespace, link, mount, directory or process of it remains.
#   run_on_cluster.sh CLUSTER_SH MODE [cluster.sh options] -- PROGRAM [ARGS...]
# MODE  pass       the job must succeed
#       fail       the job must fail, and cluster.sh with its status
#       terminate  SIGTERM to cluster.sh once the job runs on every node: it must exit 130
#       interrupt  the same with SIGINT (Ctrl-C)
#       stopped    as terminate, every process of the last node SIGSTOPped first (a hung node)
#       orphans    PROGRAM is replaced: each rank leaves a detached `sleep` behind in its node
#                  and exits 0; cluster.sh must end those sleeps itself
# Exits 77 (the tests' SKIP_RETURN_CODE) where `cluster.sh --check` says no cluster can be built.
set -euo pipefail

(($# >= 4)) || { echo "usage: $0 CLUSTER_SH pass|fail|terminate|interrupt [OPTIONS] -- PROGRAM..." >&2; exit 2; }
cluster_sh=$1
mode=$2
shift 2
case $mode in pass | fail | terminate | interrupt | stopped | orphans) ;; *) echo "run_on_cluster.sh: unknown mode '$mode'" >&2; exit 2 ;; esac

if ! why=$("$cluster_sh" --check 2>&1); then
  echo "SKIP: $why" >&2
  exit 77
fi

nodes=2
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == -- ]] && break
  [[ ${args[i]} == --nodes ]] && nodes=${args[i + 1]}
  if [[ ${args[i]} == --ranks-per-node && ${args[i + 1]} == *,* ]]; then
    IFS=, read -r -a counts <<<"${args[i + 1]}"
    nodes=${#counts[@]}
  fi
done
name=lt$$

# Everything named after the cluster that is still there, one line each.
leftovers() {
  local netns
  for netns in /run/netns/"$name"-n*; do
    [[ ! -e $netns ]] || echo "network namespace ${netns##*/}"
  done
  ip -o link show | awk -F': ' '{print $2}' | grep "^$name" | sed 's/^/link /' || true
  grep "/loom-cluster/$name/" /proc/self/mountinfo | awk '{print "mount " $5}' || true
  local dir
  for dir in /run/loom-cluster/$name "${TMPDIR:-/tmp}/loom-cluster/$name"; do
    [[ ! -e $dir ]] || echo "directory $dir"
  done
}

# The pids of the processes running in the cluster's namespaces (orted, the ranks).
cluster_pids() {
  local k
  for ((k = 0; k < nodes; k++)); do
    [[ -e /run/netns/$name-n$k ]] && ip netns pids "$name-n$k" 2>/dev/null
  done
  return 0
}

status=0
job_pids=
case $mode in
pass | fail)
  "$cluster_sh" --name "$name" --timeout 120 "$@" || status=$?
  ;;
orphans)
  pid_file=$(mktemp)
  trap 'rm -f "$pid_file"' EXIT
  options=()
  while (($#)) && [[ $1 != -- ]]; do options+=("$1"); shift; done
  # shellcheck disable=SC2016  # expanded by each rank's sh
  "$cluster_sh" --name "$name" --timeout 120 "${options[@]}" -- \
    sh -c 'setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! >>"$0"' "$pid_file" || status=$?
  job_pids=$(tr '\n' ' ' <"$pid_file")
  [[ -n $job_pids ]] || { echo "FAIL: the ranks left no sleep behind" >&2; exit 1; }
  echo "run_on_cluster.sh: the ranks left these sleeps behind: $job_pids"
  ;;
terminate | interrupt | stopped)
  signal=TERM
  if [[ $mode == interrupt ]]; then
    signal=INT
    set -m # its own process group, where SIGINT is not ignored as in a background job
  fi
  "$cluster_sh" --name "$name" --timeout 120 "$@" &
  pid=$!
  set +m
  # Wait (at most 30 s) until the job runs on every node: each namespace holds a process.
  for ((i = 0; ; i++)); do
    busy=0
    for ((k = 0; k < nodes; k++)); do
      [[ -e /run/netns/$name-n$k && -n $(ip netns pids "$name-n$k" 2>/dev/null) ]] && ((++busy))
    done
    ((busy == nodes)) && break
    if ((i >= 300)) || ! kill -0 "$pid" 2>/dev/null; then
      echo "FAIL: the job did not start on all $nodes nodes within 30 s" >&2
      kill -KILL "$pid" 2>/dev/null || true
      exit 1
    fi
    sleep 0.1
  done
  sleep 1 # let mpirun finish starting the ranks
  job_pids=$(cluster_pids | tr '\n' ' ')
  if [[ $mode == stopped ]]; then
    stopped=$(ip netns pids "$name-n$((nodes - 1))" | tr '\n' ' ')
    echo "run_on_cluster.sh: SIGSTOP to node $((nodes - 1)): $stopped" >&2
    # shellcheck disable=SC2086  # one word per pid
    kill -STOP $stopped
  fi
  echo "run_on_cluster.sh: SIG$signal to cluster.sh while running: $job_pids" >&2
  kill -"$signal" "$pid"
  # cluster.sh's teardown is bounded (mpirun 5 s, each node 3 s); 30 s is a hang.
  for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: cluster.sh still runs 30 s after SIG$signal" >&2
    kill -KILL "$pid"
    exit 1
  fi
  wait "$pid" || status=$?
  ;;
esac

problems=$(leftovers)
for p in $job_pids; do
  # a zombie has let go of everything; its parent (init: orted daemonizes) reaps it
  state=$(cat "/proc/$p/stat" 2>/dev/null) || continue
  state=${state##*) } # the state follows the command name, which may hold spaces
  state=${state:0:1}
  [[ $state == Z ]] || problems+=$'\n'"process $p ($(cat /proc/"$p"/comm 2>/dev/null), state $state)"
done
if [[ -n ${problems//[[:space:]]/} ]]; then
  echo "FAIL: the cluster '$name' was not torn down:" >&2
  echo "$problems" | sed '/^$/d; s/^/  /' >&2
  exit 1
fi
echo "run_on_cluster.sh: teardown verified: nothing named $name remains"

case $mode in
pass | orphans) exit "$status" ;;
fail)
  ((status != 0)) || { echo "FAIL: the job was to fail, and cluster.sh exited 0" >&2; exit 1; }
  echo "run_on_cluster.sh: the job failed as expected (status $status)"
  ;;
terminate | interrupt | stopped)
  ((status == 130)) || { echo "FAIL: cluster.sh exited $status after SIG$signal, not 130" >&2; exit 1; }
  echo "run_on_cluster.sh: cluster.sh exited 130 after SIG$signal"
  ;;
esac
