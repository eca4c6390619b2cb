#!/usr/bin/env bash
# Open MPI's rsh launcher agent for bench/cluster/cluster.sh: runs a command inside one emulated
# node (its network namespace and its host name), as ssh would run it on a real node.
#   node_agent.sh CLUSTER_DIR NODE COMMAND...
# mpirun calls it as `--mca plm_rsh_agent "node_agent.sh CLUSTER_DIR"`, appending the node name
# and the orted command line; like ssh, the words of the command are joined and run by sh.
set -euo pipefail

if (($# < 3)); then
  echo "node_agent.sh: usage: node_agent.sh CLUSTER_DIR NODE COMMAND..." >&2
  exit 2
fi
cluster_dir=$1
node=$2
shift 2
node_file=$cluster_dir/nodes/$node
if [[ ! -f $node_file ]]; then
  known=("$cluster_dir"/nodes/*)
  echo "node_agent.sh: no node '$node' in the cluster at $cluster_dir" \
    "(its nodes: ${known[*]##*/})" >&2
  exit 255
fi
# The node file holds two words: the network namespace and the file that keeps the node's UTS
# namespace (its host name) alive.
read -r netns uts_file <"$node_file"
# `ip netns exec` also gives the command a private mount namespace with /sys of the node's
# network namespace; nsenter then enters the node's UTS namespace.
exec ip netns exec "$netns" nsenter --uts="$uts_file" -- sh -c "$*"
