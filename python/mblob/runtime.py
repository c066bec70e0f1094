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

import json
import os
import time
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
    "BenchmarkResult",
    "as_numpy",
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


class GraphModule:
    """A graph (or AOT) executor, as ``tvm.contrib.graph_executor.GraphModule``.

    Inputs are numbered as TVM numbers them: every graph input (``arg_nodes``), the params
    included. Arrays in: numpy arrays or anything DLPack-capable on the host (``tvm.nd.array``,
    torch CPU tensors; see :func:`as_numpy`). Arrays out (``get_input``, ``get_output``) are
    new numpy arrays, not TVM NDArrays: writing into one changes nothing in the executor."""

    def __init__(self, executor: "_native.GraphExecutor", graph_json: Optional[str] = None, params: Any = ()) -> None:
        self._e = executor
        self._graph: Optional[dict] = None
        #: The values of the inputs as far as known (set by the factory, set_input, load_params).
        self._known: dict = {}
        #: Names TVM counts as params in get_input_info (what load_params loaded).
        self._param_names: set = set()
        if graph_json is not None:
            import json

            self._graph = json.loads(graph_json)
            g = self._graph
            attrs = g.get("attrs", {})
            rows = g.get("node_row_ptr")
            if rows is None:
                rows, total = [], 0
                for node in g["nodes"]:
                    rows.append(total)
                    total += int(node.get("attrs", {}).get("num_outputs", 1))
            self._rows = rows
            self._shapes = attrs["shape"][1]
            self._dtypes = attrs["dltype"][1]
            self._args = [(g["nodes"][nid]["name"], self._entry(nid, 0)) for nid in g["arg_nodes"]]
        else:
            self._args = [(n, (tuple(sh), d)) for n, sh, d in executor.inputs()]
        for name, data, dtype, shape in params:
            self._known[name] = _from_triple((data, dtype, shape))

    def _entry(self, nid: int, index: int) -> Tuple[Tuple[int, ...], str]:
        e = self._rows[nid] + index
        return tuple(int(d) for d in self._shapes[e]), str(self._dtypes[e])

    def _by_node(self, nid: int) -> Tuple[Tuple[int, ...], str]:
        return tuple(int(d) for d in self._shapes[nid]), str(self._dtypes[nid])

    def _input_name(self, key: Union[str, int], call: str) -> Optional[str]:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= int(key) < len(self._args):
                raise _native.InputError(
                    f"{call}: input index {int(key)} is out of range (the graph has {len(self._args)} inputs)"
                )
            return self._args[int(key)][0]
        if isinstance(key, str):
            return key if self.get_input_index(key) >= 0 else None
        raise _native.InputError(f"{call}: an input is named by a str or numbered by an int, not {type(key).__name__}")

    def _set(self, name: str, value: Any, call: str) -> None:
        a = as_numpy(value, f"{call}: input `{name}`")
        self._e.set_input(name, *_to_triple(a))
        self._known[name] = np.array(a, copy=True)

    def set_input(self, key: Union[str, int, None] = None, value: Any = None, **params: Any) -> None:
        """As TVM's: sets input ``key`` (a name, or TVM's input index, params counted) to
        ``value``; keyword arguments set inputs by name, skipping names the graph does not
        have (TVM skips them too). Values: numpy arrays or DLPack-capable host arrays.

        :raises RunError: ``key`` names no input, or the value's shape or dtype differs."""
        if key is not None:
            name = self._input_name(key, "GraphModule.set_input")
            if name is None:
                # The executor's own message lists the inputs.
                self._e.set_input(str(key), *_to_triple(value, f"GraphModule.set_input: input `{key}`"))
            else:
                self._set(name, value, "GraphModule.set_input")
        for k, v in params.items():
            if self.get_input_index(k) >= 0:
                self._set(k, v, "GraphModule.set_input")

    def run(self, **inputs: Any) -> None:
        """Runs the model (after setting any inputs given as keywords)."""
        if inputs:
            self.set_input(**inputs)
        self._e.run()

    def get_output(self, index: int, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Output ``index`` as a new numpy array; with ``out`` (a numpy array of the output's
        shape), copied into ``out``, which is returned (TVM's ``get_output(index, out)``)."""
        value = _from_triple(self._e.get_output(index))
        if out is not None:
            out[...] = value
            return out
        return value

    def get_num_outputs(self) -> int:
        """The number of outputs."""
        return self._e.get_num_outputs()

    def get_num_inputs(self) -> int:
        """The number of graph inputs as TVM counts them: the params included (an AOT model:
        its inputs)."""
        return len(self._args)

    def get_input_index(self, name: str) -> int:
        """TVM's index of the input called ``name`` (params counted), or -1."""
        for i, (n, _) in enumerate(self._args):
            if n == name:
                return i
        return -1

    def get_input(self, index: Union[int, str], out: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        """The value of input ``index`` (TVM's index or a name) as a new numpy array: what
        ``set_input``, ``load_params`` or the library's own params set. An input not set yet
        reads as zeros (TVM's is uninitialised memory). A name the graph does not have gives
        None, as TVM's. With ``out``, the value is copied into it and ``out`` returned."""
        name = self._input_name(index, "GraphModule.get_input")
        if name is None:
            return None
        value = self._known.get(name)
        if value is None:
            shape, dtype = self._args[self.get_input_index(name)][1]
            value = np.zeros(shape, dtype=np.dtype(dtype))
        else:
            value = value.copy()
        if out is not None:
            out[...] = value
            return out
        return value

    def get_input_info(self) -> Tuple[dict, dict]:
        """TVM's ``(shape_dict, dtype_dict)``: ``{name: shape tuple}`` and ``{name: dtype
        str}`` of the graph inputs that are not params loaded with :meth:`load_params` (as in
        TVM, the params a library carries itself are listed, since TVM lists them too)."""
        shapes, dtypes = {}, {}
        nids = self._graph["arg_nodes"] if self._graph is not None else [None] * len(self._args)
        for (name, info), nid in zip(self._args, nids):
            if name not in self._param_names:
                # TVM reads the graph's shape and dtype lists at the node id, as here.
                shapes[name], dtypes[name] = info if nid is None else self._by_node(nid)
        return shapes, dtypes

    def get_output_info(self) -> Tuple[dict, dict]:
        """TVM's ``get_output_info``: ``(shape_dict, dtype_dict)`` keyed by the name of the graph
        node each output comes from. As TVM 0.19's, the shape and dtype are the graph's
        ``shape``/``dltype`` entries at the node's id (not its entry id): after a node with
        several outputs they are another entry's, exactly as TVM reports them. An AOT model has no graph: :class:`mblob.InputError`."""
        if self._graph is None:
            raise _native.InputError("GraphModule.get_output_info: an AOT model has no graph (TVM's AotModule has none)")
        shapes, dtypes = {}, {}
        for head in self._graph["heads"]:
            nid = int(head[0])
            name = self._graph["nodes"][nid]["name"]
            shapes[name], dtypes[name] = self._by_node(nid)
        return shapes, dtypes

    def load_params(self, params_bytes: Union[bytes, bytearray]) -> None:
        """Loads a params file's bytes (what ``relay.save_param_dict`` writes), as TVM's
        ``GraphModule.load_params``: each param goes to the graph input of its name; params the
        graph does not take are skipped. Loaded params leave :meth:`get_input_info`, as in TVM.
        A file that is not a params file, or a param whose dtype or shape differs from its
        input, raises :class:`mblob.InputError` (nothing set)."""
        if not isinstance(params_bytes, (bytes, bytearray, memoryview)):
            raise _native.InputError(
                f"GraphModule.load_params: params_bytes must be bytes, not {type(params_bytes).__name__}"
            )
        data = bytes(params_bytes)
        self._e.load_params(data)
        for name, raw, dtype, shape in _native.read_params_file(data):
            if self.get_input_index(name) >= 0:
                value = _from_triple((raw, dtype, shape))
                # The library's own params are outside the executor's settable inputs.
                self._e.set_input(name, raw, dtype, list(shape))
                self._known[name] = value
                self._param_names.add(name)

    def share_params(self, other: "GraphModule", params_bytes: Union[bytes, bytearray]) -> None:
        """TVM's ``share_params(other, params_bytes)``: the params named in ``params_bytes`` (only
        their names are read) take ``other``'s values. TVM shares the memory; mblob copies the
        values once (a later change in ``other`` is not seen here)."""
        if not isinstance(other, GraphModule):
            raise _native.InputError(
                f"GraphModule.share_params: other must be a GraphModule, not {type(other).__name__}"
            )
        for name, _, _, _ in _native.read_params_file(bytes(params_bytes)):
            if self.get_input_index(name) >= 0 and other.get_input_index(name) >= 0:
                self._set(name, other.get_input(name), "GraphModule.share_params")

    def benchmark(
        self,
        device: Any = None,
        func_name: str = "run",
        repeat: int = 5,
        number: int = 5,
        min_repeat_ms: Optional[float] = None,
        limit_zero_time_iterations: int = 100,
        end_to_end: bool = False,
        cooldown_interval_ms: float = 0,
        repeats_to_cooldown: int = 1,
        **kwargs: Any,
    ) -> BenchmarkResult:
        """TVM's ``benchmark``: times ``run`` (``repeat`` measurements of ``number`` runs after
        one warm-up run) and returns a :class:`BenchmarkResult` in seconds. Keyword arguments
        are inputs, set once before timing; with ``end_to_end`` they are set again in every
        timed call and the outputs copied out, as TVM's ``run_from_inputs``. Timed on the host
        clock (TVM uses device timers on GPUs)."""
        _device_pair(device if device is not None else cpu(), "GraphModule.benchmark")
        if func_name != "run":
            raise _native.InputError(f"GraphModule.benchmark: func_name must be 'run' (got {func_name!r})")
        min_ms = 0 if min_repeat_ms is None else min_repeat_ms
        if end_to_end:

            def call() -> None:
                self.set_input(**kwargs)
                self._e.run()
                for i in range(self._e.get_num_outputs()):
                    self._e.get_output(i)

        else:
            if kwargs:
                self.set_input(**kwargs)
            call = self._e.run
        return _time(
            call,
            "GraphModule.benchmark",
            number,
            repeat,
            min_ms,
            limit_zero_time_iterations,
            cooldown_interval_ms,
            repeats_to_cooldown,
        )


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

            def create(*devices: Any) -> GraphModule:
                devs = [p for d in devices for p in _device_list(d, f"m[{name!r}](device)")] or [cpu()._pair()]
                factory = library.graph_factory(name)
                if factory is None:
                    return GraphModule(_native.GraphExecutor(library, devs))
                graph_json, params = factory
                return GraphModule(_native.GraphExecutor(library, devs), graph_json, params)

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
    """A Relax VM, as ``tvm.relax.VirtualMachine(mod, device)``: ``vm["main"](*args)``.

    Arguments, as TVM takes them from Python: numpy arrays (tensors), a tuple of ints for an
    ``R.Shape`` parameter, Python ints and floats (or numpy scalars) for ``R.Prim`` ones,
    strings, None, and tuples of any of these for ``R.Tuple`` ones (a tuple of ints is a shape
    unless the parameter is a tuple). Results keep their structure: a tensor is a numpy array, a
    shape a tuple of ints, a prim value an int or float, a returned tuple (also a 1-tuple) a
    tuple, nested as the function nests them."""

    def __init__(self, mod: Module, device: Any = None, memory_cfg: Any = None, profile: bool = False) -> None:
        # TVM's (device, memory_cfg, profile): a list of devices runs on its first (TVM adds the
        # CPU for shape functions; mblob computes shapes on the host anyway); memory_cfg picks
        # TVM's allocator and changes nothing here.
        if profile:
            raise _native.InputError("VirtualMachine(profile=True): mblob has no VM profiler")
        self._vm = _native.RelaxVm(mod._library, _device_list(device, "VirtualMachine(mod, device)")[0])
        self._inputs: dict = {}
        self._outputs: dict = {}
        self._saved: dict = {}

    def _function(self, func_name: str, call: str) -> List[str]:
        params = self._vm.function_params(func_name) if isinstance(func_name, str) else None
        if params is None:
            raise _native.InputError(
                f"{call}: no VM function {func_name!r} (functions: {', '.join(self._vm.functions())})"
            )
        return params

    def _named_args(self, func_name: str, args: Sequence[Any], kwargs: dict, call: str) -> List[Any]:
        """TVM's ``_convert_func_named_args``: keyword arguments go to the parameters of their
        names, positional ones fill the rest in order."""
        params = self._function(func_name, call)
        if not kwargs:
            return list(args)
        unknown = [k for k in kwargs if k not in params]
        if unknown:
            raise _native.InputError(
                f"{call}: {func_name!r} has no parameter {unknown[0]!r} (parameters: {', '.join(params)})"
            )
        if len(args) + len(kwargs) != len(params):
            raise _native.InputError(
                f"{call}: {func_name!r} takes {len(params)} arguments, got {len(args) + len(kwargs)}"
            )
        rest = iter(args)
        return [kwargs[p] if p in kwargs else next(rest) for p in params]

    def set_input(self, func_name: str, *args: Any, **kwargs: Any) -> None:
        """TVM's ``set_input(func_name, *args, **kwargs)``: the arguments of the next
        :meth:`invoke_stateful` of ``func_name`` (keywords by parameter name). Arrays are read
        now (numpy or DLPack-capable host arrays) and copied."""
        values = self._named_args(func_name, args, kwargs, "VirtualMachine.set_input")
        self._inputs[func_name] = [
            np.array(as_numpy(v, f"VirtualMachine.set_input: argument {i}"), copy=True)
            if not isinstance(v, (int, float, tuple, list))
            else v
            for i, v in enumerate(values)
        ]

    def invoke_stateful(self, func_name: str) -> None:
        """TVM's ``invoke_stateful(func_name)``: calls ``func_name`` with what
        :meth:`set_input` gave it; :meth:`get_outputs` returns the result."""
        self._function(func_name, "VirtualMachine.invoke_stateful")
        if func_name not in self._inputs:
            raise _native.InputError(
                f"VirtualMachine.invoke_stateful: call VirtualMachine.set_input({func_name!r}, ...) first"
            )
        self._outputs[func_name] = self[func_name](*self._inputs[func_name])

    def get_outputs(self, func_name: str) -> Any:
        """TVM's ``get_outputs(func_name)``: the result of the last :meth:`invoke_stateful` of
        ``func_name``: a numpy array, or a tuple (nested as the function's result) where TVM
        gives a tuple of NDArrays."""
        if func_name not in self._outputs:
            raise _native.InputError(
                f"VirtualMachine.get_outputs: call VirtualMachine.invoke_stateful({func_name!r}) first"
            )
        return self._outputs[func_name]

    def save_function(self, func_name: str, saved_name: str, *args: Any, include_return: bool = True, **kwargs: Any) -> None:
        """TVM's ``save_function``: ``vm[saved_name]()`` (and ``time_evaluator(saved_name,
        ...)``) then calls ``func_name`` with these arguments."""
        values = self._named_args(func_name, args, kwargs, "VirtualMachine.save_function")
        call = self[func_name]
        self._saved[saved_name] = lambda: call(*values) if include_return else (call(*values), None)[1]

    def time_evaluator(
        self,
        func_name: str,
        dev: Any = None,
        number: int = 10,
        repeat: int = 1,
        min_repeat_ms: float = 0,
        cooldown_interval_ms: float = 0,
        repeats_to_cooldown: int = 1,
        f_preproc: str = "",
    ) -> Callable[..., BenchmarkResult]:
        """TVM's ``time_evaluator``: a function that takes ``func_name``'s arguments, calls it
        once to warm up, then ``repeat`` times ``number`` calls, and returns a
        :class:`BenchmarkResult` in seconds (host clock). ``"invoke_stateful"`` times
        :meth:`invoke_stateful` (its argument: the function's name); a name given to
        :meth:`save_function` times that saved call. ``f_preproc`` is not supported."""
        _device_pair(dev if dev is not None else cpu(), "VirtualMachine.time_evaluator")
        if f_preproc:
            raise _native.InputError("VirtualMachine.time_evaluator: f_preproc is not supported by mblob")
        if func_name == "invoke_stateful":
            target: Callable[..., Any] = self.invoke_stateful
        elif func_name in self._saved:
            target = self._saved[func_name]
        else:
            self._function(func_name, "VirtualMachine.time_evaluator")
            target = self[func_name]

        def evaluator(*args: Any) -> BenchmarkResult:
            return _time(
                lambda: target(*args),
                "VirtualMachine.time_evaluator",
                number,
                repeat,
                min_repeat_ms,
                100,
                cooldown_interval_ms,
                repeats_to_cooldown,
            )

        return evaluator

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name in self._saved:
            return self._saved[name]
        if name not in self._vm.functions():
            raise _native.InputError(f"no VM function `{name}` (functions: {', '.join(self._vm.functions())})")
        kinds = self._vm.param_kinds(name)

        def call(*args: Any) -> Any:
            packed = [_vm_arg(a, kinds[i] if i < len(kinds) else "any") for i, a in enumerate(args)]
            return _vm_result(self._vm.invoke_values(name, packed), self._vm)

        return call

    def call_function(self, name: str, *args: Any) -> Any:
        """Calls the packed function ``name`` with this VM, as TVM's
        ``tvm.get_global_func(name)(*args)``: a VM builtin (``vm.builtin.kv_state_add_sequence``,
        ``vm.builtin.attention_kv_cache_get_num_available_pages``, the tensor cache, sampling),
        a VM function, a function of the library or one of mblob's global functions. Arrays are
        passed as TVM passes its arrays, by reference: what the function writes into a numpy
        argument (``debug_get_kv``, the in-place sampling builtins) is written back into it."""
        return _call_function(self._vm, name, args)

    def get_global_func(self, name: str) -> Callable[..., Any]:
        """``tvm.get_global_func(name)`` for this VM: a callable of :meth:`call_function`."""
        return lambda *args: _call_function(self._vm, name, args)


class Object:
    """A runtime object a VM function returned (TVM's ``tvm.runtime.Object``), such as the
    paged KV cache of ``create_tir_paged_kv_cache``: pass it back to functions and builtins as
    it is. ``type_key`` is TVM's."""

    def __init__(self, native: Any, vm: Any) -> None:
        self._native = native
        self._vm = vm

    @property
    def type_key(self) -> str:
        return self._native.type_key

    def same_as(self, other: Any) -> bool:
        """Whether both name the same object (TVM's ``same_as``)."""
        return isinstance(other, Object) and self._native.same_as(other._native)

    def __repr__(self) -> str:
        return f"<mblob.Object {self.type_key}>"


class PagedKVCache(Object):
    """The paged KV cache (TVM's ``relax.vm.PagedAttentionKVCache``) a model's
    ``create_tir_paged_kv_cache`` returned, with TVM's ``vm.builtin.kv_state_*`` and
    ``vm.builtin.attention_kv_cache_*`` builtins as methods (each calls the builtin of that
    name; errors are TVM's)."""

    def _call(self, name: str, *args: Any) -> Any:
        return _call_function(self._vm, name, (self,) + args)

    def add_sequence(self, seq_id: int) -> None:
        """``kv_state_add_sequence``: a new empty sequence."""
        self._call("vm.builtin.kv_state_add_sequence", int(seq_id))

    def remove_sequence(self, seq_id: int) -> None:
        """``kv_state_remove_sequence``: frees the sequence's pages (those it shares stay)."""
        self._call("vm.builtin.kv_state_remove_sequence", int(seq_id))

    def fork_sequence(self, parent_seq_id: int, child_seq_id: int, fork_pos: int = -1) -> None:
        """``kv_state_fork_sequence``: ``child`` starts as the first ``fork_pos`` tokens of
        ``parent`` (``-1``: all of them), sharing its pages."""
        self._call("vm.builtin.kv_state_fork_sequence", int(parent_seq_id), int(child_seq_id), int(fork_pos))

    def popn(self, seq_id: int, n: int) -> None:
        """``kv_state_popn``: drops the last ``n`` tokens of the sequence."""
        self._call("vm.builtin.kv_state_popn", int(seq_id), int(n))

    def clear(self) -> None:
        """``kv_state_clear``: removes every sequence."""
        self._call("vm.builtin.kv_state_clear")

    def begin_forward(self, seq_ids: Sequence[int], append_lengths: Sequence[int]) -> None:
        """``kv_state_begin_forward``: the next model call appends ``append_lengths[i]`` tokens
        to sequence ``seq_ids[i]``."""
        self._call(
            "vm.builtin.kv_state_begin_forward", tuple(int(s) for s in seq_ids), tuple(int(n) for n in append_lengths)
        )

    def end_forward(self) -> None:
        """``kv_state_end_forward``: ends the forward pass begun by :meth:`begin_forward`."""
        self._call("vm.builtin.kv_state_end_forward")

    def get_num_available_pages(self) -> int:
        """``attention_kv_cache_get_num_available_pages``."""
        return int(self._call("vm.builtin.attention_kv_cache_get_num_available_pages"))

    def get_total_sequence_length(self) -> int:
        """``attention_kv_cache_get_total_sequence_length``: the sum of the sequences' lengths."""
        return int(self._call("vm.builtin.attention_kv_cache_get_total_sequence_length"))

    def get_sequence_length(self, seq_id: int) -> int:
        """``attention_kv_cache_get_sequence_length``."""
        return int(self._call("vm.builtin.attention_kv_cache_get_sequence_length", int(seq_id)))

    def debug_get_kv(self, seq_id: int, start: int, end: int, k: Any = None, v: Any = None) -> Tuple[np.ndarray, np.ndarray]:
        """``attention_kv_cache_debug_get_kv``: the keys (RoPE applied) and values of
        positions ``start..end`` of the sequence, each ``[layers, end - start, kv_heads,
        head_dim]``, written into ``k`` and ``v`` (numpy arrays of that shape and the cache's
        dtype), which are returned."""
        if k is None or v is None:
            raise _native.InputError(
                "PagedKVCache.debug_get_kv: pass k and v, arrays of shape [layers, end - start, kv_heads, head_dim]"
            )
        self._call("vm.builtin.attention_kv_cache_debug_get_kv", int(seq_id), int(start), int(end), k, v)
        return k, v


class LanguageModel:
    """A language-model library as MLC-LLM exports them (``embed``, ``prefill``, ``decode``,
    ``create_tir_paged_kv_cache``, ``_metadata``), for greedy generation with no TVM, as ``mblob
    generate`` does: ``LanguageModel("model.so", weights="params/").generate([1, 2, 3], 16)``.
    ``weights`` is the tensor cache directory (``tensor-cache.json`` and its shards) of a library
    whose functions take the weights as ``packed_params``; a library with the weights bound
    needs none."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Module],
        weights: Optional[Union[str, "os.PathLike[str]"]] = None,
        device: Any = None,
        page_size: int = 16,
    ) -> None:
        mod = path if isinstance(path, Module) else load_module(path)
        dev = _device_pair(device if device is not None else cpu(), "LanguageModel(device)")
        self._lm = _native.LanguageModel(mod._library, dev, None if weights is None else os.fspath(weights), int(page_size))
        self.logits: Optional[np.ndarray] = None
        self.decode_seconds: List[float] = []

    @property
    def metadata(self) -> dict:
        """The model's ``_metadata``, parsed."""
        return json.loads(self._lm.metadata)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 16) -> List[int]:
        """The new token ids after ``prompt_ids`` (greedy, in a new KV cache). Afterwards
        ``logits`` holds the logits they were picked from (``[tokens, vocab]``, float32) and
        ``decode_seconds`` the time of each decode step."""
        tokens, logits, vocab, seconds = self._lm.generate([int(t) for t in prompt_ids], int(max_new_tokens))
        self.logits = np.frombuffer(logits, dtype=np.float32).reshape(len(tokens), vocab) if vocab else None
        self.decode_seconds = list(seconds)
        return list(tokens)


class ParamModule(Object):
    """The module ``vm.builtin.param_module_from_cache`` (or ``..._by_name``) returns, as TVM's
    ``ParamModuleNode``: ``mod["get_params"]()`` gives the weights (a tuple of arrays), to pass
    as a model function's ``packed_params``."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name != "get_params":
            raise _native.InputError(f"the parameter module has no function {name!r} (it has: get_params)")
        return lambda: tuple(_from_triple(t) for t in self._native.get_params())

    def get_function(self, name: str) -> Callable[..., Any]:
        """TVM's ``Module.get_function``: ``get_params``."""
        return self[name]


def _wrap_object(native: Any, vm: Any) -> Object:
    cls = {"relax.vm.PagedAttentionKVCache": PagedKVCache, "ffi.Module": ParamModule}.get(native.type_key, Object)
    return cls(native, vm)


def _call_function(vm: Any, name: str, args: Sequence[Any]) -> Any:
    """Calls ``name`` on the native VM ``vm``; numpy arguments get what the call wrote."""
    packed = [_vm_arg(a) for a in args]
    result, after = vm.call_function(name, packed)
    arrays = [a for a in _flat(args) if isinstance(a, np.ndarray)]
    for array, triple in zip(arrays, after):
        if array.flags.writeable:
            np.copyto(array, _from_triple(triple).reshape(array.shape), casting="unsafe")
    return _vm_result(result, vm)


def _flat(args: Sequence[Any]) -> List[Any]:
    out: List[Any] = []
    for a in args:
        if isinstance(a, (tuple, list)) and not all(isinstance(x, (int, np.integer)) for x in a):
            out.extend(_flat(a))
        else:
            out.append(a)
    return out


def _vm_arg(a: Any, kind: str = "any") -> Any:
    """An argument in the native VM's form: ("t", bytes, dtype, shape) for an array, ("s", ints)
    for a shape, a list for a tuple; ints, floats, strings and None as they are."""
    if isinstance(a, np.ndarray):
        return ("t",) + _to_triple(a)
    if isinstance(a, np.generic):
        return a.item()
    if isinstance(a, (tuple, list)):
        is_shape = all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in a)
        if is_shape and kind != "tuple":
            return ("s", [int(x) for x in a])
        return [_vm_arg(x) for x in a]
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, Object):
        return a._native
    if hasattr(a, "__dlpack__") or hasattr(a, "__array__"):
        return ("t",) + _to_triple(a)
    raise _native.InputError(f"cannot pass a {type(a).__name__} to a Relax function")


def _vm_result(v: Any, vm: Any = None) -> Any:
    """A native VM result as Python values: tuples, arrays, shapes as tuples of ints, runtime
    objects as :class:`Object` (of the VM ``vm``)."""
    if isinstance(v, list):
        return tuple(_vm_result(x, vm) for x in v)
    if isinstance(v, _native.Object):
        return _wrap_object(v, vm)
    if isinstance(v, tuple) and v and v[0] == "t":
        return _from_triple(v[1:])
    if isinstance(v, tuple) and v and v[0] == "s":
        return tuple(v[1])
    return v


class RelayVirtualMachine:
    """A Relay VM, as ``tvm.runtime.vm.VirtualMachine(exe, device)`` for an executable of
    ``relay.vm.compile`` (TVM 0.8-0.19, type key ``VMExecutable``), exported with
    ``export_library``: ``vm.invoke("main", *arrays)``, ``vm.run(*arrays)`` or
    ``vm["main"](*arrays)``.

    Arguments are numpy arrays (or anything ``numpy.asarray`` takes), in parameter order; the
    result is one array, or for a function that returns a tuple (TVM's ADT) a Python tuple
    with TVM's structure: ``((a, (b,)), c)`` stays nested and a one-field tuple is a tuple of
    one array, so that ``out[0][1][0]`` reads what it reads in TVM. The Relay VM runs on the
    CPU.
    """

    def __init__(self, mod: Module, device: Any = None) -> None:
        self._vm = _native.RelayVm(mod._library, _device_list(device, "relay_vm(mod, device)")[0])

    def functions(self) -> List[Tuple[str, List[str]]]:
        """The VM functions: ``(name, parameter names)`` each."""
        return self._vm.functions()

    def invoke(self, func_name: str, *args: Any) -> Any:
        """Calls VM function ``func_name`` with ``args``."""
        return _relay_result(self._vm.invoke_nested(func_name, [_to_triple(a) for a in args]))

    def run(self, *args: Any) -> Any:
        """Calls ``main``."""
        return self.invoke("main", *args)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        names = [f[0] for f in self._vm.functions()]
        if name not in names:
            raise _native.InputError(f"no VM function `{name}` (functions: {', '.join(names)})")
        return lambda *args: self.invoke(name, *args)


def _relay_result(v: Any) -> Any:
    """A native Relay VM result as Python values: a list (an ADT's fields) becomes a tuple."""
    if isinstance(v, list):
        return tuple(_relay_result(x) for x in v)
    return _from_triple(v)


def relay_vm(mod: Module, device: Any = None) -> RelayVirtualMachine:
    """The Relay VM of a library exported from ``relay.vm.compile`` (see :class:`RelayVirtualMachine`)::

    vm = mblob.relay_vm(mblob.load_module("model.so"))
    y = vm.invoke("main", x)
    """
    return RelayVirtualMachine(mod, device)
