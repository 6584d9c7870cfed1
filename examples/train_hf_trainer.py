"""Train a Hugging Face model with a plan's batches: torchrun --nproc-per-node 3 examples/train_hf_trainer.py plan.json"""

import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

from planner.integrations.huggingface import BatchPlanTrainer


class Tokens(torch.utils.data.Dataset):  # your dataset: synthetic token ids, labels = the ids
    def __init__(self, size=4096, seq_len=32, vocab_size=256):
        self.ids = torch.randint(0, vocab_size, (size, seq_len), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


# your model (random weights)
model = LlamaForCausalLM(
    LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
)
args = TrainingArguments(
    output_dir="hf-run",
    max_steps=10,
    learning_rate=1e-3,
    logging_steps=5,
    report_to="none",
    save_strategy="no",
    use_cpu=not torch.cuda.is_available(),
)
# rebalance=True switches on the in-job re-balancer
trainer = BatchPlanTrainer(model=model, args=args, train_dataset=Tokens(), batchplan=sys.argv[1])
metrics = trainer.train().metrics  # each rank its planned batch; gradient_accumulation_steps from the plan
print(trainer.batchplan.summary_line(), f"samples/s {metrics['train_samples_per_second']}", flush=True)
# every rank done before any tears the group down, then out without the interpreter's teardown (README: "Using
# the plan in a training script")
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
