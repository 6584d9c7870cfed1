"""How each node of a plan is launched: its environment and its ``torchrun`` line, built from checked values.

Everything here ends up in text a user pastes into a shell or a scheduler sources (``batchplan show plan.json
--emit env --node NAME``), so every value is first matched against a strict pattern (``check_launch``) and
then quoted with ``shlex.quote``: a plan whose node name or device list holds ``; touch /tmp/x`` is refused,
and a script path with a space (``my jobs/train.py``) stays one word.

Static rendezvous (``--node-rank`` with a master address) keeps the plan's rank numbering: global rank =
ranks of the nodes before + local rank. ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number devices as NVML
does, so ``CUDA_VISIBLE_DEVICES`` names the devices the probe saw.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass

from planner.errors import ConfigError

#: torchrun's own default ``--master-port`` (torch.distributed.run), the plan's default
DEFAULT_MASTER_PORT = 29500
DEFAULT_PLAN_PATH = "plan.json"
DEFAULT_SCRIPT = "train.py"

#: a node name: a host label (letters, digits, '.', '_', '-'), as cluster configs and hostnames allow
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
#: a host for --master-addr: a host name or an IPv4/IPv6 address
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]")
#: one CUDA_VISIBLE_DEVICES entry: an index, a GPU UUID or a MIG instance (nvidia-smi -L forms)
VISIBLE_DEVICE = re.compile(r"\d{1,4}|GPU-[0-9A-Za-z-]{1,64}|MIG-[0-9A-Za-z/-]{1,96}")
#: longest script or plan path accepted (Linux PATH_MAX)
MAX_PATH_CHARS = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, kw_only=True)
class NodeLaunch:
    """What one node runs: ``torchrun`` with the plan's shape, under the plan's device list."""

    nnodes: int
    """nodes in the job (``--nnodes``)"""
    node_rank: int
    """this node's position (``--node-rank``), 0..nnodes-1"""
    nproc_per_node: int
    """ranks on this node (``--nproc-per-node``)"""
    master_addr: str
    """host of node rank 0 (``--master-addr``)"""
    master_port: int
    """rendezvous port on the master (``--master-port``)"""
    cuda_visible_devices: str
    """comma-separated device list, in local-rank order"""
    script: str
    """training script torchrun starts"""
    plan_path: str
    """the plan.json the script reads (``--plan``)"""

    def __post_init__(self) -> None:
        check_launch(self, "launch")

    def env(self) -> dict[str, str]:
        """The node's environment for a scheduler (``--emit env``; ``nodes[].env`` in plan.json)."""
        return {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": self.cuda_visible_devices,
            "NNODES": str(self.nnodes),
            "NODE_RANK": str(self.node_rank),
            "NPROC_PER_NODE": str(self.nproc_per_node),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def torchrun_argv(self) -> list[str]:
        """``torchrun`` and its arguments, one list item per word."""
        return [
            "torchrun",
            "--nnodes",
            str(self.nnodes),
            "--node-rank",
            str(self.node_rank),
            "--nproc-per-node",
            str(self.nproc_per_node),
            "--master-addr",
            self.master_addr,
            "--master-port",
            str(self.master_port),
            self.script,
            "--plan",
            self.plan_path,
        ]

    def torchrun_line(self) -> str:
        """The line to paste on the node: its device environment, then torchrun, every word quoted."""
        prefix = f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={_quoted(self.cuda_visible_devices)}"
        return f"{prefix} {' '.join(map(_quoted, self.torchrun_argv()))}"


#: ``shlex.quote``, remembered: a plan's nodes share most words of their lines (8,192 nodes, 16 words each)
_quoted = functools.lru_cache(maxsize=4096)(shlex.quote)


def export_lines(env: dict[str, str]) -> list[str]:
    """``export NAME=value`` lines a POSIX shell can source, every value quoted."""
    return [f"export {name}={shlex.quote(value)}" for name, value in env.items()]


def check_launch(launch: NodeLaunch, where: str) -> None:
    """Every field of ``launch`` is of a shape that is safe and meaningful on a command line.

    Raises:
        ConfigError: naming the field, the value and the allowed shape.
    """
    for name in ("nnodes", "nproc_per_node", "master_port", "node_rank"):
        value = getattr(launch, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {name} must be an integer, got {value!r}")
    if launch.nnodes < 1 or launch.nproc_per_node < 1:
        raise ConfigError(
            f"{where}: nnodes and nproc_per_node must be >= 1, got {launch.nnodes}, {launch.nproc_per_node}"
        )
    if not 0 <= launch.node_rank < launch.nnodes:
        raise ConfigError(f"{where}: node_rank {launch.node_rank} is not in 0..{launch.nnodes - 1}")
    if not 1 <= launch.master_port <= 65535:
        raise ConfigError(f"{where}: master_port {launch.master_port} is not a TCP port (1-65535)")
    check_host(launch.master_addr, f"{where}: master_addr")
    check_visible_devices(launch.cuda_visible_devices, f"{where}: cuda_visible_devices")
    for name in ("script", "plan_path"):
        check_path_word(getattr(launch, name), f"{where}: {name}")


def check_node_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
        raise ConfigError(
            f"{where} {name!r} is not a node name (letters, digits, '.', '_' and '-', starting with a letter or "
            "digit, at most 253 characters)"
        )
    return name


def check_host(host: object, where: str) -> str:
    if not isinstance(host, str) or not _is_host(host):
        raise ConfigError(f"{where} {host!r} is not a host name or IP address")
    return host


@functools.lru_cache(maxsize=1024)
def _is_host(host: str) -> bool:
    return HOST.fullmatch(host) is not None


def check_visible_devices(devices: object, where: str) -> list[str]:
    """A comma-separated list of device indices or UUIDs, without repeats; returns its entries."""
    if not isinstance(devices, str):
        raise ConfigError(f"{where} must be a string like '0,1', got {devices!r}")
    entries = devices.split(",")
    if _are_devices(devices):
        return entries
    for entry in entries:
        if not VISIBLE_DEVICE.fullmatch(entry):
            raise ConfigError(
                f"{where} {devices!r}: {entry!r} is not a device index or GPU/MIG UUID (expected e.g. '0,1')"
            )
    raise ConfigError(f"{where} {devices!r} names a device twice")


@functools.lru_cache(maxsize=1024)
def _are_devices(devices: str) -> bool:
    """What :func:`check_visible_devices` accepts, remembered (a plan's nodes mostly list the same devices)."""
    entries = devices.split(",")
    return all(VISIBLE_DEVICE.fullmatch(e) for e in entries) and len(set(entries)) == len(entries)


def check_path_word(path: object, where: str) -> str:
    """A file path for a command line: non-empty, no control characters, not taken for an option."""
    if isinstance(path, str) and _is_path_word(path):
        return path
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{where} must be a non-empty path, got {path!r}")
    if len(path) > MAX_PATH_CHARS:
        raise ConfigError(f"{where} is {len(path)} characters, over the limit of {MAX_PATH_CHARS}")
    if _CONTROL.search(path):
        raise ConfigError(f"{where} {path!r} holds a control character")
    if path.startswith("-"):
        raise ConfigError(f"{where} {path!r} starts with '-' and would be read as an option (use ./{path})")
    return path


@functools.lru_cache(maxsize=256)
def _is_path_word(path: str) -> bool:
    """What :func:`check_path_word` accepts, remembered (every node of a plan names the same script and plan)."""
    return (
        bool(path.strip())
        and len(path) <= MAX_PATH_CHARS
        and not _CONTROL.search(path)
        and not path.startswith("-")
    )
