#!/usr/bin/env bash
# Runs a command in a private network namespace whose loopback is shaped to RATE with tc tbf,
# and makes Open MPI use TCP over that loopback: communication then costs wire time, as on a
# cluster, instead of the memcpy CPU time of shared memory; UCX likewise (UCX_TLS=tcp,self on lo).
# Cleans up after itself.
#   bench/netem.sh 2gbit -- mpirun -np 2 build/bin/loom-overlap --depth 8 --width 1024
# RATE is anything tc accepts (500mbit, 2gbit, 10gbit). Needs root and iproute2 (ip, tc).
set -euo pipefail

usage() {
  echo "usage: $0 RATE -- COMMAND [ARGS...]   (e.g. $0 2gbit -- mpirun -np 2 ./loom-overlap)" >&2
  exit 2
}
(($# >= 3)) || usage
rate=$1
shift
[[ $1 == -- ]] || usage
shift
if [[ $(id -u) -ne 0 ]]; then
  echo "netem.sh: needs root (it creates a network namespace and a tc qdisc); run it with sudo" >&2
  exit 1
fi
for tool in ip tc; do
  command -v "$tool" >/dev/null || { echo "netem.sh: needs '$tool' (apt-get install iproute2)" >&2; exit 1; }
done

ns=loom-netem-$$
cleanup() { ip netns delete "$ns" 2>/dev/null || true; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
# tbf needs a burst of at least one packet: loopback's MTU is 64 KiB, so allow two.
ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst 128kb latency 100ms
echo "netem.sh: loopback of namespace $ns shaped to $rate (tc tbf); Open MPI on TCP" >&2

# Shared memory would bypass the shaped link: TCP only, over loopback (the namespace's only
# interface), for the data path and the runtime's own connections. Open MPI's default
# reachability check (netlink) declares loopback peers unreachable; the weighted one does not.
export OMPI_MCA_btl=self,tcp
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_reachable=weighted
# UCX (the ucx backend) likewise: TCP and the process itself only, on the namespace's loopback.
export UCX_TLS=tcp,self
export UCX_NET_DEVICES=lo
status=0
ip netns exec "$ns" "$@" || status=$?
ip netns exec "$ns" tc -s qdisc show dev lo | sed -n '1,3p' | sed 's/^/netem.sh: /' >&2
exit "$status"
