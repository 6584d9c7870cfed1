"""User models: ``package.module:factory``, a function of no arguments returning an ``nn.Module`` (trained on
the input the user describes, loss ``output.float().pow(2).mean()``) or a whole ``Workload``.

The factory is called outside fake mode (on the meta device, else on the CPU; see
:mod:`torchkit.workloads.construct`), once, to find out which of the two it returns; that build is the
template the estimator copies.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchkit.errors import WorkloadError
from torchkit.workloads.inputs import USER_INPUT_LOSS, input_spec, output_loss


def user_workload(
    spec: str,
    *,
    input_shape: tuple[int, ...] | None,
    seq_len: int | None,
    vocab_size: int | None,
    input_dtype: str | None,
):
    """The workload of ``package.module:factory`` with the input the flags describe.

    One per factory and input in a process: a plan asks for the workload in several stages (the profile key,
    each GPU type's estimate, the gradient layout), and each new workload would call the factory again (six
    times for a three-type plan), repeating whatever the factory does besides building.
    """
    return _workload_of(_import_factory(spec), spec, input_shape, seq_len, vocab_size, input_dtype)


@functools.lru_cache(maxsize=4)
def _workload_of(
    factory: Callable[[], Any],
    spec: str,
    input_shape: tuple[int, ...] | None,
    seq_len: int | None,
    vocab_size: int | None,
    input_dtype: str | None,
):
    from torchkit.workloads.construct import template_for
    from torchkit.workloads.workload import Workload, check_model

    def call() -> Any:
        return _call_factory(factory, spec)

    probe, _ = template_for(call)
    if isinstance(probe, Workload):
        return probe
    inputs = input_spec(
        input_shape=input_shape, seq_len=seq_len, vocab_size=vocab_size, input_dtype=input_dtype, model=spec
    )
    workload = Workload(
        name=spec,
        sample_shape=inputs.shape,
        build_model=call,
        make_batch=lambda b: (inputs.make(b), None),
        loss_fn=output_loss,
        config=inputs.config(),
        description=f"user model {spec}, input {inputs.describe()}, loss {USER_INPUT_LOSS}",
    )
    check_model(probe, workload, inputs=inputs)
    return workload


def _import_factory(spec: str) -> Callable[[], Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise WorkloadError(f"model {spec!r} is not package.module:factory (e.g. mypkg.models:build_net)")
    try:
        with _exit_refused():
            module = importlib.import_module(module_name)
    except _ExitCalled as e:
        raise WorkloadError(
            f"importing {module_name!r} for model {spec!r} called os._exit({e.code!r}) (a module imported for its "
            "factory must not exit; guard its script part with if __name__ == '__main__':)"
        ) from None
    except SystemExit as e:  # sys.exit() in the user's module must not end batchplan with the user's code
        raise WorkloadError(
            f"importing {module_name!r} for model {spec!r} called sys.exit({e.code!r}) (a module imported for its "
            "factory must not exit; guard its script part with if __name__ == '__main__':)"
        ) from None
    except Exception as e:  # any import failure is the user's module, report it with its cause
        raise WorkloadError(
            f"cannot import {module_name!r} for model {spec!r}: {type(e).__name__}: {e} "
            "(check the module is on PYTHONPATH / installed)"
        ) from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise WorkloadError(
            f"{module_name!r} has no callable {attr!r} (model {spec!r}; name a function returning an nn.Module)"
        )
    return factory


def _call_factory(factory: Callable[[], Any], spec: str) -> Any:
    from torchkit.workloads.workload import Workload

    try:
        with _exit_refused():
            model = factory()
    except WorkloadError:
        raise
    except _ExitCalled as e:
        raise WorkloadError(
            f"factory {spec!r} called os._exit({e.code!r}) (it must return the model, not end the process)"
        ) from None
    except SystemExit as e:  # contained: the exit code is the user's, not batchplan's
        raise WorkloadError(
            f"factory {spec!r} called sys.exit({e.code!r}) (it must return the model, not exit)"
        ) from None
    except Exception as e:
        raise WorkloadError(
            f"factory {spec!r} failed: {type(e).__name__}: {e} (it must build the model with no arguments)"
        ) from e
    if not isinstance(model, Workload | torch.nn.Module):
        raise WorkloadError(
            f"factory {spec!r} returned {type(model).__name__}, not an nn.Module or a Workload"
        )
    return model


class _ExitCalled(BaseException):
    """``os._exit`` called by user code while batchplan runs it: a BaseException, so that the user's own
    ``except Exception`` does not swallow it."""

    def __init__(self, code: object) -> None:
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _exit_refused() -> Iterator[None]:
    """While user code runs in this thread, ``os._exit`` raises instead of ending the process (a factory that
    called ``os._exit(0)`` ended batchplan with exit code 0 and no plan; other threads keep the real one), and
    the working directory it leaves is put back afterwards (a factory's ``os.chdir`` moved every relative path
    of the run: its ``-o``, ``--plot``, cache)."""
    real_exit = os._exit
    caller = threading.get_ident()
    try:
        start_dir = os.getcwd()
    except OSError:  # the working directory was removed: nothing to put back
        start_dir = None

    def refused(code: int) -> None:
        if threading.get_ident() != caller:
            real_exit(code)
        raise _ExitCalled(code)

    os._exit = refused  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real_exit
        if start_dir is not None:
            with contextlib.suppress(OSError):
                if os.getcwd() != start_dir:
                    os.chdir(start_dir)
