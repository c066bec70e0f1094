"""Graph and AOT models as ``tvm.contrib.graph_executor`` runs them (:class:`GraphModule`).
"""

from __future__ import annotations

import json
from typing import Any, Optional, Tuple, Union

import numpy as np

from .. import _native
from .device import _device_pair, _from_triple, _tensor_arg, as_numpy, cpu
from .function import BenchmarkResult, _time


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
        self._e.set_input(name, _tensor_arg(a))
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
                self._e.set_input(str(key), _tensor_arg(value, f"GraphModule.set_input: input `{key}`"))
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
        value = self._e.get_output(index).numpy()
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
                self._e.set_input(name, value)
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
                    self._e.get_output(i).numpy()

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
