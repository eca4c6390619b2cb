#!/usr/bin/env python3
"""PyTorch Lightning (from PyPI) on loom, launched three ways: Lightning's own launcher, torchrun
and mpirun. Each runs Trainer(accelerator="cpu", strategy=DDPStrategy(process_group_backend=
"loom")) on a small model, logging the loss with self.log(..., sync_dist=True) in training and
validation; the final weights and the logged metrics must equal those of the same run on Gloo
(under Lightning's launcher). Exits non-zero naming the launcher and what differed.

    python3 tests/torch/lightning_check.py --ranks 2 --launchers lightning,torchrun,mpirun

One run, as the launchers start it (the driver above does this):
    python3 tests/torch/lightning_check.py --worker --backend loom --ranks 2 --out FILE
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def worker(args):
    import torch
    import torch.distributed as dist
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy
    import loom_torch

    torch.set_num_threads(1)

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                           torch.nn.Linear(32, 4))
            self.transport = None

        def on_fit_start(self):
            # The group Lightning made is loom's, over the transport the launcher implies.
            group = dist.distributed_c10d._get_default_group()
            if args.backend == "loom":
                self.transport = loom_torch.backend_of(group).backend_name()
            else:
                self.transport = dist.get_backend()

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, sync_dist=True, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(96, 16, generator=generator)
    y = torch.randn(96, 4, generator=generator)
    data = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(data, batch_size=8)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:40], y[:40]),
                                      batch_size=8)
    model = Model()
    trainer = pl.Trainer(accelerator="cpu", devices=args.ranks, max_epochs=2,
                         strategy=DDPStrategy(process_group_backend=args.backend),
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, train, val)
    if trainer.global_rank == 0:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        torch.save({"state": model.state_dict(), "metrics": metrics,
                    "transport": model.transport, "world": trainer.world_size},
                   args.out + ".tmp")
        os.replace(args.out + ".tmp", args.out)


def run(name, command, env, timeout_s):
    start = time.time()
    try:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout_s, text=True)
    except subprocess.TimeoutExpired as error:
        return "%s: no result within %d s (a hang)\n%s" % (name, timeout_s, error.output or "")
    if done.returncode != 0:
        return "%s: exit status %d\n%s" % (name, done.returncode, done.stdout[-6000:])
    print("%s: finished in %.1f s" % (name, time.time() - start))
    return None


def compare(name, reference, result, expect_transport, expect_world):
    import torch
    ref, got = torch.load(reference), torch.load(result)
    problems = []
    if got["transport"] != expect_transport:
        problems.append("the group ran on %s, not %s" % (got["transport"], expect_transport))
    if got["world"] != expect_world:
        problems.append("world size %d, not %d" % (got["world"], expect_world))
    for key, value in ref["state"].items():
        if not torch.equal(value, got["state"][key]):
            diff = float((value - got["state"][key]).abs().max())
            problems.append("weight %s differs from Gloo's by up to %g" % (key, diff))
    if set(ref["metrics"]) != set(got["metrics"]):
        problems.append("logged %s, Gloo logged %s" % (sorted(got["metrics"]),
                                                        sorted(ref["metrics"])))
    for key in ref["metrics"]:
        if key in got["metrics"] and got["metrics"][key] != ref["metrics"][key]:
            problems.append("%s %r, on Gloo %r" % (key, got["metrics"][key], ref["metrics"][key]))
    if problems:
        return "%s: %s" % (name, "; ".join(problems))
    print("%s: %d weights and %d sync_dist metrics (%s) equal to Gloo's, on loom's %s backend"
          % (name, len(ref["state"]), len(ref["metrics"]),
             ", ".join("%s %.6f" % kv for kv in sorted(got["metrics"].items())),
             got["transport"]))
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--backend", default="loom")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--launchers", default="lightning,torchrun,mpirun")
    ap.add_argument("--mpiexec", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--timeout-s", type=int, default=240)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0

    try:
        import pytorch_lightning  # noqa: F401
        import mpi4py  # noqa: F401  Lightning's MPIEnvironment finds mpirun's ranks through it
    except ImportError as error:
        print("skipped: %s (the test command's .venv has them: pip install pytorch-lightning "
              "mpi4py)" % error)
        return 0
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.setdefault("LOOM_TIMEOUT_S", "60")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        def command(backend, out):
            return [sys.executable, HERE, "--worker", "--backend", backend,
                    "--ranks", str(args.ranks), "--out", out]

        reference = os.path.join(tmp, "gloo.pt")
        error = run("gloo under Lightning's launcher", command("gloo", reference), env,
                    args.timeout_s)
        if error:
            print(error)
            return 1
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        launches = {
            "lightning": ([], "ucx"),
            "torchrun": ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", str(args.ranks)], "ucx"),
            "mpirun": ([args.mpiexec, "-np", str(args.ranks), "--oversubscribe"] + root
                       + ["--mca", "btl", "self,vader,tcp"], "mpi"),
        }
        for launcher in args.launchers.split(","):
            prefix, transport = launches[launcher]
            out = os.path.join(tmp, launcher + ".pt")
            cmd = command("loom", out)
            if prefix:  # torchrun and mpirun start the script itself, not the interpreter
                cmd = prefix + ([sys.executable] if launcher == "mpirun" else []) + cmd[1:]
            name = "loom under %s" % launcher
            error = run(name, cmd, env, args.timeout_s)
            error = error or compare(name, reference, out, transport, args.ranks)
            if error:
                print(error)
                failures.append(launcher)
    if failures:
        print("failed under: %s" % ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
