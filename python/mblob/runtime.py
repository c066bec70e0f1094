"""Load and run what TVM exported, without TVM: ``load_module``, graph and AOT models as
``tvm.contrib.graph_executor``, Relax models as ``tvm.relax.VirtualMachine``, host functions.

    import mblob, numpy as np
    m = mblob.load_module("graph.so")
    gmod = m["default"](mblob.cpu(0))
    gmod.set_input("x", np.ones((2, 64), "float32"))
    gmod.run()
    y = gmod.get_output(0)                      # numpy.ndarray

    vm = mblob.VirtualMachine(mblob.load_module("relax.so"), mblob.cpu())
    y = vm["main"](x)

Tensors are numpy arrays; they are copied into the executors' memory on the device and out
again. Devices: ``mblob.cpu(n)``, ``mblob.opencl(n)`` and ``mblob.cuda(n)``; a model built for
OpenCL or CUDA runs on a device of that kind (``m["default"](mblob.opencl(0))``,
``mblob.VirtualMachine(mod, mblob.cuda(0))``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native

__all__ = [
    "Device",
    "cpu",
    "cuda",
    "opencl",
    "load_module",
    "Module",
    "GraphModule",
    "VirtualMachine",
    "PackedFunction",
    "RelayVirtualMachine",
    "relay_vm",
]


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


def _dtype_name(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else str(dtype)


def _to_triple(array: Any) -> Tuple[bytes, str, List[int]]:
    # Not np.ascontiguousarray: it makes a 0-d array 1-d.
    a = np.asarray(array)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    return a.tobytes(), _dtype_name(a.dtype), list(a.shape)


def _from_triple(t: Tuple[bytes, str, Sequence[int]]) -> np.ndarray:
    data, dtype, shape = t
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape)).copy()


class PackedFunction:
    """A host function of a loaded library, called as TVM calls it. Arguments: numpy arrays
    (passed as tensors; what the function writes into them is copied back), ints, floats,
    strings and None. Returns the function's int, float or string result, or None."""

    def __init__(self, library: "_native.Library", name: str) -> None:
        self._library = library
        self.name = name

    def __call__(self, *args: Any) -> Any:
        arrays = []
        packed: List[Any] = []
        for a in args:
            if isinstance(a, np.ndarray):
                data, dtype, shape = _to_triple(a)
                buf = bytearray(data)
                arrays.append((a, buf, dtype, shape))
                packed.append((buf, dtype, shape))
            elif isinstance(a, np.generic):
                packed.append(a.item())
            else:
                packed.append(a)
        result = self._library.call(self.name, packed)
        for a, buf, dtype, shape in arrays:
            if a.flags.writeable:
                a[...] = np.frombuffer(bytes(buf), dtype=np.dtype(dtype)).reshape(tuple(shape))
        return result

    def __repr__(self) -> str:
        return f"mblob.PackedFunction({self.name!r})"


class GraphModule:
    """A graph (or AOT) executor, as ``tvm.contrib.graph_executor.GraphModule``."""

    def __init__(self, executor: "_native.GraphExecutor") -> None:
        self._e = executor

    def set_input(self, key: Union[str, int, None] = None, value: Any = None, **params: Any) -> None:
        """Sets input ``key`` (a name; an int picks the input by position) to an array;
        keyword arguments set several inputs."""
        if key is not None:
            if isinstance(key, int):
                key = self._e.inputs()[key][0]
            self._e.set_input(key, *_to_triple(value))
        for k, v in params.items():
            self._e.set_input(k, *_to_triple(v))

    def run(self, **inputs: Any) -> None:
        """Runs the model (after setting any inputs given as keywords)."""
        if inputs:
            self.set_input(**inputs)
        self._e.run()

    def get_output(self, index: int) -> np.ndarray:
        """Output ``index`` as a new numpy array."""
        return _from_triple(self._e.get_output(index))

    def get_num_outputs(self) -> int:
        """The number of outputs."""
        return self._e.get_num_outputs()

    def get_num_inputs(self) -> int:
        """The number of inputs a caller sets (params excluded)."""
        return len(self._e.inputs())

    def get_input_info(self) -> List[Tuple[str, Tuple[int, ...], str]]:
        """``(name, shape, dtype)`` of each input a caller sets."""
        return [(n, tuple(s), d) for n, s, d in self._e.inputs()]


class Module:
    """A loaded module: the root of what :func:`load_module` read, or one of its imports."""

    def __init__(self, library: "_native.Library", index: int = 0) -> None:
        self._library = library
        self._index = index

    @property
    def type_key(self) -> str:
        """The module's type key (``GraphExecutorFactory``, ``library``, ``relax.VMExecutable``...)."""
        return self._library.type_keys()[self._index]

    @property
    def imported_modules(self) -> List["Module"]:
        """The modules this one imports."""
        return [Module(self._library, i) for i in self._library.imports(self._index)]

    def get_function(self, name: str) -> Callable[..., Any]:
        """``m[name]``: a graph/AOT factory's ``default`` (call it with devices to get a
        :class:`GraphModule`), or a host function (:class:`PackedFunction`)."""
        if self._library.has_factory(name):
            library = self._library

            def create(*devices: Device) -> GraphModule:
                devs = [d._pair() for d in devices] or [cpu()._pair()]
                return GraphModule(_native.GraphExecutor(library, devs))

            return create
        if self._library.has_function(name):
            return PackedFunction(self._library, name)
        raise _native.InputError(f"no function `{name}` in the module ({self.type_key}) or its imports")

    __getitem__ = get_function

    def __repr__(self) -> str:
        return f"mblob.Module({self.type_key!r})"


def load_module(path: Union[str, "os.PathLike[str]"]) -> Module:
    """Loads a library TVM (or mblob) exported, or a raw blob file, as ``tvm.runtime.load_module``.

    A shared library is opened with the system loader, which runs its initialisers: load only
    libraries you would run. Payload kinds mblob does not know are kept as opaque modules.
    """
    return Module(_native.load_library(os.fspath(path)))


class VirtualMachine:
    """A Relax VM, as ``tvm.relax.VirtualMachine(mod, device)``: ``vm["main"](*arrays)``."""

    def __init__(self, mod: Module, device: Optional[Device] = None) -> None:
        device = device or cpu()
        self._vm = _native.RelaxVm(mod._library, device._pair())

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name not in self._vm.functions():
            raise _native.InputError(f"no VM function `{name}` (functions: {', '.join(self._vm.functions())})")

        def call(*args: Any) -> Any:
            outs = [_from_triple(t) for t in self._vm.invoke(name, [_to_triple(a) for a in args])]
            return outs[0] if len(outs) == 1 else tuple(outs)

        return call


class RelayVirtualMachine:
    """A Relay VM, as ``tvm.runtime.vm.VirtualMachine(exe, device)`` for an executable of
    ``relay.vm.compile`` (TVM 0.8-0.19, type key ``VMExecutable``), exported with
    ``export_library``: ``vm.invoke("main", *arrays)``, ``vm.run(*arrays)`` or
    ``vm["main"](*arrays)``.

    Arguments are numpy arrays (or anything ``numpy.asarray`` takes), in parameter order; the
    result is one array, or a tuple of arrays for a function that returns a tuple (nested
    tuples flattened in order). The Relay VM runs on the CPU.
    """

    def __init__(self, mod: Module, device: Optional[Device] = None) -> None:
        device = device or cpu()
        self._vm = _native.RelayVm(mod._library, device._pair())

    def functions(self) -> List[Tuple[str, List[str]]]:
        """The VM functions: ``(name, parameter names)`` each."""
        return self._vm.functions()

    def invoke(self, func_name: str, *args: Any) -> Any:
        """Calls VM function ``func_name`` with ``args``."""
        outs = [_from_triple(t) for t in self._vm.invoke(func_name, [_to_triple(a) for a in args])]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, *args: Any) -> Any:
        """Calls ``main``."""
        return self.invoke("main", *args)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        names = [f[0] for f in self._vm.functions()]
        if name not in names:
            raise _native.InputError(f"no VM function `{name}` (functions: {', '.join(names)})")
        return lambda *args: self.invoke(name, *args)


def relay_vm(mod: Module, device: Optional[Device] = None) -> RelayVirtualMachine:
    """The Relay VM of a library exported from ``relay.vm.compile`` (see :class:`RelayVirtualMachine`)::

    vm = mblob.relay_vm(mblob.load_module("model.so"))
    y = vm.invoke("main", x)
    """
    return RelayVirtualMachine(mod, device)
