"""The suite's shared fixtures and rules. tests/README.md says how to use them; in short:

- **Cost markers.** Every marker registered in pyproject.toml (``slow``, ``dist``, ``ray``, ``slurm``, a
  library's name) says what a test costs. A test without one must stay under 2 s (CPU, or active time; see
  ``tests/cost_budget.py``): the run fails otherwise, naming the test, so a new slow test gets its marker.
- **xdist groups** (``python -m pytest`` runs on every core, ``-n`` in pyproject.toml, ``--dist loadgroup``):
  tests that start Ray or SLURM (``ray``, ``slurm``) share one worker, one at a time, as they would share one
  machine; the tests of a module that share a module- or class-scoped fixture (one gloo spawn checked by many
  tests) share one worker too, so that the fixture runs once.
- **Fixtures**: the environment restored after every test; ``ray_cluster``, the one local Ray cluster of a
  test run (per worker that asks for it); ``slurm``, a real SLURM cluster on 127.0.0.1; ``catalog``.
- **Helpers** (plain modules): ``tests.planner.cli_helpers.run_cli`` runs ``batchplan`` in this process;
  ``tests.gloo.run_ranks`` / ``GlooRanks`` start gloo ranks; ``tests.gloo.torchrun`` runs a script under
  torchrun; ``tests.net.free_port``.
- **Hypothesis**: no deadline (a loaded machine stretches an example's time, not its result), and the
  too-slow health check off for the same reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from planner.probing.session import WORKER_NICENESS, WORKER_NICENESS_VARIABLE
from tests import cli_in_process
from tests.cost_budget import BUDGET_S, Cost, Snapshot

REPO_ROOT = Path(__file__).resolve().parents[1]

# Ray reads this once, at its first import: every raylet a test starts must stay on 127.0.0.1 (DESIGN.md)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# where fault-injection tests mark the Ray nodes whose probe should hang (tests/planner/tiny_models.py); set
# before the test cluster starts so that its raylets, and the probes they start, inherit it
FAULT_DIR = os.path.join(tempfile.gettempdir(), f"batchplan-test-faults-{os.getpid()}")
os.environ["BATCHPLAN_TEST_FAULT_DIR"] = FAULT_DIR

# before any test module builds its @settings: they inherit what they do not set
settings.register_profile("batchplan", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("batchplan")

#: markers that do not say what a test costs (pytest's own and plugins'): every other registered one does
_BOOKKEEPING_MARKERS = {
    "parametrize",
    "skip",
    "skipif",
    "xfail",
    "usefixtures",
    "filterwarnings",
    "timeout",
    "xdist_group",
    "tryfirst",
    "trylast",
    "no_cover",
}
#: the xdist group of every test that starts Ray or SLURM: one worker runs them, one after the other
DAEMONS_GROUP = "ray-slurm"


# ------------------------------------------------------------------------------------------------ environment


@pytest.fixture(autouse=True)
def _restore_environment():
    """Tests may set CUDA_VISIBLE_DEVICES, RANK, ...; put the environment back afterwards."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def catalog():
    """The shipped GPU catalog (``torchkit.hardware.catalog.load_catalog``)."""
    from torchkit.hardware.catalog import load_catalog

    return load_catalog()


# ------------------------------------------------------------------------------------------------ Ray


#: raylets of the shared test cluster: enough for the 3-node simulated configs to get one each
TEST_RAYLETS = 3


class _TestRay:
    """The suite's local Ray cluster and this process's driver connection to it (which the in-process CLI
    runs of ``tests/cli_in_process.py`` drop: ``batchplan`` must not find a connected Ray)."""

    def __init__(self) -> None:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        from ray.cluster_utils import Cluster

        # Ray puts its session (with unix sockets, at most 107 bytes a path) under RAY_TMPDIR or TMPDIR: a user's
        # long one would break it, and the test must not write there. A short one of its own, for its raylets only.
        self.temp_dir = tempfile.mkdtemp(prefix="bpr", dir="/tmp")
        common = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 80 * 2**20}
        saved = {
            name: os.environ.pop(name, None)
            for name in ("RAY_TMPDIR", "RAY_ADDRESS", "PYTHONPATH", WORKER_NICENESS_VARIABLE)
        }
        os.environ["RAY_TMPDIR"] = self.temp_dir
        # workers at the priority of the tests that wait for them, as batchplan's own Ray has them
        # (planner.probing.session.WORKER_NICENESS): Ray's default 15 starves them on a loaded machine
        os.environ[WORKER_NICENESS_VARIABLE] = WORKER_NICENESS
        # the probes build the tests' models (tests.planner.tiny_models): the repository on their path, as a user's
        # package is on theirs, whatever directory the tests run from
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), saved["PYTHONPATH"]) if p)
        try:
            self.cluster = Cluster(
                initialize_head=True, head_node_args={**common, "include_dashboard": False}
            )
            for _ in range(TEST_RAYLETS - 1):
                self.cluster.add_node(wait=False, **common)
            self.cluster.wait_for_nodes()
        finally:
            for name in ("RAY_TMPDIR", "PYTHONPATH", WORKER_NICENESS_VARIABLE):
                os.environ.pop(name)
            os.environ.update({k: v for k, v in saved.items() if v is not None})

    def connect(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(
                address=self.cluster.address,
                _node_ip_address="127.0.0.1",
                log_to_driver=False,
                logging_level="ERROR",
            )

    def disconnect(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    def stop(self) -> None:
        self.disconnect()
        self.cluster.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def _test_ray() -> Iterator[_TestRay]:
    os.makedirs(FAULT_DIR, exist_ok=True)
    ray = _TestRay()
    cli_in_process.ray_disconnect_hooks.append(ray.disconnect)
    try:
        yield ray
    finally:
        cli_in_process.ray_disconnect_hooks.remove(ray.disconnect)
        ray.stop()
        shutil.rmtree(FAULT_DIR, ignore_errors=True)


@pytest.fixture
def ray_cluster(_test_ray: _TestRay):
    """The one real local Ray cluster of the test run, this process connected to it as a driver:
    TEST_RAYLETS raylets, all on 127.0.0.1, dashboard off (``ray.cluster_utils.Cluster``).

    Ray rewrites 127.0.0.1 to the machine's own address unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set
    before it starts and every node is given node_ip_address=127.0.0.1 (DESIGN.md, Testing). Started once per
    process that asks for it (under xdist, the one worker that runs the ``ray`` group).
    """
    _test_ray.connect()
    return _test_ray.cluster


# ------------------------------------------------------------------------------------------------ SLURM


@pytest.fixture(scope="session")
def slurm():
    """A real SLURM cluster on 127.0.0.1 (``tests/planner/slurm_cluster.py``): munged, slurmctld and two slurmd,
    nodes ``gpu-a`` (2 × a100 GRES) and ``gpu-b`` (1 × t4) in partition ``gpus``. Skips without SLURM's
    binaries, except in CI. Give the CLI its ``env()``."""
    from tests.planner.slurm_cluster import SLURM_TEST_NODES, SlurmCluster

    cluster = SlurmCluster(SLURM_TEST_NODES)
    try:
        yield cluster
    finally:
        cluster.stop()


# ------------------------------------------------------------------------------------------------ markers, groups


def cost_markers(config: pytest.Config) -> set[str]:
    """The markers that say what a test costs: every one pyproject.toml registers."""
    names = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    return names - _BOOKKEEPING_MARKERS


def _scoped_fixture_user(item: pytest.Item) -> bool:
    """Whether the test uses a module-, class- or package-scoped fixture (set up once for the tests that share it)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs and defs[-1].scope in ("module", "class", "package") for defs in info.name2fixturedefs.values()
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    daemon_modules = {
        item.nodeid.split("::", 1)[0]
        for item in items
        if item.get_closest_marker("ray") or item.get_closest_marker("slurm")
    }
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        module = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("ray") or item.get_closest_marker("slurm"):
            group = DAEMONS_GROUP
        elif _scoped_fixture_user(item):
            group = DAEMONS_GROUP if module in daemon_modules else module
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


# ------------------------------------------------------------------------------------------------ cost budget


class _CostBudget:
    """Measures every test (setup, call, teardown) and, on the process that reports (xdist's controller, or
    the one process), fails the run when an unmarked one went over the budget (``tests/cost_budget.py``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.markers = cost_markers(config)
        self.over: list[tuple[str, str]] = []
        self.reporting = not hasattr(config, "workerinput")  # xdist's workers only measure

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        item.stash[_START] = Snapshot.now()
        item.stash[_CLEAN] = True
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if not report.passed:
            item.stash[_CLEAN] = False
        if call.when != "teardown" or _START not in item.stash:
            return
        unmarked = not any(item.get_closest_marker(name) for name in self.markers)
        if unmarked and item.stash[_CLEAN]:
            cost = Cost.between(item.stash[_START], Snapshot.now())
            report.user_properties.append(("cost", cost.to_json()))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown" or not self.reporting:
            return
        for name, value in report.user_properties:
            if name == "cost":
                reason = Cost(**value).over_budget(BUDGET_S)
                if reason:
                    self.over.append((report.nodeid, reason))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.over:
            return
        terminalreporter.section(
            f"tests over the {BUDGET_S:g} s budget without a cost marker", sep="=", red=True
        )
        for nodeid, reason in self.over:
            terminalreporter.line(f"{nodeid}: {reason}")
        terminalreporter.line(
            "mark each with what it costs (slow, dist, ray, slurm, a library): tests/README.md"
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.over and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


_START = pytest.StashKey[Snapshot]()
_CLEAN = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_CostBudget(config), "batchplan-cost-budget")


def pytest_collection_finish(session: pytest.Session) -> None:
    _check_groups_apply(session)
    _warm_up(session)


def _check_groups_apply(session: pytest.Session) -> None:
    """Say so when xdist did not apply the groups: pytest 9.2 keeps node ids where pytest-xdist 3.8 no longer
    writes them (pytest-dev/pytest-xdist#1386), and the tests that start Ray or SLURM would run side by side
    without a word. pyproject.toml keeps pytest below 9.2 for that reason."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]
    ]
    if lost:
        import warnings

        warnings.warn(
            pytest.PytestConfigWarning(
                f"--dist loadgroup did not group {len(lost)} tests (e.g. {lost[0]}): pytest {pytest.__version__} with "
                "this pytest-xdist ignores xdist_group (pytest-xdist#1386); tests that start Ray or SLURM may run side "
                "by side. pip install -e '.[test]' installs a pytest that works."
            ),
            stacklevel=1,
        )


def _warm_up(session: pytest.Session) -> None:
    """Pay this process's one-time costs before its first test: the first fake-tensor estimate in a process
    costs about 1.3 s of CPU more than the next (lazy imports and dispatch caches of torch's fake tensors). Left
    to the tests, whichever cheap test ran first on a worker would be charged for it by the budget."""
    markers = cost_markers(session.config)
    if not any(not any(item.get_closest_marker(m) for m in markers) for item in session.items):
        return  # nothing the budget checks (xdist's controller collects nothing)
    import torch

    from torchkit.estimate import estimate_step
    from torchkit.workloads import Workload

    estimate_step(
        Workload(
            name="warm-up",
            sample_shape=(8,),
            build_model=lambda: torch.nn.Linear(8, 2),
            make_batch=lambda b: (torch.randn(b, 8), None),
            loss_fn=lambda out, _: out.sum(),
        ),
        2,
    )
