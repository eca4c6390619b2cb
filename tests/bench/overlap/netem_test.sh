#!/usr/bin/env bash
# Tests bench/netem.sh: usage errors, the root check, and (as root, where namespaces are
# allowed) that the command runs behind a tbf-shaped loopback and the namespace is removed.
# Exits 77 (ctest: skipped) for the parts this machine cannot do.
set -uo pipefail
netem=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$netem" 2gbit 2>&1); status=$?
[[ $status -eq 2 && $out == *usage:* ]] || fail "no command: status $status, output: $out"
out=$("$netem" 2gbit true 2>&1); status=$?
[[ $status -eq 2 && $out == *usage:* ]] || fail "missing --: status $status, output: $out"

if [[ $(id -u) -ne 0 ]]; then
  out=$("$netem" 1gbit -- true 2>&1); status=$?
  [[ $status -eq 1 && $out == *"needs root"* ]] || fail "as non-root: status $status: $out"
  echo "netem.sh refuses without root, as it should; shaping not tested (not root)"
  exit 77
fi
if command -v setpriv >/dev/null; then
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$netem" 1gbit -- true 2>&1); status=$?
  [[ $status -eq 1 && $out == *"needs root"* ]] || fail "as nobody: status $status: $out"
fi
probe=loom-netem-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then
  echo "network namespaces are not allowed here; shaping not tested"
  exit 77
fi
ip netns delete "$probe"

out=$("$netem" 1gbit -- sh -c 'tc qdisc show dev lo; exit 3' 2>&1); status=$?
[[ $status -eq 3 ]] || fail "the command's exit status 3 came back as $status: $out"
[[ $out == *"tbf"*"rate 1Gbit"* ]] || fail "loopback is not shaped by tbf at 1Gbit: $out"
ns=$(grep -o 'loom-netem-[0-9]*' <<<"$out" | head -1)
[[ -n $ns ]] || fail "netem.sh did not name its namespace: $out"
! ip netns list | grep -qw "$ns" || fail "namespace $ns was left behind"
echo "netem.sh OK: $ns shaped to 1Gbit, exit status passed through, namespace removed"
