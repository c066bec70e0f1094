"""`mblob.export` and `mblob.pack` round trips against TVM's own blobs: a library built from
TVM's payloads or re-packed from TVM's library holds, byte for byte, the blob TVM wrote; the
library loads with the real loader; bad input raises."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import mblob
from conftest import golden, manifest

BACKENDS = ["llvm", "c"] if mblob.default_backend() == "llvm" else ["c"]


def payload_files(blob_name: str, out: Path) -> list:
    """Writes each payload of a TVM blob to a file (`payload<i>.bin`), using the offsets that
    TVM's manifest records, and returns their names in blob order with their type keys."""
    data = golden(blob_name).read_bytes()
    report = mblob.inspect(golden(blob_name))
    files = []
    for i, (key, off, n) in enumerate(zip(report["type_keys"], report["payload_offsets"], report["payload_lens"])):
        name = f"payload{i}.bin"
        (out / name).write_bytes(data[off : off + n])
        files.append((key, name))
    return files


@pytest.mark.parametrize("backend", BACKENDS)
def test_export_a_dict_tree_gives_tvms_blob(tmp_path, backend):
    (factory_key, factory), (lib_key, _), *_ = payload_files("graph_dense_relu.blob", tmp_path)
    assert (factory_key, lib_key) == ("GraphExecutorFactory", "_lib")
    lib0 = golden("graph_dense_relu.lib0.o")
    tree = {"type_key": "GraphExecutorFactory", "payload": factory, "imports": [{"type_key": "llvm", "objects": [str(lib0)]}]}
    out = tmp_path / "model.so"
    r = mblob.export(tree, out, backend=backend, base=tmp_path)
    assert r["symbol"] == "__tvm_dev_mblob" and Path(r["output"]) == out
    blob, layout = mblob.read_blob(out)
    assert layout == "classic"
    assert blob == golden("graph_dense_relu.blob").read_bytes()
    assert r["blob_len"] == len(blob)
    # The real loader opens it: the factory imports the host library.
    loaded = mblob.inspect(out, load=True)["loaded"]
    assert loaded["type_key"] == "GraphExecutorFactory"
    assert [m["type_key"] for m in loaded["imports"]] == ["library"]


def test_export_a_tree_json_file(tmp_path):
    (_, factory), *_ = payload_files("graph_dense_relu.blob", tmp_path)
    (tmp_path / "lib0.o").write_bytes(golden("graph_dense_relu.lib0.o").read_bytes())
    (tmp_path / "TREE.json").write_text(
        json.dumps({"type_key": "GraphExecutorFactory", "payload": factory, "imports": [{"type_key": "llvm", "objects": ["lib0.o"]}]})
    )
    out = tmp_path / "out" / "m.so"
    out.parent.mkdir()
    mblob.export(tmp_path / "TREE.json", out)
    assert mblob.read_blob(out)[0] == golden("graph_dense_relu.blob").read_bytes()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "version,layout", [("tvm-0.19.0", "classic"), ("tvm-0.21.0", "classic-0.21"), ("tvm-0.27.0.post1", "ffi")]
)
def test_pack_gives_each_tvm_versions_blob(tmp_path, version, layout, backend):
    """The Relax model of each TVM version, re-packed from its library with its lib0.o, in its
    version's layout: the blob is TVM's, under TVM's symbol."""
    d = ("other_versions", version)
    probe = manifest(*d, "probe.json")
    out = tmp_path / "relax.so"
    r = mblob.pack(golden(*d, "relax_add_mul.so"), out, host=[golden(*d, "relax_add_mul.lib0.o")], layout=layout, backend=backend)
    assert r["symbol"] == probe["blob_symbol"]
    blob, got_layout = mblob.read_blob(out)
    assert got_layout == layout
    assert blob == golden(*d, "relax_add_mul.blob").read_bytes()


def test_pack_converts_between_layouts(tmp_path):
    """TVM 0.19's graph library packed as `ffi` and back gives TVM's classic blob again."""
    ffi = tmp_path / "ffi.so"
    mblob.pack(golden("graph_dense_relu.so"), ffi, blob_only=True, layout="ffi")
    assert mblob.inspect(ffi)["symbol"] == "__tvm_ffi__library_bin"
    back = tmp_path / "classic.so"
    mblob.pack(ffi, back, host=[golden("graph_dense_relu.lib0.o")], layout="classic")
    assert mblob.read_blob(back)[0] == golden("graph_dense_relu.blob").read_bytes()


def test_pack_a_raw_blob_to_tar(tmp_path):
    out = tmp_path / "m.tar"
    # Both of its host objects: lib1.o holds one of the kernels (a library without it is refused).
    host = [golden("graph_two_dso_merged.lib0.o"), golden("graph_two_dso_merged.lib1.o")]
    mblob.pack(golden("graph_two_dso_merged.blob"), out, host=host)
    report = mblob.inspect(out)
    assert report["kind"] == "tar"
    assert report["type_keys"] == mblob.inspect(golden("graph_two_dso_merged.blob"))["type_keys"]


def test_export_errors_are_exceptions(tmp_path):
    with pytest.raises(mblob.InputError, match=r"<tree> at \$\.imports\[0\]\.object: unknown field `object`"):
        mblob.export({"type_key": "GraphExecutorFactory", "payload": "x", "imports": [{"type_key": "llvm", "object": []}]}, tmp_path / "a.so", base=tmp_path)
    with pytest.raises(mblob.Error, match="missing.bin"):
        mblob.export({"type_key": "GraphExecutorFactory", "payload": "missing.bin"}, tmp_path / "a.so", base=tmp_path)
    with pytest.raises(mblob.InputError, match="unknown layout"):
        mblob.export({"type_key": "llvm"}, tmp_path / "a.so", layout="newest")
    with pytest.raises(mblob.InputError, match="unknown backend `fortran`"):
        mblob.export({"type_key": "llvm"}, tmp_path / "a.so", backend="fortran")
    assert not (tmp_path / "a.so").exists()


def test_pack_errors_are_exceptions(tmp_path):
    with pytest.raises(mblob.InputError, match="host: missing"):
        mblob.pack(golden("graph_dense_relu.so"), tmp_path / "a.so")
    with pytest.raises(mblob.InputError, match="has no blob symbol"):
        mblob.pack(golden("dso_add_one.so"), tmp_path / "a.so", blob_only=True)
    bad = tmp_path / "bad.o"
    bad.write_text("not an object")
    with pytest.raises(mblob.ExportError):
        mblob.pack(golden("graph_dense_relu.so"), tmp_path / "a.so", host=[bad])
    assert not (tmp_path / "a.so").exists()


def tvm_params(path: Path) -> list:
    """The tensors of a TVM `save_param_dict` file (TVM's byte layout: magic, reserved, names,
    count, then each tensor as magic, reserved, device, ndim, dtype, shape, byte count, data)
    as `(name, dtype, shape, array)` in the file's order."""
    import numpy as np

    data = path.read_bytes()
    pos = 16

    def u64() -> int:
        nonlocal pos
        pos += 8
        return int.from_bytes(data[pos - 8 : pos], "little")

    names = []
    for _ in range(u64()):
        n = u64()
        names.append(data[pos : pos + n].decode())
        pos += n
    assert u64() == len(names)
    out = []
    for name in names:
        pos += 16 + 8  # magic, reserved, device
        ndim = int.from_bytes(data[pos : pos + 4], "little")
        code, bits = data[pos + 4], data[pos + 5]
        pos += 8
        shape = [u64() for _ in range(ndim)]
        nbytes = u64()
        dtype = {0: "int", 1: "uint", 2: "float"}[code] + str(bits)
        out.append((name, dtype, shape, np.frombuffer(data[pos : pos + nbytes], dtype=np.uint8).copy()))
        pos += nbytes
    return out


def test_graph_params_written_by_mblob_give_tvms_blob(tmp_path):
    """`_native.pack_graph_params` (what `mblob.tvm.export_library` uses for graph models):
    TVM's blob as the template, TVM's parameter arrays given in another order; the library
    holds TVM's blob byte for byte. A wrong array is an InputError naming the parameter."""
    from mblob import _native

    params = tvm_params(golden("graph_dense_relu.params"))[::-1]
    out = tmp_path / "graph.so"
    blob = golden("graph_dense_relu.blob")
    _native.pack_graph_params(str(blob), str(out), [str(golden("graph_dense_relu.lib0.o"))], params, "classic")
    assert mblob.read_blob(out)[0] == blob.read_bytes()
    name, dtype, shape, array = params[0]
    with pytest.raises(mblob.InputError, match=f"parameter `{name}`: .* bytes do not make"):
        _native.pack_graph_params(str(blob), str(tmp_path / "x.so"), [], [(name, dtype, shape, array[:-1]), *params[1:]], "classic")
    with pytest.raises(mblob.InputError, match=f"parameter `{name}`: .*uint8 numpy array"):
        _native.pack_graph_params(str(blob), str(tmp_path / "x.so"), [], [(name, dtype, shape, b"xx"), *params[1:]], "classic")
    with pytest.raises(mblob.Error, match="no array for the model's parameter"):
        _native.pack_graph_params(str(blob), str(tmp_path / "x.so"), [], params[1:], "classic")
    assert not (tmp_path / "x.so").exists()


def test_pack_refuses_a_shared_library_as_host_code(tmp_path):
    """A `.so` cannot be linked into another library: its functions would be missing."""
    out = tmp_path / "a.so"
    with pytest.raises(mblob.InputError, match="is a shared library"):
        mblob.pack(golden("graph_dense_relu.so"), out, host=[golden("dso_add_one.so")])
    assert not out.exists()


def test_pack_keeps_the_source_layout(tmp_path):
    """Without ``layout``, TVM 0.27's library re-packed with its own ``lib0.o`` stays ``ffi``
    (it was written as ``classic``, which TVM 0.27's host code does not fit, and refused)."""
    v27 = "other_versions/tvm-0.27.0.post1/relax_add_mul"
    out = tmp_path / "a.so"
    report = mblob.pack(golden(f"{v27}.so"), out, host=[golden(f"{v27}.lib0.o")])
    assert mblob.inspect(out)["layout"] == "ffi", report
    assert mblob.read_blob(out) == mblob.read_blob(golden(f"{v27}.so"))


def test_export_refuses_host_code_without_the_models_functions(tmp_path):
    """A graph factory from TVM 0.19's graph JSON and params with no host code: the kernels the
    graph names are missing, so the export is refused naming them and writes nothing, unless
    allow_missing_functions says to write it anyway."""
    trio = golden("..", "trio")
    graph = json.loads((trio / "m.json").read_text())
    kernels = sorted({n["attrs"]["func_name"] for n in graph["nodes"] if n["op"] == "tvm_op"} - {"__nop", "__copy"})
    assert kernels
    tree = {
        "type_key": "GraphExecutorFactory",
        "graph": str(trio / "m.json"),
        "params": str(trio / "m.params"),
        "imports": [{"type_key": "llvm"}],
    }
    out = tmp_path / "m.so"
    with pytest.raises(mblob.InputError) as e:
        mblob.export(tree, out)
    for k in kernels:
        assert k in str(e.value)
    assert not out.exists()
    report = mblob.export(tree, out, allow_missing_functions=True)
    assert out.exists() and report["output"] == str(out)
