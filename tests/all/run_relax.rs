//! `mblob run` on Relax models: TVM 0.19 and 0.27 MLPs and the 0.27 feature models, at 1 and 4
//! threads, inputs by name and by position; every output equals TVM's, array for array.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::goldens::goldens;

/// dtype string and raw little-endian bytes of a `.npy` file.
fn npy(path: &Path) -> (String, Vec<u64>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().to_vec();
    let descr = f.dtype().descr();
    let data: Vec<u8> = match descr.trim_matches('\'') {
        // float16 as raw bytes (npyz decodes it only with its `half` feature): the file's tail.
        "<f2" => bytes[bytes.len() - 2 * shape.iter().product::<u64>() as usize..].to_vec(),
        "<f4" => f.into_vec::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<i4" => f.into_vec::<i32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "<i8" => f.into_vec::<i64>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        "|i1" => f.into_vec::<i8>().unwrap().iter().map(|v| *v as u8).collect(),
        "|b1" => f.into_vec::<bool>().unwrap().into_iter().map(u8::from).collect(),
        d => panic!("{}: dtype {d}", path.display()),
    };
    (descr, shape, data)
}

fn run(args: &[&Path], extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).arg("run").args(args).args(extra).output().expect("run mblob")
}

/// A library, its inputs by name, and TVM's output files.
type Case = (PathBuf, Vec<(String, PathBuf)>, Vec<PathBuf>);

#[test]
fn mblob_run_relax_models_give_tvms_outputs() {
    let g = goldens();
    let out = tempfile::tempdir().unwrap();
    let mut cases: Vec<Case> = Vec::new();
    for name in ["relax_mlp_tvm019", "relax_mlp_tvm027"] {
        let d = g.join("run");
        cases.push((
            d.join(format!("{name}.so")),
            vec![("x".into(), d.join(format!("{name}.in.x.npy")))],
            vec![d.join(format!("{name}.out.0.npy"))],
        ));
    }
    let d = g.join("relax/tvm-0.27");
    for name in ["relax_tuple_reshape", "relax_dynamic", "relax_fused", "relax_branch", "relax_two_functions"] {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join(format!("{name}.json"))).unwrap()).unwrap();
        for r in meta["runs"].as_array().unwrap() {
            let file = |v: &serde_json::Value| d.join(v["file"].as_str().unwrap());
            let inputs = r["inputs"].as_array().unwrap();
            cases.push((
                d.join(format!("{name}.so")),
                inputs.iter().map(|i| (i["name"].as_str().unwrap().to_owned(), file(i))).collect(),
                r["outputs"].as_array().unwrap().iter().map(file).collect(),
            ));
        }
    }
    for (k, (so, inputs, expected)) in cases.iter().enumerate() {
        for threads in ["1", "4"] {
            for positional in [false, true] {
                let dir = out.path().join(format!("{k}-{threads}-{positional}"));
                let specs: Vec<String> = inputs
                    .iter()
                    .map(|(n, f)| if positional { f.display().to_string() } else { format!("{n}={}", f.display()) })
                    .collect();
                let mut extra: Vec<&str> = vec!["--threads", threads, "--output-dir", dir.to_str().unwrap()];
                for s in &specs {
                    extra.extend(["--input", s.as_str()]);
                }
                let o = run(&[so], &extra);
                assert!(o.status.success(), "{}: {}", so.display(), String::from_utf8_lossy(&o.stderr));
                for (i, want) in expected.iter().enumerate() {
                    let got = npy(&dir.join(format!("out.{i}.npy")));
                    assert_eq!(got, npy(want), "{} output {i} ({threads} threads)", so.display());
                }
                assert!(!dir.join(format!("out.{}.npy", expected.len())).exists());
            }
        }
    }
}

/// The unseen models (`relax/unseen/make.py`) of TVM 0.19 and 0.27 through `mblob run` at 1 and 4
/// threads: every output (a shape as a 1-d int64 array) equals TVM's, bit for bit where TVM's 1-
/// and 4-thread runs agreed, else within 1e-5 relative.
#[test]
fn mblob_run_unseen_relax_models_give_tvms_outputs() {
    let out = tempfile::tempdir().unwrap();
    let mut runs = 0;
    for version in ["tvm-0.19-unseen", "tvm-0.27-unseen"] {
        let d = goldens().join("relax").join(version);
        for e in std::fs::read_dir(&d).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            let Some(name) = name.strip_suffix(".json") else { continue };
            let meta: serde_json::Value =
                serde_json::from_slice(&std::fs::read(d.join(format!("{name}.json"))).unwrap()).unwrap();
            let so = d.join(format!("{name}.so"));
            for r in meta["runs"].as_array().unwrap() {
                let agree = r["threads_1_and_4_agree"].as_bool().unwrap();
                let specs: Vec<String> = r["inputs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| {
                        format!("{}={}", i["name"].as_str().unwrap(), d.join(i["file"].as_str().unwrap()).display())
                    })
                    .collect();
                for threads in ["1", "4"] {
                    let dir = out.path().join(format!("{version}-{name}-{threads}"));
                    let mut extra: Vec<&str> = vec!["--threads", threads, "--output-dir", dir.to_str().unwrap()];
                    for s in &specs {
                        extra.extend(["--input", s.as_str()]);
                    }
                    let o = run(&[&so], &extra);
                    assert!(o.status.success(), "{}: {}", so.display(), String::from_utf8_lossy(&o.stderr));
                    let want = r["outputs"].as_array().unwrap();
                    for (i, w) in want.iter().enumerate() {
                        let what = format!("{version}/{name} output {i} ({threads} threads)");
                        let got = npy(&dir.join(format!("out.{i}.npy")));
                        let key =
                            if threads == "4" && w.get("file_4_threads").is_some() { "file_4_threads" } else { "file" };
                        let want = npy(&d.join(w[key].as_str().unwrap()));
                        if agree || want.0 != "<f4" {
                            assert_eq!(got, want, "{what}");
                        } else {
                            assert_eq!((&got.0, &got.1), (&want.0, &want.1), "{what}");
                            let f = |b: &[u8]| {
                                b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>()
                            };
                            for (g, w) in f(&got.2).into_iter().zip(f(&want.2)) {
                                assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-30), "{what}: {g} vs TVM's {w}");
                            }
                        }
                    }
                    assert!(!dir.join(format!("out.{}.npy", want.len())).exists());
                    if want.iter().any(|w| w["kind"] == "shape") {
                        assert!(String::from_utf8_lossy(&o.stdout).contains(": shape ["), "{name}: shape line");
                    }
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 44);
}

#[test]
fn mblob_run_relax_errors_name_the_problem() {
    let g = goldens().join("run");
    let so = g.join("relax_mlp_tvm027.so");
    let x = g.join("relax_mlp_tvm027.in.x.npy");
    let spec = format!("y={}", x.display());
    let o = run(&[&so], &["--input", &spec]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("`main` has parameters x"));
    let o = run(&[&so], &[]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing inputs of `main`: x"));
    let o = run(&[&so], &["--function", "nope", "--input", x.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no VM function `nope`"));
    // The else branch TVM miscompiles (TVM's VM segfaults there): a typed error, exit 1, no output.
    let d = goldens().join("relax/tvm-0.27-unseen");
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("c.npy");
    {
        use npyz::WriterBuilder;
        let mut f = std::fs::File::create(&c).unwrap();
        let mut w = npyz::WriteOptions::<bool>::new().default_dtype().shape(&[]).writer(&mut f).begin_nd().unwrap();
        w.push(&false).unwrap();
        w.finish().unwrap();
    }
    let (x, w) = (d.join("unseen_dynamic_branch.run0.in.x.npy"), d.join("unseen_dynamic_branch.run0.in.w.npy"));
    let outdir = tmp.path().join("out");
    let o = run(
        &[&d.join("unseen_dynamic_branch.so")],
        &["--input", c.to_str().unwrap(), "--input", x.to_str().unwrap(), "--input", w.to_str().unwrap()]
            .into_iter()
            .chain(["--output-dir", outdir.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("argument 0 of `vm.builtin.alloc_tensor`: expected a storage, got None"), "{err}");
    assert!(!outdir.exists());
    // A wrong shape: TVM's own message from match_shape.
    let other = goldens().join("relax/tvm-0.27/relax_dynamic.run0.in.x.npy");
    let o = run(&[&so], &["--input", other.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("match_cast error,  shape[0] mismatch to specified constant."), "{err}");
}
