"""torchkit.step.budget: the one budget rule (fraction × available memory), in real and whole bytes, and the seed's
surface (torchkit.seed_api.batch_choice) handing out the same objects."""

from __future__ import annotations

import torchkit.seed_api.batch_choice as batch_choice
from torchkit.step.budget import DEFAULT_FRACTION, memory_budget_bytes, memory_target_bytes


def test_the_default_fraction_is_the_seeds():
    assert DEFAULT_FRACTION == 0.60


def test_the_budget_is_the_fraction_of_available_memory_rounded_down_in_bytes():
    assert memory_target_bytes(0.6, 1001) == 0.6 * 1001
    assert memory_budget_bytes(0.6, 1001) == 600
    assert memory_budget_bytes(1.0, 16 * 2**30) == 16 * 2**30


def test_the_seed_surface_re_exports_the_engine_rule():
    assert batch_choice.DEFAULT_FRACTION is DEFAULT_FRACTION
    assert batch_choice.memory_budget_bytes is memory_budget_bytes
    assert batch_choice.memory_target_bytes is memory_target_bytes
