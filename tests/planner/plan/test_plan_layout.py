"""planner.plan.layout and planner.plan.rank_view: plan.json written one line per rank with an index beside it,
one rank reading only its part, and every file the index does not match read whole and validated as ``show``
does."""

from __future__ import annotations

import json

import pytest

from planner.codec import encode
from planner.errors import ConfigError
from planner.job import JobSpec
from planner.plan import rank_view as rank_view_module
from planner.plan.build import build_plan
from planner.plan.io import load_plan, write_plan
from planner.plan.layout import index_path, plan_parts
from planner.plan.rank_view import rank_view, read_rank_view
from tests.planner.plan.test_plan import PROFILES, SLOTS
from tests.plans import make_plan

MULTI_NODE = make_plan(batches=(4, 4, 4, 6, 2), nodes=(("a", 3), ("b", 2)))


@pytest.fixture
def written(tmp_path):
    """A real plan of three nodes (A100, T4, V100), written by the writer."""
    plan = build_plan(JobSpec(model="m"), SLOTS, PROFILES)
    return write_plan(plan, tmp_path / "plan.json"), plan


@pytest.fixture
def whole_reads(monkeypatch) -> list[str]:
    """Records every time a rank falls back to reading the plan whole."""
    calls: list[str] = []
    real = rank_view_module._whole

    def spy(raw, where, choose):
        calls.append(where)
        return real(raw, where, choose)

    monkeypatch.setattr(rank_view_module, "_whole", spy)
    return calls


def _choose(rank):
    return lambda world_size, nodes: rank


def _parts(path):
    return plan_parts(path.read_bytes(), index_path(path).read_bytes(), str(path))


def test_the_file_has_one_line_per_rank_and_node_and_its_index_beside_it(written):
    path, plan = written
    lines = path.read_text().splitlines()
    assert len([line for line in lines if line.startswith('    {"rank": ')]) == plan.world_size
    assert len([line for line in lines if line.startswith('    {"name": ')]) == len(plan.nodes)
    assert json.loads(path.read_text()) == encode(plan)  # the same document, laid out otherwise
    index = json.loads(index_path(path).read_text())
    assert index["batches"] == [r.batch for r in plan.ranks] and index["plan_bytes"] == path.stat().st_size
    assert encode(load_plan(path)) == encode(plan)


def test_every_rank_reads_its_part_without_reading_the_whole_plan(written, whole_reads):
    path, plan = written
    for rank in range(plan.world_size):
        assert read_rank_view(path, _choose(rank)) == rank_view(plan, rank)
    assert whole_reads == []


def test_a_rank_on_a_later_node_gets_its_node(tmp_path, whole_reads):
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")
    view = read_rank_view(path, _choose(4))
    assert (view.node.name, view.node.node_rank, view.entry.local_rank, view.batches) == (
        "b",
        1,
        1,
        (4, 4, 4, 6, 2),
    )
    assert view.num_nodes == 2 and whole_reads == []


def _edit_bytes(path, old: bytes, new: bytes) -> None:
    raw = path.read_bytes()
    assert raw.count(old) >= 1, old
    path.write_bytes(raw.replace(old, new, 1))


def test_a_file_edited_after_writing_is_read_whole_and_refused_as_show_refuses_it(tmp_path, whole_reads):
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")
    _edit_bytes(path, b'"batch": 6', b'"batch": 7')  # rank 3's batch, in place: offsets unchanged, digest not
    with pytest.raises(ConfigError) as by_rank:
        read_rank_view(path, _choose(0))  # rank 0's own entry is untouched: the digest still catches the edit
    with pytest.raises(ConfigError) as by_show:
        load_plan(path)
    assert str(by_rank.value) == str(by_show.value)
    assert "step_batch" in str(by_rank.value)
    assert whole_reads == [str(path)]


def test_a_file_reformatted_by_a_tool_is_read_whole_and_accepted(tmp_path, whole_reads):
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")
    path.write_text(json.dumps(json.loads(path.read_text()), indent=4))  # the same plan; the index is stale
    assert read_rank_view(path, _choose(3)).entry.batch == 6
    assert whole_reads == [str(path)]


def test_a_plan_copied_without_its_index_is_read_whole(tmp_path, whole_reads):
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")
    index_path(path).unlink()
    assert read_rank_view(path, _choose(3)).entry.batch == 6
    assert whole_reads == [str(path)]


@pytest.mark.parametrize(
    "damage", ["plan cut short", "index cut short", "index schema", "spans out of order"]
)
def test_a_damaged_index_is_never_trusted(tmp_path, whole_reads, damage):
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")
    index = index_path(path)
    if damage == "plan cut short":
        path.write_bytes(path.read_bytes()[:-40])
    elif damage == "index cut short":
        index.write_bytes(index.read_bytes()[:-10] + b"\n")
    elif damage == "index schema":
        _edit_bytes(index, b"batchplan/rank-index@1", b"batchplan/rank-index@9")
    else:
        _edit_bytes(index, b'"ranks":[', b'"ranks":[9999999,1,')
    assert _parts(path) is None
    if damage == "plan cut short":
        with pytest.raises(ConfigError, match="not valid JSON"):
            read_rank_view(path, _choose(0))
    else:
        assert read_rank_view(path, _choose(3)).entry.batch == 6  # the plan itself is intact: read whole
    assert whole_reads == [str(path)]


def _forge_index(path, edit) -> None:
    """Rewrite the plan's index with ``edit`` applied and a digest recomputed to match (what only a deliberate
    forger does)."""
    from planner.plan.layout import _digest

    index = {k: v for k, v in json.loads(index_path(path).read_text()).items() if k != "sha256"}
    edit(index)
    fields = json.dumps(index, separators=(",", ":"))
    digest = _digest(path.read_bytes(), fields.encode())
    index_path(path).write_text(f'{{"sha256":"{digest}",{fields[1:]}\n')


def test_an_index_edited_without_its_digest_is_not_trusted(tmp_path, whole_reads):
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")
    _edit_bytes(index_path(path), b'"batches":[4,4,4,6,2]', b'"batches":[5,3,4,6,2]')
    assert _parts(path) is None
    assert read_rank_view(path, _choose(2)).batches == (4, 4, 4, 6, 2)
    assert whole_reads == [str(path)]


def test_an_index_forged_with_a_matching_digest_cannot_give_a_rank_another_split(tmp_path, whole_reads):
    """Rank 2's own entry agrees with a forged index that moves a sample from rank 1 to rank 0; the entries'
    bytes do not, so no rank takes the forged split."""
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")
    _forge_index(path, lambda index: index.update(batches=[5, 3, 4, 6, 2]))
    assert _parts(path) is None
    assert read_rank_view(path, _choose(2)).batches == (4, 4, 4, 6, 2)
    assert whole_reads == [str(path)]


def test_an_index_forged_to_cut_an_entry_short_is_caught_by_parsing_the_entry(tmp_path, whole_reads):
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")

    def cut_rank_0(index):
        index["ranks"][1] -= 1  # rank 0's entry without its closing brace

    _forge_index(path, cut_rank_0)
    assert _parts(path) is not None  # the index itself is well-formed
    assert read_rank_view(path, _choose(0)).entry.rank == 0
    assert whole_reads == [str(path)]


def test_a_refusal_by_the_launch_is_not_a_reason_to_read_the_whole_plan(tmp_path, whole_reads):
    path = write_plan(MULTI_NODE, tmp_path / "plan.json")

    def refuse(world_size, nodes):
        raise ConfigError(f"wanted 4 ranks, the plan has {world_size} on {[n.name for n in nodes()]}")

    with pytest.raises(ConfigError, match=r"the plan has 5 on \['a', 'b'\]"):
        read_rank_view(path, refuse)
    assert whole_reads == []


def test_a_plan_file_over_the_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.json"
    with path.open("wb") as handle:
        handle.truncate(200 << 20)
    with pytest.raises(ConfigError, match="over the limit"):
        read_rank_view(path, _choose(0))


def test_a_plan_whose_index_cannot_be_written_is_still_written_and_read_whole(tmp_path, whole_reads, caplog):
    """The index is a speed-up: a directory that refuses it (here: a directory already at its path) leaves the
    plan written, a warning said, and every rank reading the plan whole."""
    target = tmp_path / "plan.json"
    (tmp_path / "plan.json.index").mkdir()
    with caplog.at_level("WARNING", logger="planner.plan.io"):
        write_plan(MULTI_NODE, target)
    assert "rank index was not written" in caplog.text
    assert read_rank_view(target, _choose(3)).entry.batch == 6
    assert whole_reads == [str(target)]
