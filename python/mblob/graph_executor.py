"""TVM's ``tvm.contrib.graph_executor`` without TVM: run the "classic trio" that
``relay.build`` gives (a host library, its graph JSON and a params file)::

    import mblob
    from mblob import graph_executor

    lib = mblob.load_module("model.so")                 # factory.get_lib().export_library(...)
    gmod = graph_executor.create(open("model.json").read(), lib, mblob.cpu(0))
    gmod.load_params(open("model.params", "rb").read()) # relay.save_param_dict(get_params())
    gmod.set_input("x", x)
    gmod.run()
    y = gmod.get_output(0)

A library exported whole (``factory.export_library``) holds its graph and params itself: run
it with ``mblob.load_module(path)["default"](dev)`` instead.
"""

from __future__ import annotations

from typing import Sequence, Union

from . import _native
from .runtime import Device, GraphModule, Module, _device_list

__all__ = ["create", "GraphModule"]


def create(graph_json_str: str, libmod: Module, device: Union[Device, Sequence[Device], None] = None) -> GraphModule:
    """As TVM's ``graph_executor.create(graph_json_str, libmod, device)``: a
    :class:`GraphModule` running the graph JSON (``get_graph_json()``) with the functions of
    ``libmod`` (a host library from :func:`mblob.load_module`) on ``device`` (one device or a
    list, default CPU 0). Its inputs include the params until :meth:`GraphModule.load_params`
    sets them.

    Raises :class:`mblob.InputError` when the JSON is not a graph, or calls a function the
    library does not have (named in the message)."""
    if not isinstance(graph_json_str, str):
        raise _native.InputError(f"graph_json_str must be the graph JSON text, not {type(graph_json_str).__name__}")
    devices = _device_list(device, "graph_executor.create")
    return GraphModule(_native.GraphExecutor.create(libmod._library, graph_json_str, devices), graph_json_str)
