"""`mblob.inspect` on the TVM goldens: the same object as `mblob inspect --json`, and what
TVM's manifests record about each blob."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import mblob
from conftest import GOLDENS, golden, manifest

ALL_GOLDEN_FILES = sorted(
    str(p.relative_to(GOLDENS))
    for pattern in ("*.so", "*.blob", "other_versions/*/*.so", "other_versions/*/*.blob", "run/*.so", "device/*.so", "device/*/*.so")
    for p in GOLDENS.glob(pattern)
)


def test_there_are_goldens_to_check():
    assert len(ALL_GOLDEN_FILES) >= 20, ALL_GOLDEN_FILES


@pytest.mark.parametrize("name", ALL_GOLDEN_FILES)
def test_inspect_is_the_cli_json(name, mblob_cli):
    path = golden(name)
    out = subprocess.run([mblob_cli, "inspect", "--json", str(path)], capture_output=True, check=True)
    assert mblob.inspect(path) == json.loads(out.stdout)


def test_inspect_matches_tvm_manifest():
    m = manifest("manifest.json")
    checked = 0
    for g in m["goldens"]:
        report = mblob.inspect(golden(g["so"]["file"]))
        parsed = g.get("blob_parsed")
        if parsed is None:
            assert report["symbol"] is None and report["layout"] is None, g["name"]
            continue
        assert report["symbol"] == "__tvm_dev_mblob"
        assert report["layout"] == "classic"
        assert report["file_offset"] == g["blob_symbol_info"]["file_offset"]
        assert report["type_keys"] == [e["type_key"] for e in parsed["entries"]]
        assert report["payload_lens"] == [e["payload_len"] for e in parsed["entries"]]
        assert report["row_ptr"] == parsed["import_tree"]["row_ptr"]
        assert report["blob_len"] == parsed["total_len"]
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize(
    "version,layout", [("tvm-0.19.0", "classic"), ("tvm-0.21.0", "classic-0.21"), ("tvm-0.27.0.post1", "ffi")]
)
def test_inspect_other_versions(version, layout):
    probe = manifest("other_versions", version, "probe.json")
    report = mblob.inspect(golden("other_versions", version, "relax_add_mul.so"))
    assert report["symbol"] == probe["blob_symbol"]
    assert report["layout"] == layout
    assert report["type_keys"] == probe["blob_parsed"]["type_keys"]


def test_inspect_graph_inputs_outputs_like_tvm():
    want = manifest("run", "graph_two_outputs.json")
    report = mblob.inspect(golden("run", "graph_two_outputs.so"))
    graph = next(m for m in report["modules"] if m["type_key"] == "GraphExecutorFactory")
    assert [(i["name"], i["shape"], i["dtype"]) for i in graph["inputs"]] == [
        (i["name"], i["shape"], i["dtype"]) for i in want["inputs"]
    ]
    assert [(o["shape"], o["dtype"]) for o in graph["outputs"]] == [(o["shape"], o["dtype"]) for o in want["outputs"]]


def test_inspect_load_gives_the_loaded_tree():
    report = mblob.inspect(golden("graph_dense_relu.so"), load=True)
    assert report["loaded"]["type_key"] == "GraphExecutorFactory"
    assert [i["type_key"] for i in report["loaded"]["imports"]] == ["library"]


def test_a_missing_file_is_a_file_error(tmp_path):
    with pytest.raises(mblob.FileError, match="nope.so"):
        mblob.inspect(tmp_path / "nope.so")


def test_a_text_file_is_an_error_naming_it(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello, this is not a library")
    with pytest.raises(mblob.Error, match=r"notes.txt: not an ELF file, a tar archive or a raw blob"):
        mblob.inspect(p)


def test_a_truncated_blob_is_a_format_error(tmp_path):
    data = golden("graph_dense_relu.blob").read_bytes()
    p = tmp_path / "cut.blob"
    # Keep the header consistent with the shorter file, so that the body itself is cut.
    body = data[8 : len(data) // 2]
    p.write_bytes(len(body).to_bytes(8, "little") + body)
    with pytest.raises(mblob.FormatError, match=r"cut.blob: the blob parses in no layout \(as classic: at byte \d+: graph_json length"):
        mblob.inspect(p)
    with pytest.raises(mblob.FormatError, match=r"cut.blob: malformed blob: at byte \d+: graph_json length \d+ is larger"):
        mblob.inspect(p, layout="classic")


def test_a_forged_length_is_an_error_not_a_crash(tmp_path):
    data = bytearray(golden("graph_dense_relu.blob").read_bytes())
    data[16:24] = (2**63).to_bytes(8, "little")  # the first type key's length
    p = tmp_path / "forged.blob"
    p.write_bytes(bytes(data))
    with pytest.raises(mblob.Error, match="forged.blob"):
        mblob.inspect(p, layout="classic")


def test_an_unknown_layout_is_an_input_error():
    with pytest.raises(mblob.InputError, match="unknown layout `classic-9`"):
        mblob.inspect(golden("graph_dense_relu.blob"), layout="classic-9")


def test_errors_form_one_family():
    for cls in (mblob.FormatError, mblob.LoadError, mblob.ExportError, mblob.InputError, mblob.FileError):
        assert issubclass(cls, mblob.Error)
    assert issubclass(mblob.Error, Exception)


@pytest.mark.parametrize("version", ["0.19.0", "0.21.0", "0.27.0.post1"])
def test_layout_of_version_is_the_layout_that_tvm_wrote(version):
    """`mblob.tvm.layout_of_version` (Rust's `Layout::of_version`) of each TVM version is the
    layout of the library that version built."""
    so = golden(f"other_versions/tvm-{version}/relax_add_mul.so")
    assert mblob.tvm.layout_of_version(version) == mblob.inspect(so)["layout"]
    with pytest.raises(mblob.InputError):
        mblob.tvm.layout_of_version("not a version")
