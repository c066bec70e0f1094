"""`mblob.tvm.fpack_imports` inside TVM's own `export_library` (TVM 0.19 and 0.27 from PyPI).

Skipped, and counted as skipped, when `import tvm` fails (CI has no TVM); run by hand in a
TVM virtualenv. Each test builds a small model in TVM, exports it twice (TVM's default packer,
then mblob's), and checks that both libraries hold the same blob bytes under the calling TVM's
symbol, and that the library packed by mblob loads in TVM and computes what TVM's own does.
"""

from __future__ import annotations

import numpy as np
import pytest

import mblob
import mblob.tvm

tvm = pytest.importorskip("tvm", reason="TVM is not installed (pip install apache-tvm or xtc-tvm-python-bindings)")

SYMBOLS = {"classic": "__tvm_dev_mblob", "classic-0.21": "__tvm_ffi_library_bin", "ffi": "__tvm_ffi__library_bin"}
LAYOUT = mblob.tvm.layout_of_version(tvm.__version__)
RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((64, 32)).astype("float32")
B1 = RNG.standard_normal((32,)).astype("float32")
X = RNG.standard_normal((2, 64)).astype("float32")
FPACKS = {"llvm": mblob.tvm.fpack_imports, "c": mblob.tvm.make_fpack_imports(backend="c")}
if mblob.default_backend() != "llvm":
    del FPACKS["llvm"]


def tensor(a):
    make = getattr(tvm.runtime, "tensor", None) or tvm.nd.array
    return make(a, tvm.cpu(0))


def relax_mlp(target="llvm"):
    from tvm import relax

    bb = relax.BlockBuilder()
    # TVM 0.27 names struct info "types" (relax.TensorType).
    tensor_type = getattr(relax, "TensorStructInfo", None) or relax.TensorType
    x = relax.Var("x", tensor_type((2, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(W1)))
            y = bb.emit(relax.op.add(y, relax.const(B1)))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    build = getattr(tvm, "compile", None) or relax.build
    return build(bb.get(), target=target)


def run_relax(path):
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu(0))
    return vm["main"](tensor(X)).numpy()


def run_relax_mblob(path):
    return mblob.VirtualMachine(mblob.load_module(path), mblob.cpu())["main"](X)


def run_graph_mblob(path):
    gmod = mblob.load_module(path)["default"](mblob.cpu())
    gmod.set_input("x", X)
    gmod.run()
    return gmod.get_output(0)


def graph_mlp():
    relay = pytest.importorskip("tvm.relay", reason=f"TVM {tvm.__version__} has no Relay")
    x = relay.var("x", shape=(2, 64), dtype="float32")
    w = relay.var("w", shape=(32, 64), dtype="float32")
    b = relay.var("b", shape=(32,), dtype="float32")
    y = relay.nn.relu(relay.nn.bias_add(relay.nn.dense(x, w), b))
    mod = tvm.IRModule.from_expr(relay.Function([x, w, b], y))
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target="llvm", params={"w": tensor(W1.T.copy()), "b": tensor(B1)})


def run_graph(path):
    from tvm.contrib import graph_executor

    m = graph_executor.GraphModule(tvm.runtime.load_module(str(path))["default"](tvm.cpu(0)))
    m.set_input("x", X)
    m.run()
    return m.get_output(0).numpy()


MODELS = {"relax_mlp": (relax_mlp, run_relax, run_relax_mblob), "graph_mlp": (graph_mlp, run_graph, run_graph_mblob)}


@pytest.mark.parametrize("backend", sorted(FPACKS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_export_library_with_mblobs_packer(tmp_path, model, backend):
    build, run, run_mblob = MODELS[model]
    lib = build()
    theirs, ours = tmp_path / "tvm.so", tmp_path / "mblob.so"
    lib.export_library(str(theirs))
    calls = []

    def fpack(mod, is_system_lib, prefix, workspace):
        path = FPACKS[backend](mod, is_system_lib, prefix, workspace)
        calls.append((is_system_lib, prefix, path))
        return path

    lib.export_library(str(ours), fpack_imports=fpack)
    assert [(s, p, path.endswith("/devc.o")) for s, p, path in calls] == [(False, "", True)]
    report = mblob.inspect(ours)
    assert report["layout"] == LAYOUT and report["symbol"] == SYMBOLS[LAYOUT]
    assert mblob.read_blob(ours) == mblob.read_blob(theirs)
    want = run(theirs)
    got = run(ours)
    np.testing.assert_array_equal(got, want)
    reference = np.maximum(X.astype("float64") @ W1 + B1, 0)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4)
    # mblob's own runtime runs it too, with TVM's result.
    np.testing.assert_array_equal(run_mblob(ours), want)


def test_fpack_imports_writes_the_object_into_the_workspace(tmp_path):
    lib = relax_mlp()
    path = mblob.tvm.fpack_imports(lib.mod if hasattr(lib, "mod") else lib, False, "", str(tmp_path))
    assert path == str(tmp_path / "devc.o")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["devc.o"]


def test_serialized_imports_are_a_blob():
    lib = relax_mlp()
    blob, via = mblob.tvm.serialize_imports(lib.mod if hasattr(lib, "mod") else lib)
    assert via.startswith("runtime.ModulePackImports")
    assert blob.dtype == np.uint8 and int.from_bytes(blob[:8].tobytes(), "little") == blob.size - 8


def undefined_symbols(path):
    import subprocess

    out = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_export_library_through_mblobs_link(tmp_path, model):
    """`mblob.tvm.export_library`: the raw blob from fpack_blob, linked by mblob's fcompile
    with the blob written into the library once; same blob as TVM's, same outputs in TVM and
    in mblob, and no raw blob or object file left beside the output."""
    build, run, run_mblob = MODELS[model]
    lib = build()
    theirs, ours = tmp_path / "tvm.so", tmp_path / "out" / "mblob.so"
    ours.parent.mkdir()
    lib.export_library(str(theirs))
    mblob.tvm.export_library(lib, str(ours))
    assert sorted(p.name for p in ours.parent.iterdir()) == ["mblob.so"]
    assert mblob.read_blob(ours) == mblob.read_blob(theirs)
    want = run(theirs)
    np.testing.assert_array_equal(run(ours), want)
    np.testing.assert_array_equal(run_mblob(ours), want)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_fcompile_links_tvms_own_blob_object(tmp_path, model):
    """`fcompile=mblob.tvm.fcompile` with TVM's own packer: the blob is taken out of TVM's
    devc.o and written into the library by mblob, byte for byte."""
    build, run, _ = MODELS[model]
    lib = build()
    theirs, ours = tmp_path / "tvm.so", tmp_path / "mblob.so"
    lib.export_library(str(theirs))
    lib.export_library(str(ours), fcompile=mblob.tvm.fcompile)
    assert mblob.read_blob(ours) == mblob.read_blob(theirs)
    np.testing.assert_array_equal(run(ours), run(theirs))


def test_fcompile_passes_options_and_refuses_two_blobs(tmp_path):
    lib = graph_mlp() if hasattr(tvm, "relay") else relax_mlp()
    ws = tmp_path / "ws"
    ws.mkdir()
    # A link option reaches the link: an unknown library fails it with the linker's message.
    with pytest.raises(mblob.ExportError, match="no_such_library_xyz"):
        mblob.tvm.export_library(lib, str(tmp_path / "bad.so"), options=["-lno_such_library_xyz"])
    runtime_module = getattr(lib, "module", None) or getattr(lib, "mod", None) or lib
    first = mblob.tvm.fpack_blob(runtime_module, False, "", str(ws))
    second = ws / "copy.mblob"
    second.write_bytes(open(first, "rb").read())
    (ws / "copy.mblob.json").write_text(open(first + ".json").read())
    with pytest.raises(mblob.InputError, match="more than one blob"):
        mblob.tvm.fcompile(str(tmp_path / "two.so"), [first, str(second)])


def test_system_lib_blob_registers_itself(tmp_path):
    """A system-lib build (TVM 0.19 Relay): TVM's export and mblob's carry the same blob, and
    both libraries call the layout's registration function at load."""
    relay = pytest.importorskip("tvm.relay", reason=f"TVM {tvm.__version__} has no Relay")
    from tvm.relay.backend import Runtime

    x = relay.var("x", shape=(2, 64), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x)))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm", runtime=Runtime("cpp", {"system-lib": True}))
    theirs, ours, fast = tmp_path / "tvm.so", tmp_path / "mblob.so", tmp_path / "fast.so"
    calls = []

    def fpack(mod, is_system_lib, prefix, workspace):
        calls.append(is_system_lib)
        return mblob.tvm.fpack_imports(mod, is_system_lib, prefix, workspace)

    lib.export_library(str(theirs))
    lib.export_library(str(ours), fpack_imports=fpack)
    mblob.tvm.export_library(lib, str(fast))
    assert calls == [True]
    for path in (ours, fast):
        assert mblob.read_blob(path) == mblob.read_blob(theirs)
        assert "TVMBackendRegisterSystemLibSymbol" in undefined_symbols(path)
    assert "TVMBackendRegisterSystemLibSymbol" in undefined_symbols(theirs)


def test_graph_model_parameters_are_written_by_mblob_in_tvms_order(tmp_path, monkeypatch):
    """`mblob.tvm.export_library` of a Relay model with many parameters: TVM serializes only
    the factory with empty parameters, mblob writes the arrays, and the blob still equals
    the one TVM's own packer writes byte for byte (TVM stores parameters in its hash map's
    order, which the empty copy reproduces)."""
    relay = pytest.importorskip("tvm.relay", reason=f"TVM {tvm.__version__} has no Relay")
    from mblob import _native

    calls = []
    real = _native.pack_graph_params
    monkeypatch.setattr(_native, "pack_graph_params", lambda *a: calls.append(a[3]) or real(*a))
    x = relay.var("x", shape=(1, 16), dtype="float32")
    y, params = x, {}
    for i in range(23):
        w = relay.var(f"w{i}", shape=(16, 16), dtype="float32")
        y = relay.nn.relu(relay.nn.dense(y, w))
        params[f"w{i}"] = RNG.standard_normal((16, 16)).astype("float32") / 4
    mod = tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(y), y))
    with tvm.transform.PassContext(opt_level=0):
        lib = relay.build(mod, target="llvm", params=params)
    theirs, ours = tmp_path / "tvm.so", tmp_path / "mblob.so"
    lib.export_library(str(theirs))
    mblob.tvm.export_library(lib, str(ours))
    assert len(calls) == 1 and len(calls[0]) == len(lib.params) >= 20
    assert mblob.read_blob(ours) == mblob.read_blob(theirs)
    xin = RNG.standard_normal((1, 16)).astype("float32")
    gmod = mblob.load_module(ours)["default"](mblob.cpu())
    gmod.set_input("x", xin)
    gmod.run()
    from tvm.contrib import graph_executor

    m = graph_executor.GraphModule(tvm.runtime.load_module(str(theirs))["default"](tvm.cpu(0)))
    m.set_input("x", xin)
    m.run()
    np.testing.assert_array_equal(gmod.get_output(0), m.get_output(0).numpy())


@pytest.mark.parametrize(("system_lib", "prefix"), [(False, ""), (True, ""), (True, "demo_")])
def test_fpack_imports_object_is_tvms_devc_o(tmp_path, system_lib, prefix):
    """`fpack_imports`, plain and system-lib (TVM allows a symbol prefix only with it): the
    object is, byte for byte, the one TVM's own LLVM packer (`runtime.ModulePackImportsToLLVM`)
    writes, except that TVM 0.27's LLVM relocates the system-lib `.init_array` entry against
    the constructor's symbol where LLVM 14 uses its section's: there the blob's bytes and
    symbol are compared."""
    if mblob.default_backend() != "llvm":
        pytest.skip("this mblob was built without its LLVM packer")
    lib = graph_mlp() if hasattr(tvm, "relay") else relax_mlp()
    mod = getattr(lib, "module", None) or getattr(lib, "mod", None) or lib
    pack_llvm = tvm.get_global_func("runtime.ModulePackImportsToLLVM")
    ours_dir, theirs = tmp_path / "ours", tmp_path / "theirs.o"
    ours_dir.mkdir()
    ours = mblob.tvm.fpack_imports(mod, system_lib, prefix, str(ours_dir))
    assert ours == str(ours_dir / f"{prefix}devc.o")
    m = pack_llvm(mod, system_lib, "llvm", prefix)
    (m.save if hasattr(m, "save") else m.write_to_file)(str(theirs))
    if system_lib and LAYOUT == "ffi":
        assert mblob.read_blob(ours) == mblob.read_blob(theirs)
        assert "devc.o" in ours and mblob.inspect(ours)["symbol"] == prefix + SYMBOLS[LAYOUT]
    else:
        assert open(ours, "rb").read() == theirs.read_bytes()


def aarch64():
    return tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})


def elf_machine(data):
    """The ELF header's e_machine (62 x86-64, 183 AArch64)."""
    assert data[:4] == b"\x7fELF"
    return int.from_bytes(data[18:20], "little")


def tar_members(path):
    import tarfile

    with tarfile.open(path) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers()}


def test_a_cross_built_model_gets_a_blob_object_for_its_machine(tmp_path):
    """A model built for AArch64 and written to `.tar` by mblob (both routes): every object is
    AArch64, as in TVM's own `.tar`, and the blob is TVM's."""
    lib = relax_mlp(aarch64())
    lib.export_library(str(tmp_path / "tvm.tar"))
    theirs = tar_members(tmp_path / "tvm.tar")
    (tmp_path / "tvm.devc.o").write_bytes(theirs["devc.o"])
    assert {elf_machine(d) for d in theirs.values()} == {183}
    mblob.tvm.export_library(lib, str(tmp_path / "mblob.tar"))
    lib.export_library(str(tmp_path / "fpack.tar"), fpack_imports=mblob.tvm.fpack_imports)
    for name in ("mblob.tar", "fpack.tar"):
        ours = tar_members(tmp_path / name)
        assert sorted(ours) == sorted(theirs), name
        assert {n: elf_machine(d) for n, d in ours.items()} == {n: 183 for n in theirs}, name
        (tmp_path / f"{name}.devc.o").write_bytes(ours["devc.o"])
        assert mblob.read_blob(tmp_path / f"{name}.devc.o") == mblob.read_blob(tmp_path / "tvm.devc.o"), name


@pytest.mark.parametrize(
    "triple, suffix, magic, linker",
    [
        ("arm64-apple-macos", "dylib", b"\xcf\xfa\xed\xfe\x0c\x00\x00\x01", "ld64.lld"),
        ("x86_64-pc-windows-msvc", "dll", b"MZ", "lld-link"),
        ("aarch64-linux-gnu", "a", b"!<arch>\n", None),
    ],
)
def test_export_library_writes_other_platforms_containers(tmp_path, triple, suffix, magic, linker):
    """`mblob.tvm.export_library` of a model TVM built for another platform: the container of
    the output's name for that machine (a Mach-O arm64 `.dylib`, a PE `.dll`, an archive), with
    TVM's serialized imports in it once. (`test_export_targets.py` checks the same without TVM,
    more closely, on TVM's recorded objects.)"""
    import shutil

    if linker and not (shutil.which(linker) or shutil.which(f"{linker}-14")):
        pytest.skip(f"no `{linker}` on PATH")
    lib = relax_mlp(tvm.target.Target({"kind": "llvm", "mtriple": triple}))
    out = tmp_path / f"model.{suffix}"
    mblob.tvm.export_library(lib, str(out))
    data = out.read_bytes()
    assert data.startswith(magic), data[:8]
    blob, _ = mblob.tvm.serialize_imports(lib.mod if hasattr(lib, "mod") else lib)
    assert data.count(blob.tobytes()) == 1, "TVM's serialized imports, once"


def test_a_callers_own_fcompile_gets_real_objects(tmp_path):
    """`mblob.tvm.export_library(..., fcompile=f)` with a link that is not mblob's (here TVM's
    `create_staticlib`, and a function that records what it is given): it is handed objects
    any linker reads, the blob object among them, never mblob's raw blob."""
    try:
        from tvm.support import cc
    except ImportError:
        from tvm.contrib import cc
    lib = relax_mlp()
    given = []

    def recording(output, objects, **kwargs):
        given.extend((str(o), mblob._native.blob_object(str(o)) is not None) for o in objects)
        return cc.create_shared(output, objects, **kwargs)

    mblob.tvm.export_library(lib, str(tmp_path / "own.so"), fcompile=recording)
    assert given and all(o.endswith(".o") for o, _ in given), given
    assert [o.rsplit("/", 1)[-1] for o, blob in given if blob] == ["devc.o"], given
    np.testing.assert_array_equal(run_relax(tmp_path / "own.so"), run_relax_mblob(tmp_path / "own.so"))

    mblob.tvm.export_library(lib, str(tmp_path / "lib.a"), fcompile=cc.create_staticlib)
    import subprocess

    names = subprocess.run(["ar", "t", str(tmp_path / "lib.a")], capture_output=True, text=True, check=True)
    assert "devc.o" in names.stdout.split() and "devc.mblob" not in names.stdout, names.stdout


def test_export_library_of_a_library_without_imports(tmp_path):
    """A library without imports (a TIR function alone) goes to TVM's `create_shared`, which
    TVM 0.22+ keeps in `tvm.support.cc`."""
    from tvm import te

    a = te.placeholder((8,), name="a", dtype="float32")
    b = te.compute(a.shape, lambda i: a[i] + 1.0, name="b")
    func = te.create_prim_func([a, b]).with_attr("global_symbol", "add_one")
    build = getattr(tvm, "compile", None) or tvm.build
    lib = build(tvm.IRModule({"add_one": func}), target="llvm")
    lib = getattr(lib, "mod", lib)
    mblob.tvm.export_library(lib, str(tmp_path / "plain.so"))
    f = tvm.runtime.load_module(str(tmp_path / "plain.so"))["add_one"]
    x = tensor(np.arange(8, dtype="float32"))
    y = tensor(np.zeros(8, dtype="float32"))
    f(x, y)
    np.testing.assert_array_equal(y.numpy(), np.arange(8, dtype="float32") + 1)
