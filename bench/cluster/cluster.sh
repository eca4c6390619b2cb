#!/usr/bin/env bash
# An emulated cluster on one machine: N nodes, each its own network namespace and host name (UTS
# namespace), each joined by a veth pair to one bridge in a private /24, each node's link shaped
# to RATE in both directions with tc tbf; ranks of one node share memory. Runs an Open MPI job
# across the nodes (mpirun in this namespace, one orted per node started by node_agent.sh) and
# tears everything down on exit, also when the job fails or the script is interrupted.
#
#   bench/cluster/cluster.sh --nodes 2 --ranks-per-node 2 --link 1gbit -- PROGRAM [ARGS...]
#       runs PROGRAM under mpirun on every rank (ranks 0..R-1 on node 0, R..2R-1 on node 1, ...)
#   bench/cluster/cluster.sh --ranks-per-node 2,1,3 ... -- PROGRAM
#       3 nodes holding 2, 1 and 3 ranks (0-1, 2, 3-5): uneven placement
#   bench/cluster/cluster.sh --nodes 2 --ranks-per-node 2 --exec -- COMMAND [ARGS...]
#       runs COMMAND here, the cluster up, with LOOM_CLUSTER_MPIRUN naming an mpirun that runs
#       on it (e.g. `"$LOOM_CLUSTER_MPIRUN" -np 4 ./prog`): several jobs on one cluster
#   bench/cluster/cluster.sh --check
#       exits 0 if a cluster can be built here, else 1 with the reason (tests skip on it)
#   bench/cluster/cluster.sh --remove NAME
#       removes what a cluster named NAME left behind (its script killed with SIGKILL)
#
# Every job and every rank sees LOOM_CLUSTER_NODES (the node names, in rank order),
# LOOM_CLUSTER_RANKS_PER_NODE (each node's rank count, comma-separated: "2,2" or "2,1,3") and
# LOOM_CLUSTER_LINK_BITS (the shaped rate, bits/s; 0 if none).
# Needs root, iproute2 (ip, tc), util-linux (unshare, nsenter) and Open MPI's mpirun.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
agent=$here/node_agent.sh

usage() {
  cat >&2 <<EOF
usage: $0 [--nodes N] [--ranks-per-node R] [--link RATE|none] [--name NAME] [--subnet A.B.C]
          [--timeout SECONDS] [--exec] -- PROGRAM [ARGS...]
       $0 --check | --remove NAME
  --nodes N            nodes (network namespaces with their own host name), 1-64; default 2
  --ranks-per-node R   MPI ranks on each node (slots in the hostfile), 1-64; default 1; or
                       one count per node, comma-separated (2,1,3: sets --nodes to 3)
  --link RATE          each node's link rate, each way (tc syntax: 500mbit, 1gbit, 10gbit) or
                       'none' for an unshaped link; default 1gbit
  --name NAME          prefix of everything the cluster creates ([a-z0-9], 1-9 characters);
                       default lc<pid>; node k's host name is NAME-node<k>
  --subnet A.B.C       the private /24 of the nodes (node k is A.B.C.<k+1>, the bridge A.B.C.254);
                       default the first 10.77.X not routed here
  --timeout SECONDS    end the job (and the cluster) after SECONDS; default none
  --exec               run the command as given, not under mpirun; LOOM_CLUSTER_MPIRUN names an
                       mpirun for the cluster, LOOM_CLUSTER_HOSTFILE its hostfile
  --check              only check whether a cluster can be built here
  --remove NAME        only remove what the cluster NAME left (processes, namespaces, links)
EOF
  exit 2
}

fail() {
  echo "cluster.sh: $*" >&2
  exit 1
}

nodes=2
nodes_given=0
ranks_per_node=1
link=1gbit
name=lc$$
subnet=
timeout_s=
mode=mpirun
while (($#)); do
  case $1 in
  --nodes) nodes=${2:?--nodes needs a value}; nodes_given=1; shift 2 ;;
  --ranks-per-node) ranks_per_node=${2:?--ranks-per-node needs a value}; shift 2 ;;
  --link) link=${2:?--link needs a value}; shift 2 ;;
  --name) name=${2:?--name needs a value}; shift 2 ;;
  --subnet) subnet=${2:?--subnet needs a value}; shift 2 ;;
  --timeout) timeout_s=${2:?--timeout needs a value}; shift 2 ;;
  --exec) mode="exec"; shift ;;
  --check) mode=check; shift ;;
  --remove) mode=remove; name=${2:?--remove needs the name of the cluster}; shift 2 ;;
  --) shift; break ;;
  -h | --help) usage ;;
  *) echo "cluster.sh: unknown option '$1'" >&2; usage ;;
  esac
done

in_range() { [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= 64)); }
in_range "$nodes" || fail "--nodes must be 1-64, not '$nodes'"
IFS=, read -r -a node_ranks <<<"$ranks_per_node"
for count in "${node_ranks[@]}"; do
  in_range "$count" || fail "--ranks-per-node must be 1-64 or a list of them, not '$ranks_per_node'"
done
if ((${#node_ranks[@]} > 1)); then
  ((nodes_given == 0 || nodes == ${#node_ranks[@]})) ||
    fail "--ranks-per-node $ranks_per_node names ${#node_ranks[@]} nodes, --nodes $nodes"
  nodes=${#node_ranks[@]}
else
  for ((k = 1; k < nodes; k++)); do node_ranks+=("${node_ranks[0]}"); done
fi
ranks=0
for count in "${node_ranks[@]}"; do ranks=$((ranks + count)); done
[[ $name =~ ^[a-z0-9]{1,9}$ ]] || fail "--name must be 1-9 characters of [a-z0-9], not '$name'"
[[ -z $subnet || $subnet =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
  fail "--subnet must be the first three numbers of a /24 (e.g. 10.77.3), not '$subnet'"
[[ -z $timeout_s || $timeout_s =~ ^[0-9]+$ ]] || fail "--timeout must be whole seconds"

# The rate in bits per second, as tc reads it (k, m, g, t; bit or bps = bytes per second).
link_bits() {
  local value unit
  [[ $1 =~ ^([0-9]+)([kmgt]?)(bit|bps)$ ]] || return 1
  value=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in
  k) value=$((value * 1000)) ;;
  m) value=$((value * 1000000)) ;;
  g) value=$((value * 1000000000)) ;;
  t) value=$((value * 1000000000000)) ;;
  esac
  [[ ${BASH_REMATCH[3]} == bps ]] && value=$((value * 8))
  echo "$value"
}
if [[ $link == none ]]; then
  rate_bits=0
else
  rate_bits=$(link_bits "$link") ||
    fail "--link must be a rate like 500mbit, 1gbit, 10gbit or 125mbps, or 'none'; not '$link'"
  ((rate_bits > 0)) || fail "--link must be above zero"
fi

# Whether this machine lets us build a cluster: the first missing piece, or nothing.
missing_piece() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root (network namespaces, veth, tc)"; return; }
  local tool
  for tool in ip tc unshare nsenter flock mpirun; do
    command -v "$tool" >/dev/null || {
      echo "needs '$tool' (apt-get install iproute2 util-linux openmpi-bin)"
      return
    }
  done
  local probe=lcchk$$ uts_file=
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot create a network namespace (ip netns add failed: no CAP_NET_ADMIN?)"
    return
  fi
  local why=
  if ! ip link add "${probe}a" type veth peer name "${probe}b" netns "$probe" 2>/dev/null; then
    why="cannot create a veth pair into a namespace"
  elif ! ip link add "${probe}c" type bridge 2>/dev/null; then
    why="cannot create a bridge"
  elif ! tc qdisc add dev "${probe}a" root tbf rate 1gbit burst 256kb latency 100ms 2>/dev/null; then
    why="cannot shape a link with tc tbf (sch_tbf missing?)"
  elif ! ip netns exec "$probe" true 2>/dev/null; then
    why="cannot run a command in a network namespace (ip netns exec failed)"
  elif ! uts_file=$(mktemp) || ! unshare --uts="$uts_file" true 2>/dev/null; then
    why="cannot keep a UTS namespace (host name) alive with a bind mount (unshare --uts=FILE)"
  fi
  if [[ -n ${uts_file:-} ]]; then
    umount "$uts_file" 2>/dev/null || true
    rm -f "$uts_file"
  fi
  ip link delete "${probe}a" 2>/dev/null || true
  ip link delete "${probe}c" 2>/dev/null || true
  ip netns delete "$probe" 2>/dev/null || true
  echo "$why"
}

if [[ $mode == check ]]; then
  why=$(missing_piece)
  if [[ -n $why ]]; then
    echo "cluster.sh: cannot build an emulated cluster here: $why" >&2
    exit 1
  fi
  echo "cluster.sh: an emulated cluster can be built here"
  exit 0
fi
[[ $mode == remove ]] || (($# >= 1)) || usage
why=$(missing_piece)
[[ -z $why ]] || fail "cannot build an emulated cluster here: $why"

run_root=/run/loom-cluster
mkdir -p "$run_root" 2>/dev/null || run_root=${TMPDIR:-/tmp}/loom-cluster
mkdir -p "$run_root"
cluster_dir=$run_root/$name
bridge=${name}br
node_names=()
for ((k = 0; k < nodes; k++)); do node_names+=("$name-node$k"); done

job_pid=
# Whether process PID still runs (exists and is not a zombie).
# shellcheck disable=SC2317  # called by teardown
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) } # the state follows the command name, which may hold spaces
  [[ -n $stat && ${stat:0:1} != Z ]]
}
# Everything the cluster made, in reverse: the job, every process left in a node, the veths
# and namespaces, the host-name mounts, the bridge, the files. Safe to call twice.
# shellcheck disable=SC2317  # called by the traps
teardown() {
  set +e
  trap - EXIT INT TERM HUP PIPE
  if [[ -n $job_pid ]] && kill -0 "$job_pid" 2>/dev/null; then
    kill -TERM "$job_pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do kill -0 "$job_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$job_pid" 2>/dev/null
    wait "$job_pid" 2>/dev/null
  fi
  # ip netns pids lists the processes in a namespace, but not those already exiting: the pids
  # are kept, and each is waited for until it is gone or a zombie (its parent, often init
  # since orted daemonizes, reaps it).
  local k pids=() round p
  for round in TERM KILL; do
    for ((k = 0; k < nodes; k++)); do
      [[ -e /run/netns/$name-n$k ]] || continue
      for p in $(ip netns pids "$name-n$k" 2>/dev/null); do
        [[ " ${pids[*]} " == *" $p "* ]] || pids+=("$p")
      done
    done
    local alive=()
    for p in "${pids[@]}"; do running "$p" && alive+=("$p"); done
    ((${#alive[@]})) || break
    echo "cluster.sh: SIG$round to processes left in the nodes: ${alive[*]}" >&2
    kill "-$round" "${alive[@]}" 2>/dev/null
    # a stopped process (a hung node) acts on SIGTERM only once continued
    [[ $round == KILL ]] || kill -CONT "${alive[@]}" 2>/dev/null
    for ((i = 0; i < 30; i++)); do
      alive=()
      for p in "${pids[@]}"; do running "$p" && alive+=("$p"); done
      ((${#alive[@]})) || break
      sleep 0.1
    done
  done
  for ((k = 0; k < nodes; k++)); do
    # deleting the host's end of a veth deletes both; a namespace outlives its name while
    # anything still holds it, and its veth with it
    ip link delete "${name}v$k" 2>/dev/null
    ip netns delete "$name-n$k" 2>/dev/null
  done
  for ((k = 0; k < nodes; k++)); do
    local uts=$cluster_dir/uts/${node_names[k]}
    if [[ -e $uts ]]; then
      umount "$uts" 2>/dev/null || umount -l "$uts" 2>/dev/null
    fi
  done
  ip link delete "$bridge" 2>/dev/null
  rm -rf "$cluster_dir"
}

if [[ $mode == remove ]]; then
  nodes=64 # every node a cluster can have; teardown skips those that are not there
  node_names=()
  for ((k = 0; k < nodes; k++)); do node_names+=("$name-node$k"); done
  teardown
  echo "cluster.sh: removed what was left of cluster '$name'" >&2
  exit 0
fi

# The lock keeps two clusters from choosing the same subnet or name at once.
exec {lock_fd}>"$run_root/lock"
flock -w 30 "$lock_fd" || fail "could not lock $run_root/lock within 30 s"
if [[ -e $cluster_dir || -e /run/netns/$name-n0 ]] || ip link show "$bridge" >/dev/null 2>&1; then
  fail "a cluster named '$name' exists already ($cluster_dir, namespace $name-n0 or bridge $bridge)"
fi
# The routes are read whole before grep looks at them: `ip | grep -q` under pipefail fails when
# grep exits early and ip gets SIGPIPE, which made a subnet in use look free (two bridges with
# one address: "node 0 cannot reach mpirun's address").
subnet_in_use() {
  local routes
  routes=$(ip -4 route show)
  grep -q "^$1\.\|[ /]$1\.[0-9]*[ /]" <<<"$routes"
}
if [[ -z $subnet ]]; then
  for x in $(seq 0 255); do
    subnet_in_use "10.77.$x" || { subnet=10.77.$x; break; }
  done
  [[ -n $subnet ]] || fail "every 10.77.X/24 is routed here already; pass --subnet"
elif subnet_in_use "$subnet"; then
  fail "subnet $subnet.0/24 is routed here already; choose another --subnet"
fi

trap teardown EXIT
trap 'echo "cluster.sh: interrupted; tearing the cluster down" >&2; exit 130' INT TERM HUP
# A reader that went away (`cluster.sh ... | head`) must not leave the cluster behind either.
trap 'exit 141' PIPE

mkdir -p "$cluster_dir/nodes" "$cluster_dir/uts"
ip link add "$bridge" type bridge
# Bridged frames must not pass through the host's iptables (a FORWARD policy of DROP, as Docker
# sets, would drop them): off for this bridge only, where the kernel has the option.
ip link set "$bridge" type bridge nf_call_iptables 0 nf_call_ip6tables 0 2>/dev/null || true
ip addr add "$subnet.254/24" dev "$bridge"
ip link set "$bridge" up

# tbf holds back what exceeds the rate; its bucket must hold at least one whole packet, and with
# segmentation offload a veth hands it 64 KiB at once (a smaller burst stalls the link). 1 ms of
# the rate, at least 256 KiB: a 4 MiB transfer may then run ahead of the rate by 6% at most.
shape() { # shape NETNS_OR_EMPTY DEVICE
  local burst=$((rate_bits / 8 / 1000))
  ((burst >= 262144)) || burst=262144
  if [[ -n $1 ]]; then
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$link" burst "$burst" latency 100ms
  else
    tc qdisc add dev "$2" root tbf rate "$link" burst "$burst" latency 100ms
  fi
}

: >"$cluster_dir/hostfile"
for ((k = 0; k < nodes; k++)); do
  netns=$name-n$k
  host=${node_names[k]}
  veth=${name}v$k
  ip netns add "$netns"
  ip link add "$veth" type veth peer name eth0 netns "$netns"
  ip link set "$veth" master "$bridge" up
  ip netns exec "$netns" ip link set lo up
  # IPv4 only: no link-local IPv6 addresses for Open MPI to find beside the node's own
  ip netns exec "$netns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null || true
  ip netns exec "$netns" sysctl -qw net.ipv6.conf.default.disable_ipv6=1 2>/dev/null || true
  ip netns exec "$netns" ip addr add "$subnet.$((k + 1))/24" dev eth0
  ip netns exec "$netns" ip link set eth0 up
  if ((rate_bits > 0)); then
    shape "$netns" eth0 # the node's sending side
    shape "" "$veth"    # its receiving side (what the bridge sends it)
  fi
  # The node's host name lives in a UTS namespace kept by a bind mount on this file.
  touch "$cluster_dir/uts/$host"
  unshare --uts="$cluster_dir/uts/$host" hostname "$host"
  echo "$netns $cluster_dir/uts/$host" >"$cluster_dir/nodes/$host"
  echo "$host slots=${node_ranks[k]}" >>"$cluster_dir/hostfile"
done
flock -u "$lock_fd"

# Whether a TCP connection from namespace $1 to $2 reaches the address: a closed port answers
# "refused" at once; a firewall that drops bridged frames lets it time out (2 s). A link just set
# up may lose the first ARP or SYN (each retried after 1 s, which a loaded host can push past
# the 2 s), so up to 5 tries, 10 s, before the cluster is refused.
reaches() {
  local answer try
  for ((try = 0; try < 5; try++)); do
    answer=$(ip netns exec "$1" timeout 2 bash -c "echo >/dev/tcp/$2/9" 2>&1) && return 0
    [[ $answer == *"Connection refused"* ]] && return 0
  done
  return 1
}
for ((k = 0; k < nodes; k++)); do
  reaches "$name-n$k" "$subnet.254" ||
    fail "node $k ($subnet.$((k + 1))) cannot reach mpirun's address $subnet.254 over the bridge" \
      "(does a firewall drop bridged traffic?)"
  ((k == 0)) || reaches "$name-n0" "$subnet.$((k + 1))" ||
    fail "node 0 cannot reach node $k ($subnet.$((k + 1))) over the bridge"
done

# What makes the job run on the cluster: on mpirun's command line.
mpirun_options=(
  --hostfile "$cluster_dir/hostfile"
  --mca plm_rsh_agent "$agent $cluster_dir"
  --mca plm_rsh_no_tree_spawn 1
  # the link's name keys loom's calibration cache (LOOM_LINK, README "Environment")
  -x LOOM_LINK
  # TCP (and Open MPI's own connections) on the private range only
  --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24"
)
[[ $(id -u) -ne 0 ]] || mpirun_options+=(--allow-run-as-root)
# What makes it run well: defaults in the environment (OMPI_MCA_*), which a job may override
# with --mca on its own command line (Open MPI refuses a parameter given twice there).
mpi_defaults=(
  # ob1 over shared memory (vader) inside a node and TCP between nodes
  OMPI_MCA_pml=ob1
  "OMPI_MCA_btl=self,vader,tcp"
  # one socket per peer carries half the rate each way when both directions are busy
  OMPI_MCA_btl_tcp_links=2
  # the nodes share this machine's cores: let the kernel place the ranks
  OMPI_MCA_hwloc_base_binding_policy=none
  # loom's calibration of one link rate is not reused at another
  "LOOM_LINK=$link"
)
if ((ranks > $(nproc))); then
  # ranks busy-polling on shared cores delay one another by a scheduler slice per message
  mpi_defaults+=(OMPI_MCA_mpi_yield_when_idle=1)
fi

{
  echo "#!/bin/sh"
  echo "# mpirun on the emulated cluster $name (made by bench/cluster/cluster.sh)"
  for setting in "${mpi_defaults[@]}"; do
    # shellcheck disable=SC2016  # written for the wrapper's sh to expand
    printf 'export %s="${%s:-%s}"\n' "${setting%%=*}" "${setting%%=*}" "${setting#*=}"
  done
  printf 'exec mpirun'
  printf ' %q' "${mpirun_options[@]}"
  printf ' "$@"\n'
} >"$cluster_dir/mpirun"
chmod +x "$cluster_dir/mpirun"

export LOOM_CLUSTER_NODES="${node_names[*]}"
LOOM_CLUSTER_RANKS_PER_NODE=$(IFS=,; echo "${node_ranks[*]}")
export LOOM_CLUSTER_RANKS_PER_NODE
export LOOM_CLUSTER_LINK_BITS=$rate_bits
export LOOM_CLUSTER_MPIRUN=$cluster_dir/mpirun
export LOOM_CLUSTER_HOSTFILE=$cluster_dir/hostfile
echo "cluster.sh: $nodes node(s), $LOOM_CLUSTER_RANKS_PER_NODE rank(s) on $subnet.0/24 (bridge $bridge)," \
  "links $link each way; nodes: ${node_names[*]}" >&2

if [[ $mode == exec ]]; then
  command=("$@")
else
  command=("$LOOM_CLUSTER_MPIRUN" -np "$ranks" "$@")
fi
if [[ -n $timeout_s ]]; then
  command=(timeout --kill-after=5 "$timeout_s" "${command[@]}")
fi
# In the background, so that INT and TERM reach the trap at once instead of after the job.
"${command[@]}" <&0 &
job_pid=$!
status=0
wait "$job_pid" || status=$?
job_pid=
if [[ -n $timeout_s ]] && ((status == 124)); then
  echo "cluster.sh: the job did not finish within $timeout_s s" >&2
fi
exit "$status"
