#!/usr/bin/env bash
# parallelize with default arguments against DDP on Gloo, as a new user runs it: each case one
# mpirun of bench/torch/real_models.py (modes ddp-gloo and parallelize-default, interleaved
# rounds, one thread per rank) under bench/netem.sh RATE, LAUNCHES launches per case in turn
# (case A, case B, ..., then again), so a drifting host slows every case alike. Prints per case
# each launch's ratio (median step over DDP's median step, and the median of same-round ratios)
# and the median over launches; the warm-up of parallelize-default lasts until its automatic plan
# decided (the step is printed), the first SERIES steps of both modes are kept as a series.
#   bench/torch/defaults.sh [RATE] [LAUNCHES]           (default 2gbit 2; needs root for RATE)
#   CASES="transformer:sgd gpt:adamw gpt:adamw:clip" PYTHON=/path/venv/bin/python ...
# Cases are MODEL:OPTIMIZER[:clip] (clip: clip_grad_norm_(1.0) between backward and step, which
# parallelize runs with defer_updates=True). resnet18 needs torchvision in PYTHON's environment.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rate=${1:-2gbit}
launches=${2:-2}
cases=${CASES:-transformer:sgd gpt:adamw resnet18:sgd convnet:sgd mlp:sgd gpt:adamw:clip}
python=${PYTHON:-$root/.venv/bin/python}
build=${BUILD:-}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
series=${SERIES:-30}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LOOM_CALIBRATION=${LOOM_CALIBRATION:-0}
export MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=1073741824
[[ -n $build ]] && export PYTHONPATH=$build/python
echo "# defaults.sh: $rate, $launches launches per case, $python ($("$python" -c \
  'import torch; print("torch", torch.__version__)')), load $(cut -d' ' -f1 /proc/loadavg)," \
  "commit $(git -C "$root" rev-parse --short HEAD)"
for launch in $(seq "$launches"); do
  for c in $cases; do
    IFS=: read -r model optimizer clip <<<"$c"
    flags=(--model "$model" --optimizer "$optimizer" --modes ddp-gloo,parallelize-default
           --steps 8 --rounds 5 --series "$series" --json "$out/$c.$launch.json")
    [[ ${clip:-} == clip ]] && flags+=(--clip 1.0)
    "$root/bench/netem.sh" "$rate" -- mpirun -np 2 --oversubscribe --bind-to none \
      -x PYTHONPATH -x LOOM_CALIBRATION -x MALLOC_TRIM_THRESHOLD_ -x MALLOC_MMAP_THRESHOLD_ \
      ${LOOM_PROGRESS_PRIORITY:+-x LOOM_PROGRESS_PRIORITY} \
      "$python" "$root/bench/torch/real_models.py" "${flags[@]}" >"$out/$c.$launch.txt" 2>&1 ||
      { cat "$out/$c.$launch.txt" >&2; exit 1; }
  done
done
"$python" - "$out" "$launches" $cases <<'PY'
import json, statistics, sys
out, launches, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("%-18s %-28s %9s %9s  %s" % ("case", "row", "/ddp", "/ddp rnd", "per launch (/ddp rnd), plan"))
for c in cases:
    runs = [json.load(open("%s/%s.%d.json" % (out, c, k))) for k in range(1, launches + 1)]
    for mode in runs[0]["modes"]:
        if mode == "ddp-gloo":
            continue
        rows = [r["modes"][mode] for r in runs]
        ddp = [r["modes"]["ddp-gloo"]["step_ms"] for r in runs]
        ratio = statistics.median(m["step_ms"] / d for m, d in zip(rows, ddp))
        rounds = statistics.median(m["ratio_rounds"] for m in rows)
        each = ", ".join("%.3f" % m["ratio_rounds"] for m in rows)
        plan = rows[-1].get("plan", "")
        decided = "; decided at step %s" % ",".join(str(m.get("decided_at_step", "-"))
                                                    for m in rows)
        print("%-18s %-28s %9.3f %9.3f  %s; %s%s" % (c, mode, ratio, rounds, each, plan, decided))
        for m, r in zip(rows, runs):
            s, d = m.get("series_ms"), r["modes"]["ddp-gloo"].get("series_ms")
            if s and d:
                def med(v, a, b):
                    return statistics.median(v[a:b]) if v[a:b] else float("nan")
                print("%-18s   series ms steps 1-5 / 6-20 / 21-%d: %.0f %.0f %.0f (ddp %.0f %.0f %.0f)"
                      % ("", len(s), med(s, 0, 5), med(s, 5, 20), med(s, 20, len(s)),
                         med(d, 0, 5), med(d, 5, 20), med(d, 20, len(d))))
PY
echo "# raw outputs in $out"
