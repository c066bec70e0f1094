//! `mblob inspect` against the goldens: the JSON it prints is what TVM's manifests record.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

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
    assert!(err.contains("bad.blob: malformed blob") && err.contains("at byte"), "{err}");
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
                for f in fmap {
                    let ours = &funcs[f["key"].as_str().unwrap()];
                    assert_eq!(ours["arg_types"], f["arg_types"], "{dir}/{name}");
                    assert_eq!(ours["launch_param_tags"], f["launch_param_tags"], "{dir}/{name}");
                }
            }
            assert!(device_entries.next().is_none(), "{dir}/{name}: extra device entries");
        }
    }
}
