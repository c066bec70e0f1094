"""Relay VM models (TVM 0.8-0.19) as ``tvm.runtime.vm.VirtualMachine`` runs them
(:class:`RelayVirtualMachine`, :func:`relay_vm`).
"""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

from .. import _native
from .device import _device_list, _tensor_arg
from .module import Module


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
        return _relay_result(self._vm.invoke_nested(func_name, [_tensor_arg(a) for a in args]))

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
    return v.numpy()


def relay_vm(mod: Module, device: Any = None) -> RelayVirtualMachine:
    """The Relay VM of a library exported from ``relay.vm.compile`` (see :class:`RelayVirtualMachine`)::

    vm = mblob.relay_vm(mblob.load_module("model.so"))
    y = vm.invoke("main", x)
    """
    return RelayVirtualMachine(mod, device)
