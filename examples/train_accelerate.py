"""An Accelerate loop with a plan's batches: accelerate launch --num_processes 3 examples/train_accelerate.py plan.json"""

import os
import sys

import torch
from accelerate import Accelerator

from planner.integrations.accelerate import prepare_planned

accelerator = Accelerator(cpu=not torch.cuda.is_available())  # its gradient accumulation: taken from the plan
generator = torch.Generator().manual_seed(0)
x = torch.randn(4096, 16, generator=generator)
dataset = torch.utils.data.TensorDataset(x, x[:, :4].sum(dim=1, keepdim=True).sin())  # your dataset
# this rank's batches, on its device, not re-sharded
planned = prepare_planned(accelerator, sys.argv[1], dataset)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))  # your model
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)  # the model and optimizer only: never the loader
for step, (inputs, targets) in enumerate(planned.loader):
    with accelerator.accumulate(model):
        # a mean over the rank's samples takes b_i·W/B (prepare_planned(..., loss_reduction="sum") for a sum)
        loss = torch.nn.functional.mse_loss(model(inputs), targets) * planned.loss_weight
        accelerator.backward(loss)  # divides by the plan's accumulate
        optimizer.step()
        optimizer.zero_grad()
    if step + 1 == 10 * planned.rank_plan.accumulate:  # 10 optimizer steps
        break
print(planned.summary_line(), flush=True)
# every rank done before any tears the group down, then out without the interpreter's teardown (README: "Using
# the plan in a training script")
accelerator.wait_for_everyone()
accelerator.end_training()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
