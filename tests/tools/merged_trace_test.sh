#!/usr/bin/env bash
# Runs the train step on WORLD ranks (under LAUNCHER, or as local threads with "local"), merges
# every rank's trace with loom-trace-merge and checks the merged timeline; then checks that the
# tool refuses what is not a set of loom traces, naming the file.
# usage: merged_trace_test.sh BIN_DIR WORK_DIR WORLD local|MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
bin=$1 work=$2 world=$3 launcher=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
args=(--depth 6 --width 256 --steps 3 --bucket-cap-kb 256 --first-bucket-kb 64 --dot step.dot
      --trace trace.json)
if [[ $launcher == local ]]; then
  "$bin/loom-train-step" --ranks "$world" "${args[@]}" > run.txt
else
  "$launcher" "$@" -np "$world" "$bin/loom-train-step" "${args[@]}" > run.txt
fi
grep -q "loom-trace-merge -o job.json trace.rank\*.json" run.txt
"$bin/loom-trace-merge" -o job.json trace.rank*.json
python3 "$here/check_merged_trace.py" job.json "$world"
# Refusals: two files of one rank, a file that is not a loom trace.
if "$bin/loom-trace-merge" -o bad.json trace.rank0.json trace.rank0.json 2> err.txt; then
  echo "accepted two traces of rank 0"; exit 1
fi
grep -q "trace.rank0.json and trace.rank0.json are both rank 0" err.txt
echo '{"traceEvents":[]}' > foreign.json
if "$bin/loom-trace-merge" -o bad.json foreign.json 2> err.txt; then
  echo "accepted a trace without loom's clock data"; exit 1
fi
grep -q "foreign.json: not a loom trace with clock data" err.txt
echo "merged trace of $world ranks checked"
