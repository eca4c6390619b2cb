#!/usr/bin/env bash
# bench/cluster/mlp_step.sh runs end to end (one short round on 2 x 2): every mode's row, free and
# flat-only, and the simulator's two rows, each with a positive step. No timing is asserted.
#   mlp_step_smoke.sh CLUSTER_SH MLP_STEP_SH BUILD_DIR
# Exits 77 (the tests' SKIP_RETURN_CODE) where `cluster.sh --check` says no cluster can be built.
set -euo pipefail
cluster_sh=$1 mlp_step=$2 build=$3
if ! why=$("$cluster_sh" --check 2>&1); then
  echo "SKIP: $why" >&2
  exit 77
fi
table=$(ROUNDS=1 STEPS=3 "$mlp_step" "$build")
echo "$table"
status=0
for mode in sequential ddp loom loom-auto; do
  if ! grep -Eq "^\| $mode \| [0-9]+\.[0-9] \| [0-9]+\.[0-9] \| \*\*[0-9]+\.[0-9]{3}\*\* \|" <<<"$table"; then
    echo "FAIL: no row for mode $mode" >&2
    status=1
  fi
done
for profile in free flat; do
  # every algorithm: hierarchical on 2 x 2; flat only: one of the flat ones
  if ! grep -Eq "^\| $profile \| [0-9.]+ \(hierarchical\) \| [0-9.]+ \((ring|rd|rabenseifner)\) \| [0-9.]+ \|" <<<"$table"; then
    echo "FAIL: no simulator row for the $profile profile" >&2
    status=1
  fi
done
exit $status
