#!/usr/bin/env bash
# Real models (bench/torch/real_models.py) as DDP on Gloo, DDP on loom with loom's hook and
# loom_torch.parallelize, at NP ranks and at 1 rank (the step without communication), all in one
# netem namespace (bench/netem.sh; RATE "shm": shared memory), rounds interleaved inside each
# launch; prints per model each mode's step, its ratio to DDP on Gloo (of the medians, and the
# median of same-round ratios: real_models.py's docstring says why), and its distance to the
# bound max(1-rank step, wire time of one step's gradients); parallelize rows also the step
# simulator's prediction of their period (net.predict(), rank 0's) and its error against the
# period measured over the same steps (MODES may add parallelize-auto: bucket_cap_mb="auto"),
# and every row the host's interrupt and softirq time per step ("irq ms", all CPUs: where the
# kernel moves loopback TCP through the shaper, work a NIC would do that takes the ranks' cores).
# MODES may also name parallelize-default (parallelize() with its default plan) and
# ddp-gloo-optim-bwd (DDP on Gloo with torch's optimizer in backward); OPTIMIZER (sgd, adamw),
# CLIP (clip_grad_norm_'s max norm, 0: none; parallelize rows then defer their updates, named
# "+defer") and SERIES (N: warm up N steps per mode, each recorded) pass on to real_models.py.
#   bench/torch/real_models.sh [RATE] [BUILD_DIR]
#   MODELS="transformer convnet" NP=3 COMPRESSION=float16 bench/torch/real_models.sh 10gbit
#   MODELS=mlp MODES=ddp-gloo,parallelize-default OPTIMIZER=adamw CLIP=1 SERIES=25 \
#     bench/torch/real_models.sh shm
#   LAUNCHER=torchrun MODELS=transformer bench/torch/real_models.sh 2gbit  # torchrun, not mpirun
# Set-up: PYTHON (default: the project's venv, $root/.venv/bin/python, else python3) with torch
# and, for resnet18/mobilenet_v2, torchvision, which the project's venv lacks: install
# torch==2.14.1 and torchvision==0.29.1 into a separate venv and name its python in PYTHON.
# RATE needs root.
# Every rank runs with glibc's malloc told to keep freed memory (MALLOC_TRIM_THRESHOLD_ and
# MALLOC_MMAP_THRESHOLD_ 1 GiB; MALLOC=default leaves glibc's defaults): with its defaults a
# torch process, depending on what it allocated before, hands its activations' pages back to the
# kernel after each step and faults them in again in the next, every mode alike (plain torch
# with no communication at all: 300 ms steps where 80 ms is the norm, in the same process right
# after other models' steps). The same setting reaches every mode, DDP's too.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [[ ${1:-} == --inner ]]; then
  rate=$2 build=$3 out=$4
else
  rate=${1:-2gbit}
  build=$(cd "${2:-$root/build}" && pwd)
  out=${OUT:-$(mktemp -d)}
fi
models=${MODELS:-transformer resnet18 convnet mlp}
np=${NP:-2}
compression=${COMPRESSION:-none}
modes=${MODES:-local,ddp-gloo,ddp-loom,parallelize}
steps=${STEPS:-8}
discard=${DISCARD:-1}
rounds=${ROUNDS:-3}
optimizer=${OPTIMIZER:-sgd}
clip=${CLIP:-0}
series=${SERIES:-none}
series_flag=()
[[ $series == none ]] || series_flag=(--series "$series")
if [[ -n ${PYTHON:-} ]]; then
  python=$PYTHON
elif [[ -x $root/.venv/bin/python ]]; then
  python=$root/.venv/bin/python
else
  python=python3
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
malloc=()
if [[ ${MALLOC:-keep} != default ]]; then
  export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-1073741824}
  export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-1073741824}
  malloc=(-x MALLOC_TRIM_THRESHOLD_ -x MALLOC_MMAP_THRESHOLD_)
fi
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}

launcher=${LAUNCHER:-mpirun}
if [[ ${1:-} == --inner ]]; then
  for model in $models; do
    for n in "$np" 1; do
      if [[ $launcher == torchrun ]]; then
        # torchrun's ranks: loom's ucx backend through torch's store, Gloo as always.
        start=("$python" -m torch.distributed.run --standalone --nproc-per-node "$n")
      else
        start=(mpirun -np "$n" --oversubscribe --bind-to none -x PYTHONPATH -x LOOM_CALIBRATION
          ${malloc[@]+"${malloc[@]}"} "$python")
      fi
      "${start[@]}" \
        "$root/bench/torch/real_models.py" --model "$model" --modes "$modes" \
        --compression "$compression" --steps "$steps" --rounds "$rounds" --discard "$discard" \
        --optimizer "$optimizer" --clip "$clip" ${series_flag[@]+"${series_flag[@]}"} \
        --json "$out/$model.np$n.json" >"$out/$model.np$n.txt" 2>&1 ||
        { cat "$out/$model.np$n.txt" >&2; exit 1; }
    done
  done
  exit 0
fi

if [[ " $models " =~ " resnet18 " || " $models " =~ " mobilenet_v2 " ]] &&
  ! "$python" -c "import torchvision" 2>/dev/null; then
  echo "real_models: resnet18 and mobilenet_v2 need torchvision, which $python lacks:" \
    "install it into a separate venv (python3 -m venv /path/tv &&" \
    "/path/tv/bin/pip install torch==2.14.1 torchvision==0.29.1) and run with" \
    "PYTHON=/path/tv/bin/python, or leave them out of MODELS" \
    "(e.g. MODELS=\"transformer convnet mlp\")" >&2
  exit 1
fi
mkdir -p "$out"
load=$(cut -d' ' -f1 /proc/loadavg)
# The calibration of a busy host is not cached and takes minutes: measure with the untuned
# selector unless the caller asks otherwise.
export LOOM_CALIBRATION=${LOOM_CALIBRATION:-0}
if [[ $rate == shm ]]; then
  "$0" --inner "$rate" "$build" "$out"
else
  "$root/bench/netem.sh" "$rate" -- "$0" --inner "$rate" "$build" "$out"
fi
"$python" - "$out" "$np" "$rate" "$compression" "$load" "$(cut -d' ' -f1 /proc/loadavg)" \
  "$optimizer" "$clip" "$series" $models <<'PY'
import json, sys
out, np, rate, compression, load0, load1, optimizer, clip, series = sys.argv[1:10]
import os
import statistics
print("# real_models: %s ranks, %s, compression %s, optimizer %s, clip %s, series %s; "
      "load average %s -> %s; malloc %s" %
      (np, rate, compression, optimizer, clip, series, load0, load1,
       "trim/mmap thresholds %s/%s" % (os.environ.get("MALLOC_TRIM_THRESHOLD_", "-"),
                                       os.environ.get("MALLOC_MMAP_THRESHOLD_", "-"))
       if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ
       else "glibc's defaults"))
runs = [(model, json.load(open("%s/%s.np%s.json" % (out, model, np))),
         json.load(open("%s/%s.np1.json" % (out, model)))) for model in sys.argv[10:]]
# The mode column fits plan-carrying names ("parallelize:cap=2:first=0.25").
mode_column = "%%-%ds" % max([16] + [len(m) for _, many, _ in runs for m in many["modes"]])
print(("%-12s " + mode_column + " %10s %9s %9s %10s %10s %9s %9s %7s %10s %10s %7s") %
      ("model", "mode", "step ms", "/ddp", "/ddp rnd", "1-rank ms", "wire ms", "/bound", "/bound-N",
       "irq ms", "period ms", "pred ms", "|err|"))
for model, many, one in runs:
    ddp = many["modes"].get("ddp-gloo", {}).get("step_ms")
    # bound-N: the "local" row's step (N ranks computing at once, no communication) in place of
    # the 1-rank step: what the host's shared cores and memory leave before any communication.
    local = many["modes"].get("local", {}).get("step_ms")
    for mode, r in many["modes"].items():
        alone = one["modes"][mode]["step_ms"]
        bound = max(alone, many["wire_ms"])
        bound_n = "%9.3f" % (r["step_ms"] / max(local, many["wire_ms"])) if local else "%9s" % "-"
        predicted = ("%10.1f %10.1f %6.1f%%" % (r["period_ms"], r["pred_ms"], 100 * abs(r["err"]))
                     if "pred_ms" in r else "%10s %10s %7s" % ("-", "-", "-"))
        # /ddp rnd: the median of same-round ratios (real_models.py's ratio_rounds)
        rounds = "%.3f" % r["ratio_rounds"] if "ratio_rounds" in r else "-"
        # irq ms: the host's interrupt and softirq time per step (every CPU; the kernel's work
        # moving loopback TCP through the shaper, charged to no process: a NIC would do it)
        irq = "%7.1f" % r["softirq_ms"] if "softirq_ms" in r else "%7s" % "-"
        print(("%-12s " + mode_column + " %10.1f %9s %9s %10.1f %10.1f %9.3f %s %s %s") %
              (model, mode, r["step_ms"], "%.3f" % (r["step_ms"] / ddp) if ddp else "-", rounds,
               alone, many["wire_ms"], r["step_ms"] / bound, bound_n, irq, predicted))
# The automatic plans' decisions and the warm-up series (--series), at NP ranks.
for model, many, one in runs:
    for mode, r in many["modes"].items():
        notes = []
        if "decided_at_step" in r:
            notes.append("plan decided at step %s" % r["decided_at_step"])
        series = r.get("series_ms")
        if series:
            notes.append("series median ms " + ", ".join(
                "%d-%d %.1f" % (a, min(b, len(series)), statistics.median(series[a - 1:b]))
                for a, b in ((1, 5), (6, 20), (21, len(series))) if a <= len(series)))
        if notes:
            print(("%-12s " + mode_column + " %s") % (model, mode, "; ".join(notes)))
PY
echo "(files in $out)"
