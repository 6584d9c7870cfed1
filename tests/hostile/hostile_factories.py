"""Model factories that misbehave, for ``tests/hostile/test_hostile_factories.py`` (issue #34, item 6): each
builds a small convnet (or fails to) after doing one thing a factory should not."""

from __future__ import annotations

import os
import threading
import time

import torch

#: where ``counted`` records each call (set by the test)
COUNT_FILE_VAR = "BATCHPLAN_TEST_FACTORY_COUNT"


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 2)
    )


def moves_the_working_directory() -> torch.nn.Module:
    os.chdir(os.environ["BATCHPLAN_TEST_ELSEWHERE"])
    return _net()


def leaves_a_thread_running() -> torch.nn.Module:
    threading.Thread(target=time.sleep, args=(3600,), name="factory-thread").start()  # not a daemon
    return _net()


def raises_keyboard_interrupt() -> torch.nn.Module:
    raise KeyboardInterrupt("from the factory")


def exits_with_os_exit() -> torch.nn.Module:
    os._exit(0)


def raises_with_escapes() -> torch.nn.Module:
    raise ValueError("\x1b[2J\x1b]0;owned\x07boom\nerror: a forged line \u202egnp.exe")


def counted() -> torch.nn.Module:
    with open(os.environ[COUNT_FILE_VAR], "a") as handle:
        handle.write("x")
    return _net()
