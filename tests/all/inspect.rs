//! `mblob inspect` against the goldens: the JSON it prints is what TVM's manifests record.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::fuzz_inspect::blobs;
use crate::goldens::{goldens, json};

fn mblob(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).output().expect("run mblob")
}

fn inspect_json(path: &Path, extra: &[&str]) -> Value {
    let p = path.to_str().unwrap();
    let mut args = vec!["inspect", "--json"];
    args.extend_from_slice(extra);
    args.push(p);
    let out = mblob(&args);
    assert!(out.status.success(), "{p}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn check_against(report: &Value, parsed: &Value, what: &str) {
    let entries = parsed["entries"].as_array().unwrap();
    let keys: Vec<&Value> = entries.iter().map(|e| &e["type_key"]).collect();
    let lens: Vec<&Value> = entries.iter().map(|e| &e["payload_len"]).collect();
    assert_eq!(report["type_keys"].as_array().unwrap().iter().collect::<Vec<_>>(), keys, "{what}");
    assert_eq!(report["payload_lens"].as_array().unwrap().iter().collect::<Vec<_>>(), lens, "{what}");
    assert_eq!(report["row_ptr"], parsed["import_tree"]["row_ptr"], "{what}");
    assert_eq!(report["child_indices"], parsed["import_tree"]["child_indices"], "{what}");
    assert_eq!(report["blob_len"], parsed["total_len"], "{what}");
}

#[test]
fn inspect_json_matches_the_manifests() {
    let m = json(&goldens().join("manifest.json"));
    for g in m["goldens"].as_array().unwrap() {
        let name = g["name"].as_str().unwrap();
        let so = goldens().join(g["so"]["file"].as_str().unwrap());
        let report = inspect_json(&so, &[]);
        match g.get("blob_parsed") {
            Some(parsed) => {
                assert_eq!(report["symbol"], "__tvm_dev_mblob", "{name}");
                assert_eq!(report["layout"], "classic", "{name}");
                assert_eq!(report["file_offset"], g["blob_symbol_info"]["file_offset"], "{name}");
                check_against(&report, parsed, name);
                // The raw blob file reads the same.
                let blob = inspect_json(&goldens().join(g["blob"]["file"].as_str().unwrap()), &[]);
                check_against(&blob, parsed, name);
            }
            None => {
                assert_eq!(report["symbol"], Value::Null, "{name}");
                assert_eq!(report["layout"], Value::Null, "{name}");
            }
        }
    }
    for (v, layout) in [("tvm-0.19.0", "classic"), ("tvm-0.21.0", "classic-0.21"), ("tvm-0.27.0.post1", "ffi")] {
        let dir = goldens().join("other_versions").join(v);
        let probe = json(&dir.join("probe.json"));
        let report = inspect_json(&dir.join("relax_add_mul.so"), &[]);
        assert_eq!(report["symbol"], probe["blob_symbol"]);
        assert_eq!(report["layout"], layout);
        let keys = &probe["blob_parsed"]["type_keys"];
        assert_eq!(&report["type_keys"], keys, "{v}");
        assert_eq!(report["row_ptr"], probe["blob_parsed"]["import_tree"]["row_ptr"]);
    }
}

#[test]
fn inspect_graph_params_and_load() {
    let so = goldens().join("graph_dense_relu.so");
    let report = inspect_json(&so, &["--load"]);
    let params = &report["modules"][0]["params"];
    assert_eq!(params[0]["name"], "p0");
    assert_eq!(params[0]["shape"], serde_json::json!([1, 4, 3]));
    assert_eq!(report["loaded"]["type_key"], "GraphExecutorFactory");
    assert_eq!(report["loaded"]["imports"][0]["type_key"], "library");
    let text = mblob(&["inspect", "--load", so.to_str().unwrap()]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("__tvm_dev_mblob") && text.contains("└── library"), "{text}");
}

#[test]
fn inspect_reports_bad_files_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    // The header says one byte follows, and one does, but it is not a blob body.
    let bad = dir.path().join("bad.blob");
    std::fs::write(&bad, [1u8, 0, 0, 0, 0, 0, 0, 0, 9]).unwrap();
    let missing = dir.path().join("missing.so");
    // Text: its first 8 bytes, read as a blob length, would say 8031924123371070824.
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello world, this is not a library\n").unwrap();
    let good = goldens().join("graph_dense_relu.blob");
    let out = mblob(&[
        "inspect",
        bad.to_str().unwrap(),
        missing.to_str().unwrap(),
        text.to_str().unwrap(),
        good.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.blob: the blob parses in no layout") && err.contains("at byte"), "{err}");
    assert!(err.contains("missing.so") && err.contains("cannot open"), "{err}");
    assert!(err.contains("notes.txt: not an ELF file, a tar archive or a raw blob"), "{err}");
    assert!(!err.contains("8031924123371070824"), "{err}");
    assert_eq!(err.lines().count(), 3, "one line per failed file: {err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("GraphExecutorFactory"));
}

#[test]
fn help_explains_itself() {
    let out = mblob(&["inspect", "--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--json") && text.contains("--load") && text.contains("without running"), "{text}");
}

#[test]
fn inspect_shows_device_function_tables() {
    for dir in ["device", "device/tvm-0.21.0", "device/tvm-0.27.0.post1"] {
        let m = json(&goldens().join(dir).join("manifest.json"));
        for g in m["goldens"].as_array().unwrap() {
            let name = g["name"].as_str().unwrap();
            let so = goldens().join(dir).join(g["so"]["file"].as_str().unwrap());
            let report = inspect_json(&so, &[]);
            let modules = report["modules"].as_array().unwrap();
            // The text form: one `kernel name(arg types) launch [tags]` line per function.
            let text = mblob(&["inspect", so.to_str().unwrap()]);
            assert!(text.status.success(), "{dir}/{name}");
            let text = String::from_utf8(text.stdout).unwrap();
            let strings = |v: &Value| -> String {
                v.as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect::<Vec<_>>().join(", ")
            };
            for want in g["function_info_binary"].as_array().unwrap() {
                for f in want["fmap"].as_array().unwrap() {
                    let line = format!(
                        "kernel {}({}) launch [{}]",
                        f["key"].as_str().unwrap(),
                        strings(&f["arg_types"]),
                        strings(&f["launch_param_tags"])
                    );
                    assert!(text.contains(&line), "{dir}/{name}: no `{line}` in\n{text}");
                }
            }
            // Each device module of the manifest, in blob order, against the next device entry.
            let mut device_entries = modules.iter().filter(|m| m.get("functions").is_some());
            for want in g["function_info_binary"].as_array().unwrap() {
                let got = device_entries.next().unwrap_or_else(|| panic!("{dir}/{name}: missing device entry"));
                assert_eq!(got["type_key"], want["type_key"], "{dir}/{name}");
                assert!(got["format"].is_string(), "{dir}/{name}");
                let funcs = got["functions"].as_object().unwrap();
                let fmap = want["fmap"].as_array().unwrap();
                assert_eq!(funcs.len(), fmap.len(), "{dir}/{name}");
                // In payload order, with every field of TVM's FunctionInfo (the name and the
                // extra tags where this TVM wrote them).
                let keys: Vec<&str> = funcs.keys().map(String::as_str).collect();
                let want_keys: Vec<&str> = fmap.iter().map(|f| f["key"].as_str().unwrap()).collect();
                if fmap.len() > 1 {
                    assert_eq!(keys.len(), want_keys.len(), "{dir}/{name}");
                }
                for f in fmap {
                    let ours = &funcs[f["key"].as_str().unwrap()];
                    assert_eq!(ours["arg_types"], f["arg_types"], "{dir}/{name}");
                    assert_eq!(ours["launch_param_tags"], f["launch_param_tags"], "{dir}/{name}");
                    for field in ["name", "arg_extra_tags"] {
                        if let Some(want) = f.get(field) {
                            assert_eq!(&ours[field], want, "{dir}/{name}: {field}");
                        }
                    }
                }
            }
            assert!(device_entries.next().is_none(), "{dir}/{name}: extra device entries");
        }
    }
}

/// The `run` goldens record what TVM's graph JSON says goes in and out, and what `nm -D` lists:
/// inspect reports the same inputs, outputs, exported functions and context slots, and the
/// calling convention of the TVM that built each library.
#[test]
fn inspect_shows_graph_inputs_outputs_and_host_functions() {
    let run = goldens().join("run");
    let mut graphs = 0;
    for entry in std::fs::read_dir(&run).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !stem.ends_with(".json") || stem == "manifest.json" {
            continue;
        }
        let want = json(&path);
        let name = want["name"].as_str().unwrap();
        let report = inspect_json(&run.join(want["so"]["file"].as_str().unwrap()), &[]);
        let host = &report["host"];
        let convention =
            if want["tvm_version"].as_str().unwrap().starts_with("0.19") { "classic-packed" } else { "tvm-ffi" };
        assert_eq!(host["convention"], convention, "{name}");
        let mut symbols: Vec<&str> =
            host["functions"].as_array().unwrap().iter().map(|f| f["symbol"].as_str().unwrap()).collect();
        symbols.sort();
        let mut exported: Vec<&str> = want["dynamic_symbols"]["exported_functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        exported.sort();
        assert_eq!(symbols, exported, "{name}");
        for f in host["functions"].as_array().unwrap() {
            let (n, sym) = (f["name"].as_str().unwrap(), f["symbol"].as_str().unwrap());
            let expect = if convention == "tvm-ffi" { sym.strip_prefix("__tvm_ffi_").unwrap() } else { sym };
            assert_eq!(n, expect, "{name}");
        }
        let mut slots: Vec<&str> =
            host["context_symbols"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        slots.sort();
        let mut want_slots: Vec<&str> = want["dynamic_symbols"]["tvm_context_slots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        want_slots.sort();
        assert_eq!(slots, want_slots, "{name}");

        if want["executor"] != "graph" {
            continue;
        }
        graphs += 1;
        let graph = &report["modules"][0];
        assert_eq!(graph["type_key"], "GraphExecutorFactory", "{name}");
        let inputs = graph["inputs"].as_array().unwrap();
        let want_inputs = want["inputs"].as_array().unwrap();
        assert_eq!(inputs.len(), want_inputs.len(), "{name}");
        for (got, w) in inputs.iter().zip(want_inputs) {
            for field in ["name", "shape", "dtype"] {
                assert_eq!(got[field], w[field], "{name}: input {field}");
            }
        }
        let outputs = graph["outputs"].as_array().unwrap();
        let want_outputs = want["outputs"].as_array().unwrap();
        assert_eq!(outputs.len(), want_outputs.len(), "{name}");
        for (got, w) in outputs.iter().zip(want_outputs) {
            assert_eq!((&got["shape"], &got["dtype"]), (&w["shape"], &w["dtype"]), "{name}: output");
        }
        // Inputs are the argument nodes that are not stored params.
        let params: Vec<&str> =
            graph["params"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        let mut all: Vec<&str> = inputs.iter().map(|i| i["name"].as_str().unwrap()).chain(params).collect();
        all.sort();
        let mut nodes: Vec<&str> =
            want["graph"]["graph_json_input_nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
        nodes.sort();
        assert_eq!(all, nodes, "{name}");
        // The text form says the same.
        let text = String::from_utf8(
            mblob(&["inspect", run.join(want["so"]["file"].as_str().unwrap()).to_str().unwrap()]).stdout,
        )
        .unwrap();
        let w = &want_inputs[0];
        let shape: Vec<String> = w["shape"].as_array().unwrap().iter().map(|d| d.to_string()).collect();
        let line =
            format!("input {} {}[{}]", w["name"].as_str().unwrap(), w["dtype"].as_str().unwrap(), shape.join(", "));
        assert!(text.contains(&line) && text.contains("classic packed functions"), "{name}: no `{line}` in\n{text}");
    }
    assert_eq!(graphs, 4);
    // TVM 0.21: tvm-ffi calls under plain names.
    let so = goldens().join("other_versions/tvm-0.21.0/relax_add_mul.so");
    let probe = json(&goldens().join("other_versions/tvm-0.21.0/probe.json"));
    let host = inspect_json(&so, &[])["host"].clone();
    assert_eq!(host["convention"], "tvm-ffi-0.21");
    for f in host["functions"].as_array().unwrap() {
        assert!(probe["exported_symbols"].as_array().unwrap().contains(&f["symbol"]), "{f}");
    }
    assert_eq!(host["functions"].as_array().unwrap().len(), 2);
}

/// A payload kind without a loader fails `--load`, and the message says how to keep it.
#[test]
fn load_of_an_unknown_kind_suggests_keep_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join("custom.blob");
    std::fs::write(&blob, blobs::ffi_chain(2, b"example.Custom")).unwrap();
    let p = blob.to_str().unwrap();
    let out = mblob(&["inspect", "--layout", "ffi", "--load", p]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("custom.blob") && err.contains("no loader knows `example.Custom`; pass --keep-unknown"),
        "{err}"
    );
    let out = mblob(&["inspect", "--layout", "ffi", "--load", "--keep-unknown", p]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("loaded tree"));
}

/// A `.tar` written by `mblob pack -o X.tar`: its members, and the blob of the one holding it.
#[test]
fn inspect_reads_the_tar_files_mblob_writes() {
    let dir = tempfile::tempdir().unwrap();
    let g = goldens();
    let tar = dir.path().join("model.tar");
    let out = mblob(&[
        "pack",
        "--from",
        g.join("graph_dense_relu.so").to_str().unwrap(),
        "--host",
        g.join("graph_dense_relu.lib0.o").to_str().unwrap(),
        "-o",
        tar.to_str().unwrap(),
        "--backend",
        "c",
        "-q",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = inspect_json(&tar, &[]);
    assert_eq!(report["kind"], "tar");
    let members: Vec<&str> =
        report["tar"]["members"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    let blob_member = report["tar"]["blob_member"].as_str().unwrap();
    assert!(members.contains(&blob_member) && members.len() >= 2, "{members:?}");
    let golden = inspect_json(&g.join("graph_dense_relu.blob"), &[]);
    for key in ["type_keys", "payload_lens", "row_ptr", "child_indices", "blob_len", "layout"] {
        assert_eq!(report[key], golden[key], "{key}");
    }
    // Listed by `tar` itself too.
    let listed = std::process::Command::new("tar").arg("tf").arg(&tar).output().unwrap();
    let listed: Vec<String> = String::from_utf8(listed.stdout).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(listed, members);
    let text = String::from_utf8(mblob(&["inspect", tar.to_str().unwrap()]).stdout).unwrap();
    assert!(text.contains(&format!("{blob_member} (")) && text.contains("(holds the blob)"), "{text}");
    assert!(mblob(&["inspect", "--load", tar.to_str().unwrap()]).status.code() == Some(1));
    // `extract` reads it too: the params are TVM's.
    let x = dir.path().join("x");
    let out = mblob(&["extract", tar.to_str().unwrap(), "-o", x.to_str().unwrap(), "-q"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(x.join("0.params")).unwrap() == std::fs::read(g.join("graph_dense_relu.params")).unwrap());
}

/// A Relax executable's function table, against what TVM printed for the same executable
/// (`stats`: "Globals (#N): [...]") and the model's inputs.
#[test]
fn inspect_shows_the_function_table_of_relax_executables() {
    for name in ["relax_mlp_tvm019", "relax_mlp_tvm027"] {
        let want = json(&goldens().join(format!("run/{name}.json")));
        let report = inspect_json(&goldens().join(format!("run/{name}.so")), &[]);
        let relax = &report["modules"][0]["relax"];
        assert_eq!(relax["version"], "0.14", "{name}");
        let functions = relax["functions"].as_array().unwrap();
        assert_eq!(functions.len(), 1, "{name}");
        assert_eq!((&functions[0]["name"], &functions[0]["kind"]), (&want["entry"], &"vm".into()), "{name}");
        let inputs: Vec<&Value> = want["inputs"].as_array().unwrap().iter().map(|i| &i["name"]).collect();
        assert_eq!(functions[0]["params"].as_array().unwrap().iter().collect::<Vec<_>>(), inputs, "{name}");
        let stats: Vec<&str> = want["relax"]["stats"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
        let globals = stats.iter().find_map(|l| l.trim().strip_prefix("Globals (#")).unwrap();
        let list = globals.split_once(": [").unwrap().1.trim_end_matches(']');
        let mut ours = vec![functions[0]["name"].as_str().unwrap()];
        ours.extend(relax["externs"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()));
        assert_eq!(ours.join(", "), list, "{name}");
        for called in ["vm_builtins_called", "kernels_called"] {
            for f in want["relax"][called].as_array().unwrap() {
                assert!(relax["externs"].as_array().unwrap().contains(f), "{name}: {f}");
            }
        }
    }
}
