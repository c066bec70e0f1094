"""mblob as TVM's packer: ``export_library(path, fpack_imports=mblob.tvm.fpack_imports)``.

TVM packs a module's imports into an object (``devc.o``) with LLVM, holding several copies of
the blob in memory, or, without LLVM, as C text with one hex number per byte that gcc then
parses (minutes for a model of 64 MiB). :func:`fpack_imports` asks TVM for the serialized
imports (the blob bytes TVM's own packers embed, through TVM's public
``runtime.ModulePackImportsToNDArray`` / ``runtime.ModulePackImportsToTensor``), writes them to
a file in the workspace, and has mblob write the object from that file: the blob in the
library is byte for byte TVM's, under the symbol and layout of the TVM that calls.

TVM is imported only when a function here is called; ``import mblob`` works without it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Optional, Tuple

from . import _native

__all__ = ["fpack_imports", "make_fpack_imports", "layout_of_version", "serialize_imports"]


def layout_of_version(version: str) -> str:
    """The blob layout a TVM version reads: ``classic`` up to 0.20, ``classic-0.21`` for 0.21
    (classic bytes under ``__tvm_ffi_library_bin``), ``ffi`` from 0.22 on.

    >>> layout_of_version("0.19.0"), layout_of_version("0.21.dev0"), layout_of_version("0.27.0.post1")
    ('classic', 'classic-0.21', 'ffi')
    """
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise _native.InputError(f"cannot read the TVM version `{version}`")
    major, minor = int(m.group(1)), int(m.group(2))
    if (major, minor) <= (0, 20):
        return "classic"
    if (major, minor) == (0, 21):
        return "classic-0.21"
    return "ffi"


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


def _target_triple(mod: Any) -> Optional[str]:
    """The host module's target triple when it names one (TVM compiles the rest for it)."""
    kind = getattr(mod, "type_key", None) or getattr(mod, "kind", None)
    if kind != "llvm":
        return None
    try:
        target = str(mod.get_function("_get_target_string")())
    except Exception:  # noqa: BLE001 - a module without the function has no target to follow
        return None
    m = re.search(r"-mtriple=(\S+)", target) or re.search(r'"mtriple"\s*:\s*"([^"]+)"', target)
    return m.group(1) if m else None


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
