"""A DDP job on the "loom" group in which one rank stops (SIGKILL) at step 3.

Run by run_ddp_fault.py under mpirun. The survivors do nothing special: loom's timeout fails the
bucket's future inside backward(), the RuntimeError is uncaught, and loom_torch's excepthook
ends the process after Python printed it (see loom_torch/__init__.py).
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import loom_torch

victim = int(sys.argv[1])
hook = sys.argv[2] if len(sys.argv) > 2 else "ddp"
torch.set_num_threads(1)
dist.init_process_group("loom")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 8)), bucket_cap_mb=0.01)
if hook != "ddp":
    loom_torch.register_ddp_hook(model, compression=hook)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 32), torch.randn(64, 8)
for step in range(6):
    if step == 3 and rank == victim:
        print("loom-fault: rank %d step %d: SIGKILL to myself" % (rank, step), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    print("loom-fault: rank %d step %d: start" % (rank, step), flush=True)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("loom-fault: rank %d finished" % rank, flush=True)
