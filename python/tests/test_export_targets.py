"""`mblob.tvm.export_library` for targets other than the host's: a `.dylib` for macOS on arm64, a
`.dll` for Windows, a static system-lib archive (`.a`) for Linux on aarch64, from what TVM
itself made for those triples (`tests/fixtures/targets`, see its README: TVM's host object
`lib0.o` for the triple, TVM's serialization of the module tree, TVM's target string, TVM's
own `create_staticlib` archive).

These run without TVM: `export_library` is given a stand-in for the module TVM's build returns,
whose `export_library` replays the steps of TVM's (write the host object into the workspace,
call `fpack_imports(mod, is_system_lib, prefix, workspace)`, then `fcompile(output, objects)`),
and a stand-in `tvm` module that answers what mblob asks TVM (its version, and
`runtime.ModulePackImportsToTensor`: the serialized imports, here TVM's recorded bytes). So the
bytes going in are TVM's, and the checks are on the file mblob writes: its object format and
machine, the blob in it equal to TVM's, and the archive equal to TVM's `create_staticlib` one.
Linking a `.dylib` or a `.dll` needs `ld64.lld` / `lld-link`: skipped (visibly) without them.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import mblob
import mblob.tvm

TARGETS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "targets"
VERSIONS = {"tvm19": "0.19.0", "tvm27": "0.27.0.post1"}


class _LlvmModule:
    """TVM's `llvm` module of the host code, as far as mblob asks it: its target string."""

    kind = "llvm"
    imported_modules: list = []

    def __init__(self, target_string: str):
        self._target = target_string

    def get_function(self, name: str):
        assert name == "_get_target_string", name
        return lambda: self._target


class _BuiltModule:
    """The module TVM's build returned for `triple` (a Relax executable's library), replaying
    TVM's `export_library`: the host object `lib0.o` into the workspace, the imports packed by
    `fpack_imports`, then `fcompile(file_name, [lib0.o, packed])`."""

    kind = "relax.VMExecutable"

    def __init__(self, tag: str, triple: str, system_lib: bool):
        facts = json.loads((TARGETS / f"{tag}.json").read_text())
        build = facts["targets"][triple]["syslib" if system_lib else "plain"]
        self.llvm = _LlvmModule(build["target_string"])
        self.imported_modules = [self.llvm]
        self.host = TARGETS / f"{tag}-{triple}.lib0.o"
        self.system_lib = system_lib
        self.prefix = facts["prefix"] if system_lib else ""

    def _collect_dso_modules(self):
        return [self.llvm]

    def export_library(self, file_name, fpack_imports=None, fcompile=None, workspace_dir=None, **kwargs):
        workspace = Path(workspace_dir)
        workspace.mkdir(parents=True, exist_ok=True)
        lib0 = workspace / "lib0.o"
        shutil.copyfile(self.host, lib0)
        packed = fpack_imports(self, self.system_lib, self.prefix, str(workspace))
        return fcompile(file_name, [str(lib0), packed], **kwargs)


@pytest.fixture
def fake_tvm(monkeypatch):
    """Installs a stand-in `tvm` for `tag` whose serialized imports are TVM's recorded blob."""

    def install(tag: str, system_lib: bool) -> bytes:
        blob = (TARGETS / f"{tag}{'.syslib' if system_lib else ''}.blob").read_bytes()
        funcs = {"runtime.ModulePackImportsToTensor": lambda mod: np.frombuffer(blob, dtype=np.uint8)}
        tvm = types.ModuleType("tvm")
        tvm.__version__ = VERSIONS[tag]
        tvm.get_global_func = lambda name, allow_missing=False: funcs.get(name)
        monkeypatch.setitem(sys.modules, "tvm", tvm)
        return blob

    return install


def _tool(name: str) -> None:
    if shutil.which(name) is None and shutil.which(f"{name}-14") is None:
        pytest.skip(f"no `{name}` on PATH: cannot link for this target")


def _blob_once(data: bytes, blob: bytes) -> None:
    """TVM's serialization (length header included) is in the file once, byte for byte."""
    assert data.count(blob) == 1, f"TVM's blob of {len(blob)} bytes is in the file {data.count(blob)} times"


@pytest.mark.parametrize("tag", ["tvm19", "tvm27"])
def test_arm64_macos_dylib(tmp_path, fake_tvm, tag):
    _tool("ld64.lld")
    blob = fake_tvm(tag, False)
    out = tmp_path / "model.dylib"
    mblob.tvm.export_library(_BuiltModule(tag, "arm64-apple-macos", False), str(out), workspace_dir=str(tmp_path / "w"))
    data = out.read_bytes()
    magic, cputype, _sub, filetype = struct.unpack_from("<IiiI", data)
    assert (magic, cputype, filetype) == (0xFEEDFACF, 0x0100000C, 6), "a 64-bit arm64 Mach-O dylib (MH_DYLIB)"
    _blob_once(data, blob)
    symbol = b"___tvm_dev_mblob" if tag == "tvm19" else b"___tvm_ffi__library_bin"
    assert symbol + b"\0" in data, "the blob's symbol, as TVM names it on Mach-O"
    # LC_CODE_SIGNATURE (0x1d): arm64 dyld refuses code without a signature.
    ncmds = struct.unpack_from("<I", data, 16)[0]
    offset, commands = 32, []
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, offset)
        commands.append(cmd)
        offset += size
    assert 0x1D in commands, "signed ad hoc (LC_CODE_SIGNATURE)"


@pytest.mark.parametrize("tag", ["tvm19", "tvm27"])
def test_x86_64_windows_dll(tmp_path, fake_tvm, tag):
    _tool("lld-link")
    blob = fake_tvm(tag, False)
    out = tmp_path / "model.dll"
    triple = "x86_64-pc-windows-msvc"
    try:
        mblob.tvm.export_library(_BuiltModule(tag, triple, False), str(out), workspace_dir=str(tmp_path / "w"))
    except mblob.Error as e:  # the C runtime's import libraries (mingw-w64) may be missing
        if "mingw" in str(e).lower() or "not found" in str(e).lower():
            pytest.skip(f"cannot link for {triple} here: {e}")
        raise
    data = out.read_bytes()
    assert data[:2] == b"MZ"
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    assert data[pe : pe + 4] == b"PE\0\0"
    machine, _n, _t, _p, _s, _opt, characteristics = struct.unpack_from("<HHIIIHH", data, pe + 4)
    assert machine == 0x8664, "x86-64"
    assert characteristics & 0x2000, "a DLL (IMAGE_FILE_DLL)"
    _blob_once(data, blob)
    symbol = b"__tvm_dev_mblob" if tag == "tvm19" else b"__tvm_ffi__library_bin"
    assert symbol + b"\0" in data, "the blob exported under TVM's name"


def test_aarch64_system_lib_archive_is_tvms_create_staticlib(tmp_path, fake_tvm):
    """TVM 0.19's system-lib build for aarch64-linux-gnu, prefix `demo_`, as a static archive:
    the bytes TVM's `create_staticlib` (`ar -crs`) wrote of its `lib0.o` and `demo_devc.o`."""
    fake_tvm("tvm19", True)
    out = tmp_path / "libmodel_android.a"
    module = _BuiltModule("tvm19", "aarch64-linux-gnu", True)
    mblob.tvm.export_library(module, str(out), workspace_dir=str(tmp_path / "w"))
    data = out.read_bytes()
    assert data[:8] == b"!<arch>\n"
    theirs = (TARGETS / "tvm19-aarch64-linux-gnu.syslib.a").read_bytes()
    assert data == theirs, "the archive differs from TVM's create_staticlib of its lib0.o and demo_devc.o"


def test_a_host_object_of_another_machine_is_refused_before_writing(tmp_path, fake_tvm):
    """The `.a` of an arm64 macOS build asked for as a Windows `.dll`: the object's format is
    not the target's, refused naming it, and nothing is written."""
    fake_tvm("tvm27", False)
    module = _BuiltModule("tvm27", "arm64-apple-macos", False)
    module.llvm = _LlvmModule(json.dumps({"kind": "llvm", "mtriple": "x86_64-pc-windows-msvc"}))
    out = tmp_path / "model.dll"
    with pytest.raises(mblob.Error) as e:
        mblob.tvm.export_library(module, str(out), workspace_dir=str(tmp_path / "w"))
    assert "lib0.o" in str(e.value), str(e.value)
    assert not out.exists()
