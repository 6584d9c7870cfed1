"""Lightning with a plan's batches: python examples/train_lightning.py plan.json (Lightning starts the plan's ranks)"""

import os
import sys

import lightning as L
import torch

from planner.integrations.lightning import BatchPlanCallback, trainer_devices

batchplan = BatchPlanCallback(sys.argv[1])  # loss_reduction="mean" (default): training_step returns a mean


class Regression(L.LightningModule):  # your module: nothing in it knows about the plan but its loader
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.net(inputs), targets)  # the callback weights it

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        x = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))
        dataset = torch.utils.data.TensorDataset(x, x[:, :4].sum(dim=1, keepdim=True).sin())  # your dataset
        return batchplan.dataloader(dataset)  # this rank's planned batches


trainer = L.Trainer(
    **trainer_devices(sys.argv[1]),
    strategy="ddp",
    max_steps=10,
    callbacks=[batchplan],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
)
trainer.fit(Regression())  # accumulate_grad_batches from the plan, use_distributed_sampler handled
print(batchplan.summary_line(), flush=True)
# every rank done before any tears the group down, then out without the interpreter's teardown (README: "Using
# the plan in a training script")
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
