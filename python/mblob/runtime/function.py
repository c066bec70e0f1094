"""Host functions of a loaded library (:class:`PackedFunction`) and the timing of
``time_evaluator``/``benchmark`` (:class:`BenchmarkResult`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Sequence

import numpy as np

from .. import _native
from .device import _tensor_arg


class PackedFunction:
    """A host function of a loaded library, called as TVM calls it. Arguments: numpy arrays
    (passed as tensors; what the function writes into them is copied back), mblob's native
    ``Tensor``s (passed by reference: the function writes into them), ints, floats, strings
    and None. Returns the function's int, float or string result, or None."""

    def __init__(self, library: "_native.Library", name: str) -> None:
        self._library = library
        self.name = name

    def __call__(self, *args: Any) -> Any:
        arrays = []
        packed: List[Any] = []
        for a in args:
            if isinstance(a, np.ndarray):
                # Copied into a native tensor (aligned memory the function may write), and
                # read back through DLPack (a view of it, no second copy) after the call.
                t = _native.Tensor.from_numpy(_tensor_arg(a))
                arrays.append((a, t))
                packed.append(t)
            elif isinstance(a, np.generic):
                packed.append(a.item())
            else:
                packed.append(a)
        result = self._library.call(self.name, packed)
        for a, t in arrays:
            if a.flags.writeable:
                a[...] = np.from_dlpack(t)
        return result

    def __repr__(self) -> str:
        return f"mblob.PackedFunction({self.name!r})"


class BenchmarkResult:
    """Timings, as TVM's ``tvm.runtime.module.BenchmarkResult``: ``results`` (each repeat's
    mean time per call, in seconds), ``mean``, ``median``, ``max``, ``min`` and ``std``
    (numpy's, over ``results``), in seconds."""

    def __init__(self, results: Sequence[float]) -> None:
        self.results = tuple(float(r) for r in results)
        a = np.array(self.results, dtype=np.float64)
        self.mean = float(a.mean())
        self.median = float(np.median(a))
        self.max = float(a.max())
        self.min = float(a.min())
        self.std = float(a.std())

    def __repr__(self) -> str:
        return (
            f"BenchmarkResult(min={self.min}, mean={self.mean}, median={self.median}, "
            f"max={self.max}, std={self.std}, results={self.results})"
        )

    def __str__(self) -> str:
        head = f"{'mean (ms)':^12} {'median (ms)':^12} {'max (ms)':^12} {'min (ms)':^12} {'std (ms)':^12}"
        ms = [self.mean, self.median, self.max, self.min, self.std]
        return "Execution time summary:\n" + head + "\n" + " ".join(f"{v * 1000:^12.4f}" for v in ms)


def _time(
    call: Callable[[], Any],
    call_name: str,
    number: int,
    repeat: int,
    min_repeat_ms: float,
    limit_zero_time_iterations: int = 100,
    cooldown_interval_ms: float = 0,
    repeats_to_cooldown: int = 1,
) -> BenchmarkResult:
    """TVM's ``time_evaluator`` loop on the host clock: one call to warm up, then ``repeat``
    measurements of ``number`` calls each (``number`` grows, as TVM's, until a measurement
    lasts ``min_repeat_ms``), a pause of ``cooldown_interval_ms`` every ``repeats_to_cooldown``
    measurements. Each result is a measurement's time divided by its number of calls."""
    for name, v in (("number", number), ("repeat", repeat)):
        if not isinstance(v, int) or v < 1:
            raise _native.InputError(f"{call_name}: {name} must be a positive int, not {v!r}")
    call()
    results = []
    for r in range(repeat):
        n = number
        zero = 0
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            elapsed = time.perf_counter() - t0
            if elapsed == 0:
                zero += 1
                if zero >= limit_zero_time_iterations:
                    break
            if elapsed * 1000 >= min_repeat_ms:
                break
            per_call_ms = max(elapsed * 1000 / n, 1e-6)
            n = max(int(min_repeat_ms / per_call_ms) + 1, int(n * 1.618))
        results.append(elapsed / n)
        if cooldown_interval_ms > 0 and repeats_to_cooldown > 0 and (r + 1) % repeats_to_cooldown == 0:
            time.sleep(cooldown_interval_ms / 1000)
    return BenchmarkResult(results)
