"""The Hugging Face Trainer with planned batches (planner.integrations.huggingface): three gloo ranks with
batches 2, 5, 9 and accumulation 2 train 4 optimizer steps of a causal LM and of a sequence classifier (tiny
Llama configs, random weights, nothing downloaded) and end with the parameters one process gets on the same
global batches; the other loss rule misses; the re-balancer reorders the batches by speed and stays exact.

One spawn runs every scenario (starting processes that import transformers is the slow part); the
references are computed here.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.planner.integrations.exactness import (
    ACCUMULATE,
    BATCHES,
    DATASET_SIZE,
    EXACT,
    OPTIMIZER_STEPS,
    PLANNED_GPUS,
    REBALANCE_STEPS,
    SAMPLE_S,
    SEED,
    SPEEDS,
    STEP_BATCH,
    WRONG,
    assert_planned_job_trained_exactly,
    assert_rebalanced_exactly,
    flat,
    init_gloo,
    plan_document,
    planned_job,
    reference_parameters,
    relative_difference,
    requires_integration,
    samples_of_epoch_once,
    save,
    shared_profile_cache,
    spawn,
)
from tests.planner.integrations.example_runs import PYTHON, REPO, readme_script, run_example, summaries

pytestmark = [
    pytest.mark.hf,
    pytest.mark.timeout(420),
    requires_integration("planner.integrations.huggingface"),
]

LEARNING_RATE = 1.0
REBALANCE_LEARNING_RATE = 0.2
SEQ_LEN = 8
VOCAB = 64


def make_data(task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and labels, the same in every process. Causal LM: labels are the ids with the first position
    -100 (the shifted loss never predicts it; transformers 4.x counts it, 5.x does not: this way both count
    exactly the predicted tokens)."""
    generator = torch.Generator().manual_seed(11)
    ids = torch.randint(1, VOCAB, (DATASET_SIZE, SEQ_LEN), generator=generator)
    if task == "causal":
        labels = ids.clone()
        labels[:, 0] = -100
    else:
        labels = torch.randint(0, 3, (DATASET_SIZE,), generator=generator)
    return ids, labels


def make_model(task: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        pad_token_id=0,
        num_labels=3,
    )
    torch.manual_seed(0)
    return (LlamaForCausalLM if task == "causal" else LlamaForSequenceClassification)(config)


class IndexedTokens(torch.utils.data.Dataset):
    def __init__(self, task: str) -> None:
        self.ids, self.labels = make_data(task)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.labels[index], "index": index}


class RecordingCollator:
    """Stacks the features and records each batch's sample indices once training has begun."""

    def __init__(self) -> None:
        self.active = False
        self.taken: list[list[int]] = []

    def __call__(self, features: list[dict]) -> dict:
        indices = [f["index"] for f in features]
        if self.active:
            self.taken.append(indices)
        return {key: torch.stack([f[key] for f in features]) for key in ("input_ids", "labels")}


def _train(
    rank: int,
    out_dir: str,
    task: str,
    *,
    loss_reduction: str = "auto",
    rebalance=False,
    steps: int = OPTIMIZER_STEPS,
    lr: float = LEARNING_RATE,
    plan=None,
    autobatch=None,
) -> dict:
    from transformers import TrainerCallback, TrainingArguments

    from planner.integrations.huggingface import BatchPlanTrainer

    collator = RecordingCollator()

    class StartRecording(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            collator.active = True

    args = TrainingArguments(
        output_dir=f"{out_dir}/{task}-{rank}",
        per_device_train_batch_size=1,
        max_steps=steps,
        learning_rate=lr,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        seed=SEED,
        dataloader_drop_last=True,
        average_tokens_across_devices=True,
    )  # the default since transformers 4.54, named for older ones
    trainer = BatchPlanTrainer(
        model=make_model(task),
        args=args,
        train_dataset=IndexedTokens(task),
        data_collator=collator,
        callbacks=[StartRecording()],
        batchplan=plan if plan is not None else plan_document(),
        autobatch=autobatch,
        loss_reduction=loss_reduction,
        rebalance=rebalance,
    )
    output = trainer.train()
    run = trainer.batchplan
    return {
        "params": flat(trainer.model),
        "taken": collator.taken,
        "global_step": trainer.state.global_step,
        "metrics": output.metrics,
        "rule": run.rule,
        "accumulate": trainer.args.gradient_accumulation_steps,
        "batches": run.rank_plan.batches,
        "accepts_loss_kwargs": trainer.model_accepts_loss_kwargs,
        "batches_last": list(run.rebalancer.report().batches_last) if run.rebalancer else None,
        "switches": len(run.rebalancer.switches) if run.rebalancer else 0,
    }


def _worker(rank: int, port: int, out_dir: str, profiles: str) -> None:
    import logging

    import torch.distributed as dist
    import transformers

    from planner.integrations import Rebalance
    from planner.runtime.simulate import SimulatedSpeed

    transformers.logging.set_verbosity_error()
    logging.basicConfig(level=logging.INFO)
    init_gloo(rank, port)
    try:
        result = {
            "causal": _train(rank, out_dir, "causal"),
            "causal_mean": _train(rank, out_dir, "causal", loss_reduction="mean"),
            "classify": _train(rank, out_dir, "classify"),
            "classify_global": _train(rank, out_dir, "classify", loss_reduction="global-mean"),
            "rebalance": _train(
                rank,
                out_dir,
                "classify",
                steps=REBALANCE_STEPS,
                lr=REBALANCE_LEARNING_RATE,
                rebalance=Rebalance(simulate=SimulatedSpeed(factors=SPEEDS, sample_s=SAMPLE_S)),
            ),
            "job": _train(
                rank,
                out_dir,
                "classify",
                plan=planned_job(),
                autobatch={"gpu": PLANNED_GPUS[rank], "cache_dir": profiles},
            ),
        }
        save(out_dir, rank, result)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn(_worker, tmp_path_factory.mktemp("hf"), str(shared_profile_cache(tmp_path_factory)))


def _reference(
    task: str,
    steps: int = OPTIMIZER_STEPS,
    lr: float = LEARNING_RATE,
    batches=BATCHES,
    accumulate: int = ACCUMULATE,
) -> torch.Tensor:
    ids, labels = make_data(task)

    def micro_loss(model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        return model(input_ids=ids[indices], labels=labels[indices]).loss  # the model's own mean

    return reference_parameters(
        make_model(task), micro_loss, lr, steps=steps, batches=batches, accumulate=accumulate
    )


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize(("task", "rule"), [("causal", "global-mean"), ("classify", "mean")])
def test_trainer_with_planned_batches_equals_one_process_on_the_same_global_batches(ranks, task, rule):
    reference = _reference(task)
    for rank, result in enumerate(ranks):
        run = result[task]
        assert run["rule"].reduction.value == rule and not run["rule"].declared, run["rule"].line()
        assert relative_difference(run["params"], reference) < EXACT, (
            rank,
            relative_difference(run["params"], reference),
        )
        assert run["global_step"] == OPTIMIZER_STEPS
        assert run["accumulate"] == ACCUMULATE  # from the plan: TrainingArguments left it at 1
        assert [len(b) for b in run["taken"]] == [BATCHES[rank]] * (OPTIMIZER_STEPS * ACCUMULATE)
    assert samples_of_epoch_once([r[task]["taken"] for r in ranks])


@pytest.mark.dist
@pytest.mark.slow
def test_a_classifier_whose_loss_ignores_the_token_count_is_weighted_and_the_trainer_told(ranks):
    # its forward takes **kwargs, so the Trainer believed it divides by num_items_in_batch (transformers #47688)
    assert all(not r["classify"]["accepts_loss_kwargs"] for r in ranks)
    assert all(r["causal"]["accepts_loss_kwargs"] for r in ranks)
    assert "ignores num_items_in_batch" in ranks[0]["classify"]["rule"].why


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize(("task", "scenario"), [("causal", "causal_mean"), ("classify", "classify_global")])
def test_the_other_loss_rule_forced_misses_the_reference(ranks, task, scenario):
    reference = _reference(task)
    for result in ranks:
        assert result[scenario]["rule"].declared
        assert relative_difference(result[scenario]["params"], reference) > WRONG


@pytest.mark.dist
@pytest.mark.slow
def test_samples_per_second_count_the_planned_global_batch(ranks):
    metrics = ranks[0]["classify"]["metrics"]
    samples = metrics["train_samples_per_second"] * metrics["train_runtime"]
    assert samples == pytest.approx(OPTIMIZER_STEPS * STEP_BATCH * ACCUMULATE, rel=0.02), metrics
    assert metrics["batchplan_loss_rule"] == "mean" and metrics["batchplan_batches"] == list(BATCHES)


@pytest.mark.dist
@pytest.mark.slow
def test_rebalancer_orders_the_batches_by_speed_and_keeps_the_gradient_exact(ranks):
    assert_rebalanced_exactly(
        [r["rebalance"] for r in ranks],
        _reference("classify", steps=REBALANCE_STEPS, lr=REBALANCE_LEARNING_RATE),
    )


@pytest.mark.dist
@pytest.mark.slow
def test_the_readme_script_is_the_example_and_it_runs_under_torchrun(tmp_path):
    example = REPO / "examples" / "train_hf_trainer.py"
    assert readme_script("Hugging Face Trainer") == example.read_text()
    stdout = run_example(
        lambda port: [
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "3",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            str(example),
            "plan.json",
        ],
        tmp_path,
    )
    assert summaries(stdout, "Hugging Face Trainer") == {
        0: "global-mean",
        1: "global-mean",
        2: "global-mean",
    }, stdout
    assert len(re.findall(r"samples/s \d", stdout)) == 3


@pytest.mark.dist
@pytest.mark.slow
def test_a_job_planned_in_the_run_trains_its_own_batches_exactly(ranks):
    assert_planned_job_trained_exactly(
        [r["job"] for r in ranks], lambda batches: _reference("classify", batches=batches, accumulate=1)
    )


def _one_rank_trainer(tmp_path, task: str, **options):
    from transformers import TrainingArguments

    from planner.integrations.huggingface import BatchPlanTrainer
    from tests.plans import make_plan

    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=1,
        learning_rate=LEARNING_RATE,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        remove_unused_columns=False,
        seed=SEED,
        **options,
    )
    plan = make_plan((STEP_BATCH,), nodes=(("node-a", 1),), accumulate=ACCUMULATE)
    return BatchPlanTrainer(
        model=make_model(task),
        args=args,
        train_dataset=IndexedTokens(task),
        data_collator=RecordingCollator(),
        batchplan=plan,
    )


def test_a_gradient_accumulation_other_than_the_plan_s_is_refused_in_one_line(tmp_path):
    from planner.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        _one_rank_trainer(tmp_path, "classify", gradient_accumulation_steps=3)
    assert str(info.value).startswith("gradient_accumulation_steps=3 contradicts the plan's accumulate 2")
    assert "\n" not in str(info.value)


def test_one_process_with_accumulation_trains_a_classifier_exactly(tmp_path):
    # a plain Trainer of transformers 5.x takes this model's loss as normalised by num_items_in_batch and
    # divides it by nothing: with accumulation 2 its step is twice too large (#47688); the integration tells it
    trainer = _one_rank_trainer(tmp_path, "classify")
    trainer.train()
    assert (
        trainer.batchplan.rule.reduction.value == "mean"
        and trainer.args.gradient_accumulation_steps == ACCUMULATE
    )
    assert relative_difference(flat(trainer.model), _reference("classify", steps=1)) < EXACT
