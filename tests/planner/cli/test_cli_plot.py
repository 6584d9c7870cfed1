"""Pictures a person reads at a glance (issue #15, item 8): one bar per rank labelled node and GPU, the
numbers on the bars, legends outside the bars, model and cluster in the title; the profile's curve names the
model. Checked on the figure matplotlib builds (its texts and where its legends sit), then the PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.driver import DriverOptions, plan_without_ray
from planner.job import JobSpec
from planner.plan.types import Plan
from tests.planner.cli_helpers import DEMO_MIXED, TINY_MODEL, assert_ok, is_png, run_cli

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from planner.cli.plot import MAX_RANK_BARS, plan_figure  # noqa: E402 (after the Agg backend is chosen)


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    from planner.profiles.cache import ProfileCache

    job = JobSpec(model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32), global_batch=768)
    cache = ProfileCache(tmp_path_factory.mktemp("cache"))
    return plan_without_ray(job, load_cluster(DEMO_MIXED), options=DriverOptions(cache=cache)).plan


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_one_labelled_bar_per_rank_with_its_numbers(plan: Plan) -> None:
    import matplotlib.pyplot as plt

    fig = plan_figure(plan)
    try:
        ax_batch, ax_mem, ax_time = fig.axes[:3]
        labels = [t.get_text() for t in ax_batch.get_yticklabels()]
        assert labels == [f"r{r.rank}  {r.node} · {r.gpu} #{r.device_index}" for r in plan.ranks]
        assert labels[0] == "r0  node-a100 · A100-SXM4-80GB #0" and labels[-1] == "r5  node-t4 · T4 #1"
        assert _texts(ax_batch) == [f" {r.batch} of {r.max_batch}" for r in plan.ranks]
        assert len(_texts(ax_mem)) == len(_texts(ax_time)) == len(plan.ranks)
        assert all(t.endswith(" GiB") for t in _texts(ax_mem))
        assert all(" ms, idle " in t for t in _texts(ax_time))
    finally:
        plt.close(fig)


def test_title_names_model_and_cluster_and_legends_sit_outside_the_bars(plan: Plan) -> None:
    import matplotlib.pyplot as plt

    fig = plan_figure(plan)
    try:
        fig.canvas.draw()
        title = fig._suptitle.get_text()
        assert title.startswith(
            "tests.planner.tiny_models:convnet on demo-mixed (balanced): 6 ranks, global batch 768"
        )
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes[:3]:
            legend = ax.get_legend()
            assert legend is not None
            box, area = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert box.y0 >= area.y1 - 1, "the legend lies above the bars, not over them"
    finally:
        plt.close(fig)


def _sync_plan(tmp_path_factory) -> Plan:
    """A plan over 1 Gb/s between nodes: most of its step is exposed gradient synchronisation."""
    from planner.profiles.cache import ProfileCache
    from tests.planner.cli_helpers import CONFIGS

    job = JobSpec(model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32), global_batch=768)
    cache = ProfileCache(tmp_path_factory.mktemp("sync-cache"))
    cluster = load_cluster(CONFIGS / "demo-mixed-1g.yaml")
    return plan_without_ray(job, cluster, options=DriverOptions(cache=cache)).plan


def test_the_exposed_sync_is_drawn_and_named_where_the_step_line_includes_it(tmp_path_factory) -> None:
    """The dashed step line stands at the slowest compute plus the exposed sync: the sync is a bar of its own
    from the slowest compute to that line, and the legend gives both parts (it stood 39 ms past a 12 ms bar,
    unexplained)."""
    import matplotlib.pyplot as plt

    from planner.cli.output import format_ms

    synced = _sync_plan(tmp_path_factory)
    step_s = synced.predicted_step_time_s
    slowest_s = max(r.predicted_step_time_s for r in synced.ranks)
    sync_s = step_s - slowest_s
    assert sync_s > slowest_s  # the case of the issue: the sync is most of the step
    fig = plan_figure(synced)
    try:
        ax_time = fig.axes[2]
        _, labels = ax_time.get_legend_handles_labels()
        assert f"exposed sync {format_ms(sync_s)} ms (every rank waits)" in labels
        assert (
            f"step {format_ms(step_s)} ms = slowest compute {format_ms(slowest_s)} + sync {format_ms(sync_s)}"
            in labels
        )
        sync_bars = [p for p in ax_time.patches if p.get_hatch() == "//"]
        assert len(sync_bars) == len(synced.ranks)
        for bar in sync_bars:  # from the slowest compute to the step line, on every row
            assert bar.get_x() * 1e-3 == pytest.approx(slowest_s)
            assert (bar.get_x() + bar.get_width()) * 1e-3 == pytest.approx(step_s)
        assert "exposed sync" in ax_time.get_title()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend, area = ax_time.get_legend().get_window_extent(renderer), ax_time.get_window_extent(renderer)
        title = ax_time.title.get_window_extent(renderer)
        assert area.y1 - 1 <= legend.y0 and legend.y1 <= title.y0 + 1, "legend between the bars and the title"
    finally:
        plt.close(fig)


def test_a_plan_without_sync_draws_no_sync_bar(plan: Plan) -> None:
    import matplotlib.pyplot as plt

    one = plan.replace(predicted_step_time_s=max(r.predicted_step_time_s for r in plan.ranks))
    fig = plan_figure(one)
    try:
        _, labels = fig.axes[2].get_legend_handles_labels()
        assert not any("sync" in label for label in labels)
        assert not [p for p in fig.axes[2].patches if p.get_hatch() == "//"]
    finally:
        plt.close(fig)


def test_a_large_cluster_gets_one_bar_per_gpu_type() -> None:
    import matplotlib.pyplot as plt

    from planner.plan.build import build_plan
    from tests.planner.plan.test_plan import PROFILES, slot

    keys = ("k-a100", "k-v100", "k-t4")
    slots = [slot(f"n{i // 8}", i % 8, keys[(i // 8) % 3], 9) for i in range(8 * (MAX_RANK_BARS // 8 + 3))]
    fig = plan_figure(build_plan(JobSpec(model="m"), slots, PROFILES))
    try:
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert len(labels) == 3
        assert labels[0].startswith("A100-SXM4-80GB ×") and "nodes (slowest shown)" in labels[0]
    finally:
        plt.close(fig)


@pytest.mark.slow
def test_plot_files_are_written_and_the_profile_title_names_the_model(tmp_path: Path) -> None:
    picture = tmp_path / "plan.png"
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        DEMO_MIXED,
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        "--no-write",
        "--plot",
        picture,
        cwd=tmp_path,
    )
    assert_ok(result)
    assert is_png(picture)

    from matplotlib.figure import Figure

    titles: list[str] = []
    original = Figure.savefig

    def spy(self, *args, **kwargs):  # the title of the figure being saved, then the real save
        titles.extend(ax.get_title() for ax in self.axes)
        return original(self, *args, **kwargs)

    from planner.cli.plot import plot_profile
    from planner.profiles.profile import DeviceProfile

    profile = DeviceProfile.from_points(
        gpu="T4",
        method="estimate",
        amp="fp16",
        memory_points=[(1, 2**30), (8, 2 * 2**30), (32, 5 * 2**30)],
        time_points=[(1, 0.01), (8, 0.02), (32, 0.05)],
    )
    Figure.savefig = spy
    try:
        plot_profile(
            profile,
            budget_bytes=9 * 2**30,
            total_bytes=15 * 2**30,
            chosen_batch=30,
            path=str(tmp_path / "curve.png"),
            model="resnet50",
        )
    finally:
        Figure.savefig = original
    assert titles == ["resnet50 on T4: memory per step (fp16, estimated)"]
    assert is_png(tmp_path / "curve.png")
