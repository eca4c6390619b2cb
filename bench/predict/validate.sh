#!/usr/bin/env bash
# Validates loom-predict against loom-overlap: for every network x rank count x model shape, one
# loom-overlap run (its three modes interleaved) saves each mode's step profile, and loom-predict
# predicts each mode's step from it. Prints one row per mode: measured, predicted with the wire
# fitted on the same run's sequential mode (--fit-from), and, under netem, with the nominal link
# (--link RATE); then the median |error|. The transport's CPU need (--comm-cpu) is fitted once
# per network on its first run's ddp mode (those rows are marked and left out of the median).
# Each row also sets the measured step against the simulated best: the best schedule
# loom-predict finds for the configuration's loom-mode graph (issue 15 item 5).
# Needs root for netem (bench/netem.sh).
#   bench/predict/validate.sh [BUILD_DIR] [OUT_DIR]
#   NETS="shm 2gbit" RANKS="2 3 4" SHAPES="8x512x256 4x1024x128 12x256x512" bench/predict/validate.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
nets=${NETS:-"shm 2gbit"}
ranks=${RANKS:-"2 3 4"}
shapes=${SHAPES:-"8x512x256 4x1024x128 12x256x512"}  # depth x width x batch
latency=${LATENCY:-50us}
steps=${STEPS:-10}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rows=$out/rows.tsv
: >"$rows"
for net in $nets; do
  for np in $ranks; do
    for shape in $shapes; do
      IFS=x read -r depth width batch <<<"$shape"
      prefix=$out/$net.np$np.$shape
      cmd=(mpirun -np "$np" --oversubscribe --bind-to none "$build/bin/loom-overlap" --threads 1
           --steps "$steps" --warmups 3 --depth "$depth" --width "$width" --batch "$batch"
           --bucket-cap-kb 1024 --first-bucket-kb 256 --profile-json "$prefix")
      load=$(cut -d' ' -f1 /proc/loadavg)
      if [[ $net == shm ]]; then
        "${cmd[@]}" >"$prefix.txt" 2>&1
      else
        "$here/../netem.sh" "$net" -- "${cmd[@]}" >"$prefix.txt" 2>&1
      fi
      printf '%s\t%s\t%s\t%s\t%s\n' "$net" "$np" "$shape" "$prefix" "$load" >>"$rows"
    done
  done
done
python3 - "$rows" "$build/bin/loom-predict" "$latency" <<'PY'
import json, statistics, subprocess, sys
rows_file, predict, latency = sys.argv[1], sys.argv[2], sys.argv[3]
runs = [l.rstrip("\n").split("\t") for l in open(rows_file) if l.strip()]
modes = ["sequential", "ddp", "loom"]

def predict_ms(prefix, mode, wire, comm_cpu, best=False):
    out = subprocess.run([predict, "%s.%s.json" % (prefix, mode), *wire, "--latency", latency,
                          "--comm-cpu", str(comm_cpu), "--json"] + ([] if best else ["--no-best"]),
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)

def fit_wire(prefix):
    return ["--fit-from", prefix + ".sequential.json"]

# One CPU-contention constant per transport (how much of a core the transport takes while on
# the wire), fitted on the first run's ddp mode of that transport and used for every other row.
comm_cpu = {}
for net, np, shape, prefix, load in runs:
    if net in comm_cpu:
        continue
    grid = [i / 20 for i in range(0, 41)]
    measured = predict_ms(prefix, "ddp", fit_wire(prefix), 0)["measured_ms"]
    comm_cpu[net] = min(grid, key=lambda c: abs(predict_ms(prefix, "ddp", fit_wire(prefix), c)["step_ms"] - measured))
    print("comm_cpu %s = %.2f (fitted on %s ranks %s ddp)" % (net, comm_cpu[net], np, shape))
print()
# The simulated best: the best schedule loom-predict finds for the configuration's loom-mode
# graph (issue orders x collectives in flight) on the fitted wire; every mode's measured step is
# set against it.
print("| net | ranks | depth x width x batch | mode | load | measured ms | predicted (fit) ms | error | predicted (link) ms | error | simulated best ms | measured / best |")
print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
over_best = []
fit_err, fit_err_overlapped, link_err = [], [], []
calibration = {}
for net, np, shape, prefix, load in runs:
    first = calibration.setdefault(net, prefix) == prefix
    best = predict_ms(prefix, "loom", fit_wire(prefix), comm_cpu[net], best=True)["best_ms"]
    for mode in modes:
        f = predict_ms(prefix, mode, fit_wire(prefix), comm_cpu[net])
        measured = f["measured_ms"]
        e = f["step_ms"] / measured - 1
        calibrating = first and mode in ("sequential", "ddp")
        if not calibrating:
            fit_err.append(abs(e))
            if mode != "sequential":
                fit_err_overlapped.append(abs(e))
        cells = [net, np, shape, mode + (" (fit)" if calibrating else ""), load, "%.1f" % measured,
                 "%.1f" % f["step_ms"], "%+.1f%%" % (100 * e)]
        if net != "shm":
            l = predict_ms(prefix, mode, ["--link", net], comm_cpu[net])
            le = l["step_ms"] / measured - 1
            link_err.append(abs(le))
            cells += ["%.1f" % l["step_ms"], "%+.1f%%" % (100 * le)]
        else:
            cells += ["-", "-"]
        cells += ["%.1f" % best, "%.3f" % (measured / best)]
        if mode == "loom":
            over_best.append(measured / best)
        print("| " + " | ".join(cells) + " |")
med = lambda v: 100 * statistics.median(v) if v else float("nan")
print()
print("median |error|, wire fitted on the run's sequential mode: %.1f%% over %d rows (%.1f%% over the %d ddp and loom rows); calibration rows excluded"
      % (med(fit_err), len(fit_err), med(fit_err_overlapped), len(fit_err_overlapped)))
if link_err:
    print("median |error|, nominal link: %.1f%% over %d rows" % (med(link_err), len(link_err)))
print("loom mode's measured step / simulated best: median %.3f, range %.3f-%.3f over %d configurations"
      % (statistics.median(over_best), min(over_best), max(over_best), len(over_best)))
PY
