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

The package's modules, each thin over the native one: ``device`` (devices and arrays),
``function`` (host functions, timing), ``graph`` (graph and AOT models), ``module``
(loading), ``relax`` (the Relax VM and its objects), ``llm`` (generation), ``relay`` (the Relay
VM).
"""

from __future__ import annotations

from .device import (
    Device,
    _device_list,
    _device_pair,
    _from_triple,
    _tensor_arg,
    _to_triple,
    as_numpy,
    cpu,
    cuda,
    opencl,
)
from .function import BenchmarkResult, PackedFunction
from .graph import GraphModule
from .llm import LanguageModel
from .module import Module, load_module
from .relax import Object, PagedKVCache, ParamModule, VirtualMachine
from .relay import RelayVirtualMachine, relay_vm

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

