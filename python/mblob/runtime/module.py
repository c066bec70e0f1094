"""Loading (:func:`load_module`) and the loaded modules (:class:`Module`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Union

from .. import _native
from .device import _device_list, cpu
from .function import PackedFunction
from .graph import GraphModule


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
