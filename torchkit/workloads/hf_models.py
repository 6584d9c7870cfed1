"""Hugging Face text models from a config (``hf:ARCH`` or ``hf:path/to/config.json``), fresh weights, no
download: ``hf:gpt2`` is ``AutoConfig.for_model("gpt2")`` (the architecture's default config),
``hf:GPT2LMHeadModel`` (a class name, as a config.json's ``architectures`` lists it) that class on its config
class's defaults, a path is read from disk.

The model class is the config's own ``architectures[0]`` where it names one, else the first of causal LM,
masked LM and sequence classification that the architecture has. The inputs are a dict,
``input_ids``/``attention_mask``/``labels`` (``[B, seq_len]`` token ids in the config's vocabulary; class ids
``[B]`` for sequence classification), passed as keyword arguments, and the loss is the one the model
computes from ``labels`` (``output.loss``), as in a Hugging Face training loop.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import torch

from torchkit.errors import WorkloadError
from torchkit.workloads.extras import import_library
from torchkit.workloads.inputs import model_loss

DEFAULT_MAX_SEQ_LEN = 1024
"""the sequence length when none is given: the model's maximum, at most this (GPT-2's context)"""
AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSequenceClassification")
"""the heads tried, in order, when the config names no architecture"""


def hf_workload(spec: str, arch: str, *, seq_len: int | None, input_shape: tuple[int, ...] | None):
    """The workload of ``hf:ARCH`` / ``hf:config.json`` at ``seq_len`` tokens per sample."""
    from torchkit.workloads.workload import Workload

    transformers = import_library("transformers", model=spec)
    import_library(
        "transformers.modeling_utils", model=spec
    )  # lazy in transformers; where a broken torchvision shows
    config = _config(transformers, spec, arch)
    model_class = _model_class(transformers, config, spec)
    max_len = _max_positions(config)
    length = _sequence_length(spec, seq_len, input_shape, max_len)
    vocab = int(config.vocab_size)
    classify = model_class.__name__.endswith("ForSequenceClassification")
    num_labels = int(getattr(config, "num_labels", 2))

    def make_batch(batch: int):
        ids = torch.randint(0, vocab, (batch, length))
        labels = (
            torch.randint(0, num_labels, (batch,)) if classify else torch.randint(0, vocab, (batch, length))
        )
        return {
            "input_ids": ids,
            "attention_mask": torch.ones(batch, length, dtype=torch.int64),
            "labels": labels,
        }, None

    def build() -> torch.nn.Module:
        model = model_class(config)
        if "input_ids" not in inspect.signature(model.forward).parameters:
            raise WorkloadError(
                f"model {spec!r} ({model_class.__name__}) takes no input_ids (only text models are supported)"
            )
        return model

    return Workload(
        name=spec,
        sample_shape=(length,),
        build_model=build,
        make_batch=make_batch,
        loss_fn=model_loss,
        config=f"hf={model_class.__name__},{config.to_json_string(use_diff=False)}",
        description=f"Hugging Face {model_class.__name__} ({config.model_type}), sequence length {length}, "
        f"vocabulary {vocab}, the model's own loss from labels (fresh weights)",
    )


def _config(transformers, spec: str, arch: str):
    path = Path(arch)
    if arch.endswith(".json") or os.sep in arch or path.is_dir():
        if not path.exists():
            raise WorkloadError(
                f"model {spec!r}: {arch} does not exist (give a config.json or hf:ARCH such as hf:gpt2)"
            )
        try:
            return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        except Exception as e:
            raise WorkloadError(
                f"model {spec!r}: {arch} is not a Hugging Face config: {type(e).__name__}: {e}"
            ) from e
    model_class = _named_model_class(transformers, arch)
    if model_class is not None:  # a class name as config.json's "architectures" lists it (GPT2LMHeadModel)
        config = model_class.config_class()
        config.architectures = [arch]
        return config
    try:
        return transformers.AutoConfig.for_model(arch)
    except ValueError as e:
        import difflib

        known = list(transformers.CONFIG_MAPPING.keys())
        close = difflib.get_close_matches(arch, known, n=3)
        raise WorkloadError(
            f"transformers has no architecture {arch!r} ({'did you mean ' + ', '.join(close) + '? ' if close else ''}"
            "give a model type such as gpt2, bert, llama, a model class such as GPT2LMHeadModel, or a path to a "
            "config.json)"
        ) from e


def _named_model_class(transformers, name: str):
    """The transformers model class called ``name`` (``GPT2LMHeadModel``), or None: only a name that starts
    upper-case (model types are lower-case) and is a ``PreTrainedModel`` with a config class."""
    if not name[:1].isupper():
        return None
    try:
        candidate = getattr(transformers, name, None)
    except Exception:  # transformers' lazy module raises when an optional backend of that class is missing
        return None
    base = getattr(transformers, "PreTrainedModel", None)
    if (
        isinstance(candidate, type)
        and base is not None
        and issubclass(candidate, base)
        and candidate.config_class
    ):
        return candidate
    return None


def _model_class(transformers, config, spec: str):
    for name in getattr(config, "architectures", None) or ():
        model_class = getattr(transformers, name, None)
        if model_class is not None:
            return model_class
    for auto_name in AUTO_CLASSES:
        mapping = getattr(transformers, auto_name)._model_mapping
        if type(config) in mapping:
            return mapping[type(config)]
    raise WorkloadError(
        f"model {spec!r}: {config.model_type} has no causal-LM, masked-LM or sequence-classification head "
        '(name one in the config\'s "architectures")'
    )


def _max_positions(config) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _sequence_length(
    spec: str, seq_len: int | None, input_shape: tuple[int, ...] | None, max_len: int | None
) -> int:
    if input_shape is not None:
        if len(input_shape) != 1:
            raise WorkloadError(
                f"model {spec!r} takes token sequences: use --seq-len N, not --input-shape {input_shape}"
            )
        if seq_len is not None and int(input_shape[0]) != seq_len:
            raise WorkloadError(
                f"model {spec!r}: --seq-len {seq_len} and --input-shape {tuple(input_shape)} disagree"
            )
        seq_len = int(input_shape[0])
    length = int(seq_len) if seq_len is not None else min(max_len or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    if length < 1 or (max_len is not None and length > max_len):
        raise WorkloadError(
            f"model {spec!r}: sequence length {length} is outside 1..{max_len} (use --seq-len {max_len})"
        )
    return length
