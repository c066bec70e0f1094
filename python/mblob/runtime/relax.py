"""Relax models as ``tvm.relax.VirtualMachine`` runs them (:class:`VirtualMachine`), the runtime
objects its functions return (:class:`Object`, :class:`PagedKVCache`, :class:`ParamModule`)
and how values cross to the native VM.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple

import numpy as np

from .. import _native
from .device import _device_list, _device_pair, _tensor_arg, as_numpy, cpu
from .function import BenchmarkResult, _time
from .module import Module


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




class ParamModule(Object):
    """The module ``vm.builtin.param_module_from_cache`` (or ``..._by_name``) returns, as TVM's
    ``ParamModuleNode``: ``mod["get_params"]()`` gives the weights (a tuple of arrays), to pass
    as a model function's ``packed_params``."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name != "get_params":
            raise _native.InputError(f"the parameter module has no function {name!r} (it has: get_params)")
        return lambda: tuple(t.numpy() for t in self._native.get_params())

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
    for array, tensor in zip(arrays, after):
        if array.flags.writeable:
            np.copyto(array, tensor.numpy().reshape(array.shape), casting="unsafe")
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
    """An argument in the native VM's form: a native ``Tensor`` or a numpy array for an array
    (:func:`_tensor_arg`), ("s", ints) for a shape, a list for a tuple; ints, floats, strings and
    None as they are."""
    if isinstance(a, (np.ndarray, _native.Tensor)):
        return _tensor_arg(a)
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
        return _tensor_arg(a)
    raise _native.InputError(f"cannot pass a {type(a).__name__} to a Relax function")


def _vm_result(v: Any, vm: Any = None) -> Any:
    """A native VM result as Python values: tuples, arrays, shapes as tuples of ints, runtime
    objects as :class:`Object` (of the VM ``vm``)."""
    if isinstance(v, list):
        return tuple(_vm_result(x, vm) for x in v)
    if isinstance(v, _native.Object):
        return _wrap_object(v, vm)
    if isinstance(v, _native.Tensor):
        return v.numpy()
    if isinstance(v, tuple) and v and v[0] == "s":
        return tuple(v[1])
    return v
