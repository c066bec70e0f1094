"""Devices (``cpu``, ``cuda``, ``opencl``, :class:`Device`) and how arrays cross to the native side:
``as_numpy`` (numpy arrays, DLPack and ``__array_interface__`` objects) and the
``(bytes, dtype, shape)`` triples.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from .. import _native


_DEVICE_NAMES = {1: "cpu", 2: "cuda", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm", 15: "webgpu"}


class Device:
    """A device as TVM names it: ``(device_type, device_id)`` with DLPack's device types
    (1 CPU, 2 CUDA, 4 OpenCL)."""

    __slots__ = ("device_type", "device_id")

    def __init__(self, device_type: int, device_id: int = 0) -> None:
        self.device_type = int(device_type)
        self.device_id = int(device_id)

    def __repr__(self) -> str:
        name = _DEVICE_NAMES.get(self.device_type, f"device_type={self.device_type}")
        return f"mblob.Device({name}, {self.device_id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and (self.device_type, self.device_id) == (other.device_type, other.device_id)

    def __hash__(self) -> int:
        return hash((self.device_type, self.device_id))

    def _pair(self) -> Tuple[int, int]:
        return (self.device_type, self.device_id)


def cpu(dev_id: int = 0) -> Device:
    """The CPU, as ``tvm.cpu(dev_id)``."""
    return Device(1, dev_id)


def cuda(dev_id: int = 0) -> Device:
    """An NVIDIA GPU, as ``tvm.cuda(dev_id)``."""
    return Device(2, dev_id)


def opencl(dev_id: int = 0) -> Device:
    """An OpenCL device, as ``tvm.opencl(dev_id)`` (GPUs first, then other devices, in the
    order of the OpenCL platforms)."""
    return Device(4, dev_id)


def _device_pair(dev: Any, call: str) -> Tuple[int, int]:
    """``(device_type, device_id)`` of an :class:`mblob.Device`, a TVM 0.19 device (``device_type``
    and ``device_id``), a TVM 0.22+ / tvm-ffi device (``dlpack_device_type()`` and ``index``) or
    a ``(device_type, device_id)`` pair."""
    if isinstance(dev, Device):
        return dev._pair()
    try:
        if hasattr(dev, "device_type") and hasattr(dev, "device_id"):
            # TVM's RPC sessions add multiples of 128 to the type; a local device has none.
            return int(dev.device_type) % 128, int(dev.device_id)
        if callable(getattr(dev, "dlpack_device_type", None)) and hasattr(dev, "index"):
            return int(dev.dlpack_device_type()), int(dev.index)
        if isinstance(dev, tuple) and len(dev) == 2:
            return int(dev[0]), int(dev[1])
    except (TypeError, ValueError):
        pass
    raise _native.InputError(
        f"{call}: {type(dev).__name__} is not a device (pass mblob.cpu(), tvm.cpu() or a "
        "(device_type, device_id) pair)"
    )


def _device_list(device: Any, call: str) -> List[Tuple[int, int]]:
    """One device or a list of them (default: CPU 0), as pairs."""
    if device is None:
        return [cpu()._pair()]
    if isinstance(device, (list, tuple)) and not (
        len(device) == 2 and all(isinstance(x, int) for x in device)
    ):
        if not device:
            raise _native.InputError(f"{call}: the device list is empty")
        return [_device_pair(d, call) for d in device]
    return [_device_pair(device, call)]


_DLPACK_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm"}


def as_numpy(value: Any, what: str = "array") -> np.ndarray:
    """A numpy view of ``value`` where one can be had without copying: a numpy array as it is,
    any DLPack-capable host array (TVM's ``tvm.nd.array`` / ``tvm.runtime.tensor``, torch CPU
    tensors, numpy, anything with ``__dlpack__`` and ``__dlpack_device__``) through
    ``numpy.from_dlpack`` (zero-copy); other objects (lists, scalars) through
    ``numpy.asarray``. Tensors on a device (CUDA, OpenCL, ...) are refused with
    :class:`mblob.InputError`: copy them to the host first (``.cpu()``, ``.numpy()``).

    The executors still copy the values into their own memory (as TVM's ``set_input`` does)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        try:
            dev_type, dev_id = value.__dlpack_device__()
        except Exception as e:  # noqa: BLE001 (any failure of a foreign object)
            raise _native.InputError(f"{what}: __dlpack_device__() failed: {e}") from e
        if int(dev_type) not in (1, 3):
            name = _DLPACK_DEVICE_NAMES.get(int(dev_type), f"device type {int(dev_type)}")
            raise _native.InputError(
                f"{what}: a tensor on {name}:{int(dev_id)} is not supported; mblob takes host arrays "
                "(copy it to the CPU first, e.g. .cpu() or .numpy())"
            )
        try:
            return np.from_dlpack(value)
        except Exception as e:  # noqa: BLE001
            raise _native.InputError(f"{what}: numpy.from_dlpack could not read it: {e}") from e
    if hasattr(value, "numpy") and callable(value.numpy) and not isinstance(value, np.generic):
        return np.asarray(value.numpy())
    a = np.asarray(value)
    if a.dtype == object:
        raise _native.InputError(f"{what}: a {type(value).__name__} is not an array")
    return a


def _dtype_name(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else str(dtype)


def _to_triple(array: Any, what: str = "array") -> Tuple[bytes, str, List[int]]:
    # Not np.ascontiguousarray: it makes a 0-d array 1-d.
    a = as_numpy(array, what)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    return a.tobytes(), _dtype_name(a.dtype), list(a.shape)


def _tensor_arg(array: Any, what: str = "array") -> Any:
    """An array as the native side takes it: a native ``Tensor`` as it is (passed by reference,
    uncopied), anything else as a C-contiguous numpy array (:func:`as_numpy`), which the native
    side copies into its own memory."""
    if isinstance(array, _native.Tensor):
        return array
    # Not np.ascontiguousarray: it makes a 0-d array 1-d.
    a = as_numpy(array, what)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _from_triple(t: Tuple[bytes, str, Sequence[int]]) -> np.ndarray:
    data, dtype, shape = t
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape)).copy()
