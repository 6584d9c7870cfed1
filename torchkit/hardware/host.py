"""The host this process runs on, as people read it: a CPU name (``Intel Core i7-8700K 3.70GHz``,
``Apple M2``) for device banners and ``batchplan devices``. No torch."""

from __future__ import annotations

import functools
import platform
import re
import subprocess

__all__ = ["get_cpu_info"]


def _clean_cpu_name(raw: str) -> str:
    name = re.sub(r"\s+", " ", raw).strip()
    name = re.sub(r"\((?:TM|R)\)", "", name, flags=re.IGNORECASE).strip()
    name = re.sub(r"\s+", " ", name)
    # "Intel Core i7-8700K CPU @ 3.70GHz" -> "Intel Core i7-8700K 3.70GHz"
    match = re.search(r"(Intel.*?i\d[\w-]*) CPU @ ([\d.]+\s*GHz)", name, flags=re.IGNORECASE)
    if match:
        return f"{match.group(1)} {match.group(2)}"
    return name


def _raw_cpu_name() -> str:
    system = platform.system()
    try:
        if system == "Darwin":
            result = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            if result.stdout.strip():
                return result.stdout.strip()
        elif system == "Linux":
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
                for line in cpuinfo:
                    key, _, value = line.partition(":")
                    if key.strip().lower() == "model name" and value.strip():
                        return value.strip()
        elif system == "Windows":
            import winreg  # type: ignore[import-not-found]

            with winreg.OpenKey(
                winreg.HKEY_LOCAL_MACHINE, r"HARDWARE\DESCRIPTION\System\CentralProcessor\0"
            ) as key:
                return str(winreg.QueryValueEx(key, "ProcessorNameString")[0])
    except (OSError, subprocess.SubprocessError):
        pass  # fall back to what platform knows
    return platform.processor() or platform.machine() or ""


@functools.lru_cache
def get_cpu_info() -> str:
    """A readable CPU name, e.g. ``Intel Core i7-8700K 3.70GHz`` or ``Apple M2``; ``Unknown CPU`` if none."""
    raw = _raw_cpu_name()
    return _clean_cpu_name(raw) if raw else "Unknown CPU"
