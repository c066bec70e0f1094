"""mblob: TVM's module serialization in Rust, for Python.

Read what a TVM library holds, build one from a module tree, pack the module tree of an
existing library again in another TVM version's layout, and hand TVM a fast packer for its own
``export_library``::

    import mblob
    report = mblob.inspect("model.so")          # what `mblob inspect --json` prints
    print(report["layout"], report["type_keys"])

    import mblob.tvm
    lib.export_library("model.so", fpack_imports=mblob.tvm.fpack_imports)

Load and run without TVM (see :mod:`mblob.runtime`)::

    gmod = mblob.load_module("graph.so")["default"](mblob.cpu(0))
    gmod.set_input("x", x); gmod.run(); y = gmod.get_output(0)
    y = mblob.VirtualMachine(mblob.load_module("relax.so"), mblob.cpu())["main"](x)
    y = mblob.relay_vm(mblob.load_module("relay_vm.so")).invoke("main", x)   # relay.vm.compile

Every error is an exception of the :class:`Error` family carrying mblob's message (the file
and what was wrong); the interpreter never crashes on bad input.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, Optional, Tuple, Union

from . import _native
from ._native import Error, ExportError, FileError, FormatError, InputError, LoadError, RunError
from .runtime import (
    BenchmarkResult,
    Device,
    GraphModule,
    LanguageModel,
    Module,
    Object,
    PackedFunction,
    PagedKVCache,
    ParamModule,
    RelayVirtualMachine,
    VirtualMachine,
    cpu,
    cuda,
    load_module,
    opencl,
    relay_vm,
)

__all__ = [
    "Error",
    "ExportError",
    "FileError",
    "FormatError",
    "InputError",
    "LoadError",
    "RunError",
    "BenchmarkResult",
    "Device",
    "GraphModule",
    "LanguageModel",
    "Module",
    "Object",
    "PackedFunction",
    "PagedKVCache",
    "ParamModule",
    "VirtualMachine",
    "RelayVirtualMachine",
    "relay_vm",
    "cpu",
    "cuda",
    "opencl",
    "load_module",
    "LAYOUTS",
    "BACKENDS",
    "default_backend",
    "export",
    "inspect",
    "pack",
    "read_blob",
    "tvm",
]

__version__: str = _native.__version__

PathLike = Union[str, "os.PathLike[str]"]

#: The blob layouts: ``classic`` (TVM 0.8-0.20), ``classic-0.21`` (TVM 0.21), ``ffi`` (0.22+).
LAYOUTS = ("classic", "classic-0.21", "ffi")
#: How the blob becomes an object: ``llvm`` (LLVM 14, when this build has it), ``c`` (generated
#: C that includes the blob with the assembler's ``.incbin``), ``c-tvm`` (TVM's own C text).
BACKENDS = ("llvm", "c", "c-tvm")


def default_backend() -> str:
    """The packer of blob objects (:func:`mblob.tvm.fpack_imports`, and the fallback of the
    ``"direct"`` route): ``"llvm"`` when this build of mblob has the LLVM packer, else ``"c"``."""
    return "llvm" if _native.has_llvm() else "c"


def inspect(
    path: PathLike,
    *,
    layout: Optional[str] = None,
    prefix: Optional[str] = None,
    load: bool = False,
    keep_unknown: bool = False,
) -> Dict[str, Any]:
    """What a packed ``.so``, a raw ``.blob`` or an exported ``.tar`` holds, read without running it.

    Returns the object that ``mblob inspect --json PATH`` prints: ``file``, ``kind``,
    ``symbol``, ``layout``, ``blob_len``, ``type_keys``, ``payload_lens``, ``modules`` (graph
    inputs, outputs and params, device function tables, Relax function tables), ``tree``,
    ``host`` (exported functions and their calling convention), ...

    :param layout: read a raw blob as this layout instead of detecting it.
    :param prefix: only consider blob symbols with this ``c_symbol_prefix``.
    :param load: also load the file with the real loader (this ``dlopen``\\ s a shared library,
        running its initialisers) and report the tree after loading under ``loaded``.
    :param keep_unknown: with ``load``, keep payloads of unknown kinds as opaque bytes.
    :raises FormatError: a malformed blob or ELF file.
    :raises FileError: the file cannot be read.
    """
    text = _native.inspect_json(os.fspath(path), layout, prefix, load, keep_unknown)
    return json.loads(text)


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise InputError(f"unknown layout `{layout}` (expected one of: {', '.join(LAYOUTS)})")
    return layout


def export(
    tree: Union[Dict[str, Any], PathLike],
    output: PathLike,
    *,
    backend: Optional[str] = None,
    layout: str = "classic",
    system_lib: bool = False,
    prefix: str = "",
    target: Optional[str] = None,
    base: Optional[PathLike] = None,
    force_layout: bool = False,
    allow_missing_functions: bool = False,
) -> Dict[str, Any]:
    """Build one shared library (or a ``.tar`` of objects) from a module tree, as ``mblob export``.

    :param tree: the tree description that ``mblob export`` reads as ``TREE.json``: a dict, or
        the path of such a JSON file. Paths in a dict are relative to ``base`` (default: the
        current directory); in a file, relative to the file.
    :param output: the library to write; it appears only when the export succeeds. A name
        ending in ``.tar`` gets the objects in a tar archive instead.
    :param backend: ``"direct"`` (the default, as ``mblob export``'s: the library is linked
        with a placeholder and the blob written into it once; it falls back to the object
        packer where an object is needed: ``.tar`` output, ``system_lib``, non-x86-64/AArch64
        targets), ``"llvm"``, ``"c"`` or ``"c-tvm"`` (a blob object linked in).
    :param layout: ``"classic"`` (TVM 0.8-0.20), ``"classic-0.21"`` or ``"ffi"`` (TVM 0.22+).
    :param system_lib: register the blob at start-up with TVM's system library.
    :param prefix: TVM's ``c_symbol_prefix``, put in front of the blob symbol.
    :param target: target triple of the blob object (default: this machine).
    :param force_layout: write the layout even when the host objects' calling convention is
        another TVM version's.
    :param allow_missing_functions: write the library even when the host objects do not define
        every function the model calls (graph ``func_name``s, the AOT entry, a Relax
        executable's kernels), as ``mblob export --allow-missing-functions``; without it such
        an export is refused with an :class:`InputError` naming the missing functions.
    :returns: ``{"output": path, "symbol": blob symbol or None, "blob_len": bytes}``.
    :raises InputError: a tree description that makes no sense (the message gives its JSON path).
    :raises ExportError: the compiler, linker or LLVM failed.
    """
    _check_layout(layout)
    backend = backend or "direct"
    if isinstance(tree, dict):
        text = json.dumps(tree).encode()
        root = os.fspath(base) if base is not None else os.getcwd()
        return _native.export(
            os.fspath(output),
            text,
            None,
            root,
            backend,
            layout,
            system_lib,
            prefix,
            target,
            force_layout,
            allow_missing_functions,
        )
    return _native.export(
        os.fspath(output),
        None,
        os.fspath(tree),
        ".",
        backend,
        layout,
        system_lib,
        prefix,
        target,
        force_layout,
        allow_missing_functions,
    )


def pack(
    source: PathLike,
    output: PathLike,
    *,
    host: Iterable[PathLike] = (),
    blob_only: bool = False,
    source_layout: Optional[str] = None,
    layout: Optional[str] = None,
    backend: Optional[str] = None,
    system_lib: bool = False,
    prefix: str = "",
    target: Optional[str] = None,
    force_layout: bool = False,
    flags: Iterable[str] = (),
    link_args: Iterable[str] = (),
    cc: Optional[PathLike] = None,
) -> Dict[str, Any]:
    """Pack the module tree of a ``.so`` or raw ``.blob`` again, as ``mblob pack``.

    The tree is read without running anything; payload kinds mblob does not know are carried
    over as opaque bytes. This converts a library between TVM versions' layouts.

    :param source: the ``.so`` or ``.blob`` whose module tree is packed.
    :param output: the library to write (``.tar``: objects in an archive).
    :param host: the host code: the object files (or C/C++ sources) the library was built
        from, e.g. TVM's ``lib0.o``. Required unless ``blob_only``.
    :param blob_only: write a library holding only the blob.
    :param source_layout: layout of a raw ``.blob`` source (default: detected).
    :param layout: the layout to write (default: the source's own, as ``mblob pack``).
    :param flags: extra compiler flags for host sources (``-O3``, ``-I...``).
    :param link_args: extra link arguments, after the objects (``-lm``, ``-Wl,...``).
    :param cc: the compiler that compiles host sources and drives the link (default: ``$CC``,
        then ``cc``).
    :returns: as :func:`export`.
    """
    if layout is not None:
        _check_layout(layout)
    if source_layout is not None:
        _check_layout(source_layout)
    return _native.pack(
        os.fspath(source),
        os.fspath(output),
        [os.fspath(h) for h in host],
        blob_only,
        source_layout,
        backend or "direct",
        layout,
        system_lib,
        prefix,
        target,
        force_layout,
        list(flags),
        list(link_args),
        None if cc is None else os.fspath(cc),
    )


def read_blob(path: PathLike, *, layout: Optional[str] = None) -> Tuple[bytes, str]:
    """The blob of a ``.so`` (found by its symbol) or a raw ``.blob`` file, 8-byte header
    included, and its layout's name."""
    return _native.read_blob(os.fspath(path), layout)


from . import tvm  # noqa: E402  (mblob.tvm imports TVM only when called)
from . import graph_executor  # noqa: E402  (graph_executor.create: the classic trio)
