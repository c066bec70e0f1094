"""mblob as TVM's packer: ``export_library(path, fpack_imports=mblob.tvm.fpack_imports)``.

TVM packs a module's imports into an object (``devc.o``) with LLVM, holding several copies of
the blob in memory, or, without LLVM, as C text with one hex number per byte that gcc then
parses (minutes for a model of 64 MiB). :func:`fpack_imports` asks TVM for the serialized
imports (the blob bytes TVM's own packers embed, through TVM's public
``runtime.ModulePackImportsToNDArray`` / ``runtime.ModulePackImportsToTensor``), writes them to
a file in the workspace, and has mblob write the object from that file: the blob in the
library is byte for byte TVM's, under the symbol and layout of the TVM that calls.

TVM then links that object with ``g++`` like any other. For speed, :func:`export_library` (or
``fpack_imports=fpack_blob, fcompile=fcompile``) hands the blob to mblob's own link instead:
the linker sees only the host code and a placeholder, and mblob writes the blob once into the
linked library (the "direct" route of ``mblob export``), so no tool copies the blob three times.

TVM is imported only when a function here is called; ``import mblob`` works without it.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _native

__all__ = [
    "export_library",
    "fcompile",
    "fpack_blob",
    "fpack_imports",
    "layout_of_version",
    "make_fpack_imports",
    "serialize_imports",
]


def layout_of_version(version: str) -> str:
    """The blob layout a TVM version reads: ``classic`` up to 0.20, ``classic-0.21`` for 0.21
    (classic bytes under ``__tvm_ffi_library_bin``), ``ffi`` from 0.22 on. The rule is mblob's
    one TVM-generation axis (``Layout::of_version`` in Rust), not a copy of it.

    >>> layout_of_version("0.19.0"), layout_of_version("0.21.dev0"), layout_of_version("0.27.0.post1")
    ('classic', 'classic-0.21', 'ffi')
    """
    return _native.layout_of_version(version)


def _tvm() -> Any:
    try:
        import tvm  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - exercised only without TVM
        raise _native.InputError(f"mblob.tvm needs TVM, which cannot be imported: {e}") from e
    return tvm


def serialize_imports(mod: Any) -> Tuple[Any, str]:
    """The serialized imports of a TVM module (8-byte length header included) as a numpy
    ``uint8`` array, and the name of the TVM function that gave them.

    TVM 0.19-0.20 has ``runtime.ModulePackImportsToNDArray``; 0.21 and later
    ``runtime.ModulePackImportsToTensor``. Both return what TVM's ``PackImportsToLLVM`` and
    ``PackImportsToC`` embed.
    """
    tvm = _tvm()
    for name in ("runtime.ModulePackImportsToTensor", "runtime.ModulePackImportsToNDArray"):
        f = tvm.get_global_func(name, allow_missing=True)
        if f is not None:
            return _as_numpy(f(mod)), name
    raise _native.InputError(
        f"TVM {tvm.__version__} has neither runtime.ModulePackImportsToTensor nor ModulePackImportsToNDArray"
    )


def _as_numpy(tensor: Any) -> Any:
    """A numpy view of a TVM tensor through DLPack (no copy), or a copy where TVM's tensor
    does not speak DLPack."""
    import numpy as np  # noqa: PLC0415

    try:
        return np.from_dlpack(tensor)
    except (AttributeError, TypeError, RuntimeError, BufferError):
        return tensor.numpy()


def _dso_modules(mod: Any) -> List[Any]:
    """The modules TVM compiles into the library (``llvm``, ``c``, ...) among ``mod`` and its
    imports, as TVM's own ``export_library`` collects them."""
    collect = getattr(mod, "_collect_dso_modules", None)
    if collect is not None:
        try:
            return list(collect())
        except Exception:  # noqa: BLE001 - fall back to walking the imports
            pass
    found, seen, stack = [], set(), [mod]
    while stack:
        m = stack.pop()
        key = getattr(getattr(m, "handle", None), "value", None) or id(m)
        if key in seen:
            continue
        seen.add(key)
        found.append(m)
        stack.extend(getattr(m, "imported_modules", None) or getattr(m, "imports", None) or [])
    return found


def _kind(mod: Any) -> Optional[str]:
    """A module's type key: ``kind`` from TVM 0.22, ``type_key`` before. (A tvm-ffi module
    looks up an unknown attribute as a function, which a module compiled for another machine
    refuses with an error, so ``kind`` is asked first and errors mean "no such attribute".)"""
    for attr in ("kind", "type_key"):
        try:
            value = getattr(mod, attr, None)
        except Exception:  # noqa: BLE001 - see above
            value = None
        if isinstance(value, str):
            return value
    return None


def _target_triple(mod: Any) -> Optional[str]:
    """The target triple of the host code compiled into ``mod``'s library, when it names one:
    read from the ``llvm`` modules among ``mod`` and its imports (the root of a model is a
    graph factory or a Relax executable, whose ``llvm`` import holds the target), as TVM's
    ``export_library`` does. None for the host's."""
    for m in _dso_modules(mod):
        if _kind(m) != "llvm":
            continue
        try:
            target = str(m.get_function("_get_target_string")())
        except Exception:  # noqa: BLE001 - a module without the function has no target to follow
            continue
        found = re.search(r"-mtriple=(\S+)", target) or re.search(r'"mtriple"\s*:\s*"([^"]+)"', target)
        if found:
            return found.group(1)
    return None


def make_fpack_imports(backend: Optional[str] = None, layout: Optional[str] = None) -> Callable[..., str]:
    """An ``fpack_imports`` with a chosen backend (``"llvm"``, ``"c"``, ``"c-tvm"``) or layout
    (default: the calling TVM's)."""

    def fpack(mod: Any, is_system_lib: bool, symbol_prefix: str, workspace_dir: str) -> str:
        tvm = _tvm()
        chosen = layout or layout_of_version(tvm.__version__)
        blob, _ = serialize_imports(mod)
        prefix = symbol_prefix or ""
        blob_path = os.path.join(workspace_dir, f"{prefix}devc.tvm-blob")
        blob.tofile(blob_path)
        del blob
        try:
            from . import default_backend  # noqa: PLC0415

            return _native.pack_blob_file(
                blob_path,
                os.fspath(workspace_dir),
                chosen,
                bool(is_system_lib),
                prefix,
                _target_triple(mod),
                backend or default_backend(),
            )
        finally:
            os.remove(blob_path)

    fpack.__doc__ = fpack_imports.__doc__
    return fpack


def fpack_imports(mod: Any, is_system_lib: bool, symbol_prefix: str, workspace_dir: str) -> str:
    """TVM's ``fpack_imports``: pack ``mod``'s imports into ``<workspace_dir>/<prefix>devc.o``.

    Use as ``lib.export_library("model.so", fpack_imports=mblob.tvm.fpack_imports)`` (TVM
    0.19-0.27). The blob is TVM's own serialization of the imports; the layout and symbol are
    those the calling TVM reads (``__tvm_dev_mblob`` up to 0.20, ``__tvm_ffi_library_bin`` in
    0.21, ``__tvm_ffi__library_bin`` from 0.22), with ``symbol_prefix`` in front and a system-lib
    registration when ``is_system_lib``. Returns the object's path, which TVM links.
    """
    return make_fpack_imports()(mod, is_system_lib, symbol_prefix, workspace_dir)


#: The file name ending of the raw blobs :func:`fpack_blob` writes for :func:`fcompile`.
BLOB_SUFFIX = ".mblob"


def fpack_blob(mod: Any, is_system_lib: bool, symbol_prefix: str, workspace_dir: str) -> str:
    """An ``fpack_imports`` for use with :func:`fcompile` only: writes the serialized imports
    as a raw blob ``<workspace_dir>/<prefix>devc.mblob`` (with how to pack it in
    ``devc.mblob.json`` beside it) instead of an object, so that the blob's bytes are copied
    once, by :func:`fcompile`, into the linked library. TVM's own ``fcompile`` cannot link
    this file; :func:`export_library` passes the two together.
    """
    tvm = _tvm()
    prefix = symbol_prefix or ""
    blob, _ = serialize_imports(mod)
    path = os.path.join(workspace_dir, f"{prefix}devc{BLOB_SUFFIX}")
    blob.tofile(path)
    del blob
    how = {
        "layout": layout_of_version(tvm.__version__),
        "system_lib": bool(is_system_lib),
        "prefix": prefix,
        "target": _target_triple(mod),
    }
    with open(path + ".json", "w") as f:
        json.dump(how, f)
    return path


def _split_options(options: Union[None, str, Sequence[str]]) -> Tuple[List[str], List[str]]:
    """TVM's ``options`` (one ``g++`` command line does both) as compiler flags and link
    arguments: libraries, library directories and ``-Wl,`` options go to the link only,
    everything else to both."""
    if options is None:
        return [], []
    opts = [options] if isinstance(options, str) else [str(o) for o in options]
    link_only = ("-l", "-L", "-Wl,", "-shared", "-static", "-rdynamic", "-fuse-ld=")
    flags = [o for o in opts if not o.startswith(link_only)]
    return flags, opts


def _paths(objects: Sequence[str], cwd: Optional[str]) -> List[str]:
    """``fcompile``'s inputs as paths (relative ones are relative to ``cwd``, as TVM's)."""
    return [os.path.join(cwd, os.fspath(o)) if cwd else os.fspath(o) for o in objects]


def _blob_input(path: str) -> Optional[Dict[str, Any]]:
    """How to pack the blob `path` holds: a raw blob from :func:`fpack_blob`, or a blob
    object (TVM's or mblob's ``devc.o``); None for host code."""
    if path.endswith(BLOB_SUFFIX):
        try:
            with open(path + ".json") as f:
                how = json.load(f)
        except (OSError, ValueError) as e:
            raise _native.InputError(f"{path}: a raw blob without a readable {path}.json beside it: {e}") from e
        how["source_layout"] = how["layout"]
        return how
    if path.endswith(".o"):
        found = _native.blob_object(path)
        if found is not None:
            return {
                "layout": found["layout"],
                "source_layout": None,
                "system_lib": found["system_lib"],
                "prefix": found["prefix"],
                "target": None,
            }
    return None


def fcompile(
    output: str,
    objects: Sequence[str],
    options: Union[None, str, Sequence[str]] = None,
    cc: Optional[str] = None,
    cwd: Optional[str] = None,
    **kwargs: Any,
) -> None:
    """TVM's ``fcompile`` (the signature of TVM's ``create_shared``), linking with
    mblob: the host objects and sources are compiled and linked with a placeholder, and the
    blob (from :func:`fpack_blob`'s raw blob, or taken out of a blob object such as TVM's own
    ``devc.o``) is written once into the linked library, re-serialized by mblob in the same
    layout. Without a blob among ``objects`` it calls TVM's ``create_shared``.

    ``options`` go to the compiler and to the link (``-l``, ``-L`` and ``-Wl,`` options to the
    link only); ``cc`` compiles and drives the link (default ``$CC``, then ``cc``).
    """
    paths = _paths(objects, cwd)
    blobs = [(p, how) for p in paths for how in [_blob_input(p)] if how is not None]
    if not blobs:
        return _create_shared()(output, list(objects), options=options, cc=cc, cwd=cwd, **kwargs)
    if len(blobs) > 1:
        raise _native.InputError("more than one blob among the inputs: " + ", ".join(p for p, _ in blobs))
    source, how = blobs[0]
    host = [p for p in paths if p != source]
    flags, link_args = _split_options(options)
    from . import pack  # noqa: PLC0415

    pack(
        source,
        os.path.join(cwd, output) if cwd else output,
        host=host,
        blob_only=not host,
        source_layout=how["source_layout"],
        layout=how["layout"],
        system_lib=how["system_lib"],
        prefix=how["prefix"],
        target=how["target"],
        flags=flags,
        link_args=link_args,
        cc=cc,
    )
    return None


def _create_shared() -> Callable[..., Any]:
    """TVM's ``create_shared``: ``tvm.support.cc`` from TVM 0.22, ``tvm.contrib.cc`` before."""
    _tvm()
    try:
        from tvm.support import cc as _cc  # noqa: PLC0415
    except ImportError:
        from tvm.contrib import cc as _cc  # noqa: PLC0415
    return _cc.create_shared


def export_library(mod: Any, file_name: str, **kwargs: Any) -> Any:
    """``mod.export_library(file_name, **kwargs)`` with mblob packing and linking
    (:func:`fpack_blob` and :func:`fcompile`): the blob is written once, into the library.
    Other arguments (``workspace_dir``, ``options``, ``cc``, ...) go to TVM's ``export_library``.

    The output's name picks what is written, for the target of the model's host code
    (``llvm -mtriple=...``) as in ``mblob pack``: ``.so`` (Linux, Android), ``.dylib`` (macOS,
    iOS: ``ld64.lld``, signed ad hoc), ``.dll`` (Windows: ``lld-link``), ``.a`` (a static
    archive of the objects, as MLC ships for phones); a missing linker raises before anything
    is written.

    Where the link is not mblob's, a ``.tar`` output or a caller's own ``fcompile`` (TVM's
    ``create_staticlib``, a cross compiler, ``ndk.create_shared``, ``fcompile=False``...), the
    imports are packed by :func:`fpack_imports` into a real object (``devc.o``) for the target
    of the model's host code, which any linker reads.

    For a Relay graph model (TVM 0.19's ``GraphExecutorFactoryModule`` of a CPU library: the
    factory imports one ``llvm`` module that imports nothing), TVM does not serialize the
    parameters either: it serializes a copy of the factory whose parameters are empty arrays,
    which gives the module tree and the order TVM writes the parameters in, and mblob writes
    the factory with the model's parameter arrays, read in place. The blob is the one TVM's
    own packer writes (the tests compare them byte for byte).
    """
    tar = str(file_name).endswith(".tar")
    # ``None`` (as TVM's own wrappers pass the arguments along) means the default.
    kwargs = {k: v for k, v in kwargs.items() if not (k in ("fcompile", "fpack_imports") and v is None)}
    if "fpack_imports" not in kwargs and "fcompile" not in kwargs and not tar:
        parts = _graph_factory_parts(mod)
        if parts is not None:
            fpack, link = parts
            return mod.export_library(file_name, fpack_imports=fpack, fcompile=link, **kwargs)
    ours = kwargs.get("fcompile", None if tar else fcompile) is fcompile
    if ours:
        kwargs["fcompile"] = fcompile
        kwargs.setdefault("fpack_imports", fpack_blob)
    else:
        # The link is not mblob's (a `.tar`, the caller's own fcompile, ``fcompile=False``):
        # it gets a real object, as from TVM's own packer.
        kwargs.setdefault("fpack_imports", fpack_imports)
    return mod.export_library(file_name, **kwargs)


def _graph_factory_parts(lib: Any) -> Optional[Tuple[Callable[..., str], Callable[..., None]]]:
    """For a graph model whose parameters mblob can write itself, the ``fpack_imports`` and
    ``fcompile`` pair that does it; None for anything else."""
    import numpy as np  # noqa: PLC0415

    tvm = _tvm()
    if _kind(lib) is not None:
        return None  # a runtime module, not the graph factory's Python object
    module = getattr(lib, "module", None)
    graph_json = getattr(lib, "graph_json", None)
    params = getattr(lib, "params", None)
    name = getattr(lib, "libmod_name", None)
    create = tvm.get_global_func("tvm.graph_executor_factory.create", allow_missing=True)
    if create is None or module is None or not isinstance(graph_json, str) or not isinstance(name, str):
        return None
    if not isinstance(params, dict) or _kind(module) != "GraphExecutorFactory":
        return None
    imports = module.imported_modules
    if len(imports) != 1 or _kind(imports[0]) != "llvm" or imports[0].imported_modules:
        return None
    arrays = []
    try:
        for key, value in params.items():
            a = np.ascontiguousarray(_as_numpy(value))
            arrays.append((str(key), str(value.dtype), [int(d) for d in a.shape], a.reshape(-1).view(np.uint8)))
    except Exception:  # noqa: BLE001 - a dtype numpy cannot hold: TVM serializes the arrays
        return None
    templates: Dict[str, Any] = {}

    def fpack(mod: Any, is_system_lib: bool, symbol_prefix: str, workspace_dir: str) -> str:
        handle = getattr(getattr(mod, "handle", None), "value", None)
        same = mod is module or (handle is not None and handle == getattr(module.handle, "value", None))
        if is_system_lib or not same:
            return fpack_blob(mod, is_system_lib, symbol_prefix, workspace_dir)
        args: List[Any] = []
        for key, value in params.items():
            args += [key, tvm.nd.empty((0,), str(value.dtype))]
        empty = create(graph_json, imports[0], name, *args)
        path = fpack_blob(empty, is_system_lib, symbol_prefix, workspace_dir)
        templates[path] = True
        return path

    def link(
        output: str,
        objects: Sequence[str],
        options: Union[None, str, Sequence[str]] = None,
        cc: Optional[str] = None,
        cwd: Optional[str] = None,
        **kw: Any,
    ) -> None:
        paths = _paths(objects, cwd)
        template = [p for p in paths if p in templates]
        if not template:
            return fcompile(output, objects, options=options, cc=cc, cwd=cwd, **kw)
        with open(template[0] + ".json") as f:
            how = json.load(f)
        flags, link_args = _split_options(options)
        _native.pack_graph_params(
            template[0],
            os.path.join(cwd, output) if cwd else output,
            [p for p in paths if p != template[0]],
            arrays,
            how["layout"],
            how["target"],
            flags,
            link_args,
            cc,
        )
        return None

    return fpack, link
