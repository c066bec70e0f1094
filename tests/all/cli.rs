//! `mblob pack` and `mblob export` as a user runs them, and what happens when a step fails
//! or the process is killed: a clear error naming the step and command, nothing at the output
//! path, nothing left in the temporary directory.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use mblob_runtime::format::{self, UnknownKeys};
use mblob_runtime::{elf, Layout, Registry};

use crate::goldens::{goldens, read};

fn mblob(args: &[&str], tmpdir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).env("TMPDIR", tmpdir).output().expect("run mblob")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn blob_in(so: &Path) -> Vec<u8> {
    let data = read(so);
    elf::find_blob(&data, None).unwrap().unwrap().bytes(&data).unwrap().to_vec()
}

fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind in {}: {left:?}", dir.display());
}

#[test]
fn pack_converts_between_layouts_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let g = goldens();
    let lib0 = g.join("graph_dense_relu.lib0.o");
    let (ffi, back) = (dir.path().join("ffi.so"), dir.path().join("back.so"));
    let out = mblob(
        // TVM 0.19's kernels in the ffi layout: the container converts, TVM 0.27 could not call
        // them (hence --force-layout).
        &[
            "pack",
            "--from",
            s(&g.join("graph_dense_relu.so")),
            "--host",
            s(&lib0),
            "-o",
            s(&ffi),
            "--layout",
            "ffi",
            "--force-layout",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = read(&ffi);
    assert_eq!(elf::find_blob(&data, None).unwrap().unwrap().layout, Layout::Ffi);
    let backends: &[&str] = if cfg!(feature = "llvm") { &["llvm", "c", "c-tvm"] } else { &["c", "c-tvm"] };
    for &backend in backends {
        let out = mblob(
            &[
                "pack",
                "--from",
                s(&ffi),
                "--host",
                s(&lib0),
                "-o",
                s(&back),
                "--backend",
                backend,
                "-q",
                "--layout",
                "classic",
            ],
            tmp.path(),
        );
        assert!(out.status.success(), "{backend}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stdout.is_empty(), "-q prints nothing");
        assert!(
            blob_in(&back) == read(&g.join("graph_dense_relu.blob")),
            "{backend}: not TVM's blob after the round trip"
        );
    }
    // A raw .blob works as input too, and the 0.21 golden converts to classic.
    let from_blob = dir.path().join("from_blob.so");
    let out = mblob(
        &[
            "pack",
            "--from",
            s(&g.join("relax_add_mul.blob")),
            "--host",
            s(&g.join("relax_add_mul.lib0.o")),
            "-o",
            s(&from_blob),
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(blob_in(&from_blob) == read(&g.join("relax_add_mul.blob")));
    assert_empty(tmp.path());
}

#[test]
fn export_reads_a_tree_description() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let golden = read(&goldens().join("graph_dense_relu.blob"));
    let parsed = format::parse_blob(&golden, Layout::Classic, &Registry::default(), UnknownKeys::Error).unwrap();
    std::fs::write(dir.path().join("factory.bin"), parsed.entries[0].payload).unwrap();
    let lib0 = goldens().join("graph_dense_relu.lib0.o");
    let tree = serde_json::json!({
        "type_key": "GraphExecutorFactory", "payload": "factory.bin",
        "imports": [{"type_key": "llvm", "objects": [lib0]}]
    });
    let json = dir.path().join("tree.json");
    std::fs::write(&json, tree.to_string()).unwrap();
    let so = dir.path().join("model.so");
    let out = mblob(&["export", s(&json), "-o", s(&so)], tmp.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(blob_in(&so) == golden);

    // A bad node is named by its JSON path.
    let bad = serde_json::json!({"type_key": "GraphExecutorFactory", "payload": "factory.bin", "imports": [{"type_key": "cuda"}]});
    std::fs::write(&json, bad.to_string()).unwrap();
    let out = mblob(&["export", s(&json), "-o", s(&so)], tmp.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("tree.json at $.imports[0]") && err.contains("payload"), "{err}");
    std::fs::write(&json, "{not json").unwrap();
    let err = String::from_utf8_lossy(&mblob(&["export", s(&json), "-o", s(&so)], tmp.path()).stderr).into_owned();
    assert!(err.contains("not valid JSON"), "{err}");
    assert_empty(tmp.path());
}

/// The golden called `name` in the device manifest of `dir`.
fn device_golden(dir: &Path, name: &str) -> serde_json::Value {
    let manifest: serde_json::Value = serde_json::from_slice(&read(&dir.join("manifest.json"))).unwrap();
    manifest["goldens"].as_array().unwrap().iter().find(|g| g["name"] == name).unwrap().clone()
}

#[test]
fn export_writes_device_payloads_in_the_layout_asked_for() {
    // A device payload file holds TVM 0.19's classic bytes; exported for TVM 0.21 it must gain
    // 0.21's extra argument tags, giving the blob TVM 0.21 wrote for the same model.
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dev = goldens().join("device");
    let mut checked = 0;
    // (opencl_two_kernels is one module in 0.19 and two in 0.21; relax_opencl_add_mul's root
    // is an executable, not the library.)
    for name in ["opencl_vector_add", "metal_vector_add", "webgpu_vector_add"] {
        let old = device_golden(&dev, name);
        assert_eq!(old["module_tree_in_memory"]["type_key"], "llvm");
        let payloads: Vec<_> = old["device_payloads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| serde_json::json!({"type_key": p["type_key"], "payload": dev.join(p["payload_file"]["file"].as_str().unwrap())}))
            .collect();
        let tree = serde_json::json!({
            "type_key": "llvm", "objects": [dev.join(format!("tvm-0.21.0/{name}.lib0.o"))], "imports": payloads
        });
        let json = dir.path().join("tree.json");
        std::fs::write(&json, tree.to_string()).unwrap();
        for (layout, blob) in [
            ("classic", dev.join(format!("{name}.blob"))),
            ("classic-0.21", dev.join(format!("tvm-0.21.0/{name}.blob"))),
        ] {
            let so = dir.path().join(format!("{name}.{layout}.so"));
            // TVM 0.21's kernels: --force-layout for the classic container.
            let out =
                mblob(&["export", s(&json), "-o", s(&so), "--layout", layout, "-q", "--force-layout"], tmp.path());
            assert!(out.status.success(), "{name} {layout}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(blob_in(&so) == read(&blob), "{name} {layout}: not the blob of {}", blob.display());
        }
        checked += 1;
    }
    assert_eq!(checked, 3);

    // A CUDA module from PTX text and a function table (the shape `inspect --json` prints)
    // gives the blob TVM 0.27 wrote for its NVPTX build.
    let dev27 = dev.join("tvm-0.27.0.post1");
    let g = device_golden(&dev27, "nvptx_vector_add");
    let fmap = &g["blob_parsed"]["entries"][1]["parsed"]["fmap"]["entries"];
    let functions: serde_json::Map<String, serde_json::Value> = fmap
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let info = &f["info"];
            let strings = |v: &serde_json::Value, field: &str| -> Vec<serde_json::Value> {
                v.as_array().unwrap().iter().map(|x| x[field].clone()).collect()
            };
            let entry = serde_json::json!({
                "name": info["name"]["value"],
                "arg_types": strings(&info["arg_types"]["values"], "str"),
                "launch_param_tags": strings(&info["launch_param_tags"]["items"], "value"),
            });
            (f["key"]["value"].as_str().unwrap().to_owned(), entry)
        })
        .collect();
    assert_eq!(functions.len(), 1);
    let tree = serde_json::json!({
        "type_key": "llvm", "objects": [dev27.join("nvptx_vector_add.lib0.o")],
        "imports": [{"type_key": "cuda", "format": "ptx", "data": dev27.join("nvptx_vector_add.dev0.source.txt"),
                     "functions": functions}]
    });
    let json = dir.path().join("ptx.json");
    std::fs::write(&json, tree.to_string()).unwrap();
    let so = dir.path().join("nvptx.so");
    let out = mblob(&["export", s(&json), "-o", s(&so), "--layout", "ffi", "-q"], tmp.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(blob_in(&so) == read(&dev27.join("nvptx_vector_add.blob")), "not TVM 0.27's nvptx blob");
    assert_empty(tmp.path());
}

#[test]
fn the_c_backend_compiles_for_the_target_or_says_why_not() {
    // GNU's short triple and Rust's: the cross compiler is used when there is one; the host's
    // compiler (here forced through CC) is never taken for it.
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // TVM 0.19's AArch64 objects (the host objects' machine must be the target's).
    let cross = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cross-aarch64");
    let (from, host) = (cross.join("graph_add.devc.o"), cross.join("graph_add.lib0.o"));
    let tar = dir.path().join("a64.tar");
    for target in ["aarch64-linux-gnu", "aarch64-unknown-linux-gnu"] {
        for cc in [None, Some("cc")] {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_mblob"));
            cmd.args(["pack", "--from", s(&from), "--host", s(&host), "-o", s(&tar), "--target", target])
                .args(["--backend", "c", "-q"])
                .env("TMPDIR", tmp.path())
                .env_remove("CC");
            if let Some(cc) = cc {
                cmd.env("CC", cc);
            }
            let out = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                // A cross compiler is installed: the blob object is AArch64's.
                assert!(cc.is_none(), "{target}: the host's cc made the object");
                let x = Command::new("tar").arg("xf").arg(&tar).arg("devc.o").current_dir(dir.path()).status();
                assert!(x.unwrap().success());
                let o = read(&dir.path().join("devc.o"));
                assert_eq!(&o[18..20], &183u16.to_le_bytes(), "{target}: e_machine is not EM_AARCH64");
            } else if cc.is_some() {
                assert!(err.contains("compiled for X86_64 by `cc`, but the target is aarch64"), "{target}: {err}");
            } else {
                assert!(err.contains("cannot run `aarch64-linux-gnu-gcc`"), "{target}: {err}");
            }
            assert!(out.status.success() || !tar.exists(), "{target}");
            assert_empty(tmp.path());
        }
    }
}

/// An export of a tree with a C source: the C source can be made to fail.
fn c_tree(dir: &Path, c_source: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("host.c"), c_source).unwrap();
    std::fs::write(dir.join("payload.bin"), b"opaque bytes").unwrap();
    let tree = serde_json::json!({
        "type_key": "llvm", "sources": ["host.c"],
        "imports": [{"type_key": "example.Opaque", "payload": "payload.bin"}]
    });
    let json = dir.join("tree.json");
    std::fs::write(&json, tree.to_string()).unwrap();
    json
}

#[test]
fn failures_name_the_step_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let so = dir.path().join("out.so");

    // A bad C source: the compile step, with its command.
    let json = c_tree(dir.path(), "int broken( {");
    let out = mblob(&["export", s(&json), "-o", s(&so)], tmp.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("compile") && err.contains("host.c") && err.contains(" -c "), "{err}");
    assert!(!so.exists());
    assert_empty(tmp.path());

    // A missing object.
    let json = c_tree(dir.path(), "int ok(void) { return 1; }");
    let missing = serde_json::json!({"type_key": "llvm", "objects": ["nope.o"], "imports": [{"type_key": "x.Opaque", "payload": "payload.bin"}]});
    let json2 = dir.path().join("missing.json");
    std::fs::write(&json2, missing.to_string()).unwrap();
    let err = String::from_utf8_lossy(&mblob(&["export", s(&json2), "-o", s(&so)], tmp.path()).stderr).into_owned();
    assert!(err.contains("nope.o") && err.contains("cannot read host object"), "{err}");
    assert!(!so.exists());
    assert_empty(tmp.path());

    // A link failure (an undefined option), with the link command.
    let out = mblob(&["export", s(&json), "-o", s(&so), "--link-arg", "-Wl,--no-such-flag"], tmp.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("link failed") && err.contains("-shared") && err.contains("--no-such-flag"), "{err}");
    assert!(!so.exists());
    assert_empty(tmp.path());
    let partials: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.contains("partial").then_some(n)
        })
        .collect();
    assert!(partials.is_empty(), "{partials:?}");

    // An output directory that does not exist, or that cannot be written in (a regular file
    // stands where the directory should: as root, permissions would not stop the write).
    std::fs::write(dir.path().join("a-file"), b"").unwrap();
    for (output, why) in [("no/such/dir/out.so", "No such file"), ("a-file/out.so", "Not a directory")] {
        let out = mblob(&["export", s(&json), "-o", s(&dir.path().join(output))], tmp.path());
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        let parent = dir.path().join(output).parent().unwrap().display().to_string();
        assert!(err.contains(&parent) && err.contains("the output directory must exist and be writable"), "{err}");
        assert!(err.contains(why), "{err}");
        assert_empty(tmp.path());
    }
    assert!(!dir.path().join("no").exists());

    // The success path leaves only the output.
    let out = mblob(&["export", s(&json), "-o", s(&so)], tmp.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(so.exists());
    assert_empty(tmp.path());
}

#[test]
fn a_full_disk_is_an_error_not_a_partial_file() {
    // Simulated with a file-size limit: with SIGXFSZ ignored, every write past 256 KiB fails
    // with EFBIG, as on a full disk.
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.bin"), vec![7u8; 1 << 20]).unwrap();
    let tree = serde_json::json!({"type_key": "llvm", "imports": [{"type_key": "x.Big", "payload": "big.bin"}]});
    let json = dir.path().join("tree.json");
    std::fs::write(&json, tree.to_string()).unwrap();
    let so = dir.path().join("out.so");
    let backends: &[&str] = if cfg!(feature = "llvm") { &["llvm", "c"] } else { &["c"] };
    for &backend in backends {
        let script = format!(
            "trap '' XFSZ; ulimit -f 256; exec '{}' export '{}' -o '{}' --backend {backend}",
            env!("CARGO_BIN_EXE_mblob"),
            s(&json),
            s(&so)
        );
        let out = Command::new("sh").arg("-c").arg(&script).env("TMPDIR", tmp.path()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{backend}: {err}");
        // The blob is written first, so the pack step is where the limit is hit, on the file
        // it was writing.
        let file = if backend == "llvm" { "devc.o" } else { "devc.bin" };
        assert!(err.starts_with("mblob: pack failed: ") && err.contains(file), "{backend}: {err}");
        assert!(err.contains("file size limit") || err.contains("File too large"), "{backend}: {err}");
        assert!(!so.exists(), "{backend}");
        assert_empty(tmp.path());
        assert_only(dir.path(), &["big.bin", "tree.json"]);
    }
}

/// Asserts that `dir` holds exactly `names`.
fn assert_only(dir: &Path, names: &[&str]) {
    let mut left: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, names, "in {}", dir.display());
}

#[test]
fn a_killed_export_leaves_nothing_at_the_output_and_the_next_one_cleans_up() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.bin"), vec![3u8; 96 << 20]).unwrap();
    let tree = serde_json::json!({"type_key": "llvm", "imports": [{"type_key": "x.Big", "payload": "big.bin"}]});
    let json = dir.path().join("tree.json");
    std::fs::write(&json, tree.to_string()).unwrap();
    let so = dir.path().join("out.so");
    // header, count, `_lib`, `x.Big` and its payload, `_import_tree`, [0,1,1], [1]
    let whole = 8 + 8 + 12 + 13 + (96 << 20) + 20 + 32 + 16;
    let backends: &[&str] = if cfg!(feature = "llvm") { &["llvm", "c"] } else { &["c"] };
    // Killed as a stage begins (the debug log names each stage as it starts), and a while into
    // the stage, for every stage of each backend: serializing, packing (writing the blob; the
    // C route also compiles), and linking (the linker already running).
    let stages = [("serialize", 0), ("pack{", 0), ("pack{", 40), ("running", 0), ("running", 40)];
    for &backend in backends {
        for (marker, after_ms) in stages {
            let what = format!("{backend}, killed {after_ms} ms after `{marker}`");
            let mut child = Command::new(env!("CARGO_BIN_EXE_mblob"))
                .args(["export", s(&json), "-o", s(&so), "--backend", backend, "--linker", "default"])
                .env("TMPDIR", tmp.path())
                .env("MBLOB_LOG", "debug")
                .stderr(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
            let seen = lines.by_ref().map_while(Result::ok).any(|l| l.contains(marker));
            assert!(seen, "{what}: the stage never began");
            std::thread::sleep(Duration::from_millis(after_ms));
            let _ = child.kill();
            child.wait().unwrap();
            drop(lines);
            // Either nothing is at the output path, or (when the kill came after the final
            // rename) a whole library: never a partial one.
            if so.exists() {
                assert_eq!(blob_in(&so).len(), whole, "{what}");
                std::fs::remove_file(&so).unwrap();
            }
        }
    }
    // The next export removes what the killed ones left (their process ids are gone), in the
    // temporary directory and next to the output.
    let out = mblob(&["export", s(&json), "-o", s(&so), "-q"], tmp.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A compiler orphaned by a kill may still run for a moment; its own temporary files
    // (`ccXXXX.s`) go when it exits. Give it up to 10 s, then nothing may be left.
    for _ in 0..100 {
        let left = std::fs::read_dir(tmp.path()).unwrap().count();
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_empty(tmp.path());
    assert_only(dir.path(), &["big.bin", "out.so", "tree.json"]);
}

#[test]
fn the_demo_runs_in_every_layout() {
    let tmp = tempfile::tempdir().unwrap();
    // The host code is in the TVM convention of the layout: `inspect` (step 3) finds the
    // context slot of that generation, and the calls (step 5) are made in it.
    for (extra, slot) in [
        (&["--layout", "classic"][..], "context __tvm_module_ctx"),
        (&["--layout", "ffi", "--backend", "c"], "context __tvm_ffi__library_ctx"),
        (&["--layout", "classic-0.21", "--backend", "c-tvm"], "context __tvm_ffi_library_ctx"),
    ] {
        let mut args = vec!["demo"];
        args.extend_from_slice(extra);
        let out = mblob(&args, tmp.path());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{extra:?}: {}{}", text, String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("all checks passed") && text.contains("└── cuda"), "{text}");
        assert!(text.contains(slot) && text.contains("mblob_demo_dot(a) is refused"), "{extra:?}: {text}");
    }
}

#[cfg(not(feature = "llvm"))]
#[test]
fn without_llvm_the_llvm_backend_says_how_to_enable_it() {
    let tmp = tempfile::tempdir().unwrap();
    let g = goldens();
    let so = tmp.path().join("x.so");
    let out = mblob(
        &[
            "pack",
            "--from",
            s(&g.join("graph_dense_relu.so")),
            "--host",
            s(&g.join("graph_dense_relu.lib0.o")),
            "-o",
            s(&so),
            "--backend",
            "llvm",
        ],
        tmp.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("feature `llvm`") && err.contains("--features llvm"), "{err}");
    assert!(!so.exists());
}

/// The command line is the binary's: the library without default features compiles none of
/// its crates (a build system that depends on `mblob` gets no clap or tracing-subscriber).
#[test]
fn the_library_alone_has_no_command_line_dependencies() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", "mblob", "--no-default-features", "-e", "normal", "--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8(out.stdout).unwrap();
    let names: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(names.contains(&"mblob-runtime") && names.contains(&"serde_json"), "{tree}");
    for cli_only in ["clap", "clap_builder", "tracing-subscriber"] {
        assert!(!names.contains(&cli_only), "{cli_only} in the library's tree:\n{tree}");
    }
}

/// The files `mblob extract` writes for a TVM golden are TVM's own: the graph JSON, the params
/// as `save_param_dict` wrote them, the PTX the NVPTX backend made, and the payload bytes.
#[test]
fn extract_writes_the_parts_as_tvm_wrote_them() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let g = goldens();
    let out = dir.path().join("dense");
    let so = g.join("graph_dense_relu.so");
    let o = mblob(&["extract", s(&so), "-o", s(&out)], tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(read(&out.join("0.params")) == read(&g.join("graph_dense_relu.params")), "params differ from TVM's");
    assert!(read(&out.join("0.graph.json")) == read(&g.join("graph_dense_relu.graph.json")), "graph JSON differs");
    let golden = read(&g.join("graph_dense_relu.blob"));
    let parsed = format::parse_blob(&golden, Layout::Classic, &Registry::default(), UnknownKeys::Error).unwrap();
    assert!(read(&out.join("0.GraphExecutorFactory.bin")) == parsed.entries[0].payload);

    let dev27 = g.join("device/tvm-0.27.0.post1");
    let ptx = dir.path().join("ptx");
    let o = mblob(&["extract", s(&dev27.join("nvptx_vector_add.so")), "-o", s(&ptx), "-q"], tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout.is_empty());
    assert!(read(&ptx.join("1.cuda.ptx")) == read(&dev27.join("nvptx_vector_add.dev0.source.txt")), "not TVM's PTX");
    // The function table file is what inspect prints for the module.
    let table: serde_json::Value = serde_json::from_slice(&read(&ptx.join("1.functions.json"))).unwrap();
    let o = mblob(&["inspect", "--json", s(&dev27.join("nvptx_vector_add.so"))], tmp.path());
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["modules"][1]["functions"], table);
    assert_eq!(table["vector_add_kernel"]["name"], "vector_add_kernel");

    // An output directory that holds files is refused before anything is written; a plain
    // library has nothing to extract, and no directory appears.
    let before = std::fs::read_dir(&ptx).unwrap().count();
    let o = mblob(&["extract", s(&so), "-o", s(&ptx)], tmp.path());
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("exists and is not empty"));
    assert_eq!(std::fs::read_dir(&ptx).unwrap().count(), before);
    let none = dir.path().join("none");
    let o = mblob(&["extract", s(&g.join("dso_add_one.so")), "-o", s(&none)], tmp.path());
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("holds no blob"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!none.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert_empty(tmp.path());
}

/// The function tables of an `inspect --json` line, in the order printed.
#[derive(serde::Deserialize)]
struct InspectTables {
    modules: Vec<ModuleTable>,
}

#[derive(serde::Deserialize)]
struct ModuleTable {
    functions: Option<mblob::tree_json::FunctionTable>,
}

/// The function tables of a TREE.json, read in file order.
#[derive(serde::Deserialize)]
struct TreeTables {
    functions: Option<mblob::tree_json::FunctionTable>,
    #[serde(default)]
    imports: Vec<TreeTables>,
}

impl TreeTables {
    fn collect<'a>(&'a self, out: &mut Vec<&'a mblob::tree_json::FunctionTable>) {
        out.extend(&self.functions);
        self.imports.iter().for_each(|c| c.collect(out));
    }
}

/// inspect -> extract -> export gives back TVM's blob byte for byte, for every device golden
/// in the layout its TVM wrote (0.19 classic, 0.21 classic-0.21, 0.27 ffi); the function
/// tables in the tree are the ones `inspect --json` prints, in the same order.
#[test]
fn inspect_extract_export_gives_back_every_device_golden() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (sub, layout) in
        [("device", "classic"), ("device/tvm-0.21.0", "classic-0.21"), ("device/tvm-0.27.0.post1", "ffi")]
    {
        let gdir = goldens().join(sub);
        let manifest: serde_json::Value = serde_json::from_slice(&read(&gdir.join("manifest.json"))).unwrap();
        for g in manifest["goldens"].as_array().unwrap() {
            let name = g["name"].as_str().unwrap();
            let what = format!("{sub}/{name}");
            let so = gdir.join(format!("{name}.so"));
            let out = dir.path().join(format!("{layout}.{name}"));
            let o = mblob(&["extract", s(&so), "-o", s(&out), "-q"], tmp.path());
            assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
            let tree_path = out.join("tree.json");
            let text = String::from_utf8(read(&tree_path)).unwrap();

            // The tables in tree.json are inspect's, in inspect's order.
            let o = mblob(&["inspect", "--json", s(&so)], tmp.path());
            let printed: InspectTables = serde_json::from_slice(&o.stdout).unwrap();
            let tables: Vec<_> = printed.modules.into_iter().filter_map(|m| m.functions).collect();
            assert!(!tables.is_empty(), "{what}");
            let in_tree: TreeTables = serde_json::from_str(&text).unwrap();
            let mut found = Vec::new();
            in_tree.collect(&mut found);
            assert_eq!(found.len(), tables.len(), "{what}");
            for t in &tables {
                assert!(found.contains(&t), "{what}: tree.json lacks inspect's table {t:?}\nin\n{text}");
            }

            // The host objects go into the `_lib` part (edited as text: serde_json's maps would
            // sort the kernels, and their order is part of the blob).
            let lib0 = serde_json::json!([gdir.join(format!("{name}.lib0.o"))]).to_string();
            assert_eq!(text.matches("\"objects\": []").count(), 1, "{what}: {text}");
            std::fs::write(&tree_path, text.replace("\"objects\": []", &format!("\"objects\": {lib0}"))).unwrap();
            let back = dir.path().join(format!("{layout}.{name}.so"));
            let o = mblob(&["export", s(&tree_path), "-o", s(&back), "--layout", layout, "-q"], tmp.path());
            assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
            assert!(
                blob_in(&back) == read(&gdir.join(format!("{name}.blob"))),
                "{what}: not TVM's blob after the round trip"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 17);
    assert_empty(tmp.path());
}

/// Every command follows one exit-status convention (0 success, 1 failure, 2 usage), and
/// `--help` and README document it with every environment variable the code reads.
#[test]
fn exit_statuses_and_environment_are_one_documented_convention() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.so");
    let out = dir.path().join("out.so");
    let x = dir.path().join("x");
    let usage: [&[&str]; 4] =
        [&["inspect"], &["export", "--bogus"], &["no-such-command"], &["pack", "--layout", "classic-0.99"]];
    for args in usage {
        assert_eq!(mblob(args, tmp.path()).status.code(), Some(2), "{args:?}");
    }
    let failures: [&[&str]; 4] = [
        &["inspect", s(&missing)],
        &["export", s(&missing), "-o", s(&out)],
        &["pack", "--from", s(&missing), "-o", s(&out)],
        &["extract", s(&missing), "-o", s(&x)],
    ];
    for args in failures {
        let o = mblob(args, tmp.path());
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("missing.so"), "{args:?}");
    }
    for ok in [&["--help"][..], &["--version"], &["inspect", "--help"], &["extract", "--help"]] {
        assert_eq!(mblob(ok, tmp.path()).status.code(), Some(0), "{ok:?}");
    }
    // `run --help` documents its exit statuses and the variables it reads, as `pack` does.
    let run_help = String::from_utf8(mblob(&["run", "--help"], tmp.path()).stdout).unwrap();
    for want in ["Exit status", "usage error", "MBLOB_NUM_THREADS", "TVM_NUM_THREADS", "MBLOB_LOG"] {
        assert!(run_help.contains(want), "{want} missing from run --help:\n{run_help}");
    }

    // The variables the code reads, found in the sources.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut vars = vec!["CFLAGS".to_owned(), "CXX".into(), "TMPDIR".into(), "RUST_LOG".into()];
    for src in [root.join("src"), root.join("runtime/src")] {
        let mut stack = vec![src];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = String::from_utf8(read(&p)).unwrap();
                    for call in ["var_os(\"", "var(\"", "from_env(\""] {
                        for part in text.split(call).skip(1) {
                            vars.push(part.split('"').next().unwrap().to_owned());
                        }
                    }
                }
            }
        }
    }
    assert!(vars.iter().any(|v| v == "MBLOB_LOG") && vars.iter().any(|v| v == "CC"), "{vars:?}");
    let help = String::from_utf8(mblob(&["--help"], tmp.path()).stdout).unwrap();
    let readme = String::from_utf8(read(&root.join("README.md"))).unwrap();
    for doc in [&help, &readme] {
        assert!(doc.contains("Exit status") && doc.contains("usage error"), "{doc}");
        for v in &vars {
            assert!(doc.contains(&format!("{v} ")) || doc.contains(&format!("`{v}`")), "{v} undocumented in\n{doc}");
        }
    }
}

/// Every file TREE.json names is checked before any work: a missing data file is named once,
/// as the user wrote it and as it resolved, with nothing compiled; a mistyped DSO kind says
/// which kinds there are.
#[test]
fn export_checks_the_tree_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.c"), "int f(void) { return 1; }\n").unwrap();
    let tree = serde_json::json!({
        "type_key": "llvm", "sources": ["host.c"],
        "imports": [{"type_key": "cuda", "format": "ptx", "data": "kernels/missing.ptx", "functions": {}}]
    });
    let json = dir.path().join("tree.json");
    std::fs::write(&json, tree.to_string()).unwrap();
    let so = dir.path().join("out.so");
    let out = mblob(&["export", s(&json), "-o", s(&so), "--linker", "default"], tmp.path());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let resolved = dir.path().join("kernels/missing.ptx").display().to_string();
    assert!(
        err.contains(&format!(
            "tree.json at $.imports[0].data: cannot read device code `kernels/missing.ptx` ({resolved}): No such file"
        )),
        "{err}"
    );
    assert_eq!(err.matches("missing.ptx").count(), 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!so.exists());
    assert_empty(tmp.path());

    std::fs::write(&json, r#"{"type_key": "LLVM", "sources": ["host.c"]}"#).unwrap();
    let out = mblob(&["export", s(&json), "-o", s(&so)], tmp.path());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown type_key `LLVM`") && err.contains("did you mean `llvm`?"), "{err}");
    assert!(!err.contains("unknown field"), "{err}");
    assert_empty(tmp.path());
}

fn mblob_env(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mblob"));
    c.args(args).env_remove("MBLOB_NUM_THREADS").env_remove("TVM_NUM_THREADS");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run mblob")
}

fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
    args.iter().map(Into::into).collect()
}

/// The data of a `.npy` file TVM (numpy) or mblob wrote, without its header (the headers'
/// padding may differ).
fn npy_data(path: &Path, len: usize) -> Vec<u8> {
    let bytes = read(path);
    bytes[bytes.len() - len..].to_vec()
}

/// `mblob run`'s usage errors exit 2 before anything runs, as `--help` documents: a bare
/// `--input FILE` for a graph or AOT model, `--output` without `--function` or malformed,
/// `--threads 0`, a malformed MBLOB_NUM_THREADS / TVM_NUM_THREADS. A non-UTF-8 path in
/// `--input NAME=FILE` is a path like any other.
#[test]
fn run_usage_errors_exit_2_and_any_path_is_accepted() {
    let run = goldens().join("run");
    let dir = tempfile::tempdir().unwrap();
    let x = format!("x={}", s(&run.join("graph_mlp.in.x.npy")));
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: Vec<(Vec<&str>, &str, Env)> = vec![
        (vec!["graph_mlp.so", "-i", "graph_mlp.in.x.npy"], "takes its inputs by name", &[]),
        (vec!["aot_mlp.so", "-i", "aot_mlp.in.x.npy"], "takes its inputs by name", &[]),
        (vec!["graph_mlp.so", "-i", "X", "--output", "B=float32[4]"], "--function", &[]),
        (vec!["../dso_add_one.so", "--function", "add_one", "--output", "B=f32"], "expected NAME=DTYPE[SHAPE]", &[]),
        (
            vec!["graph_mlp.so", "-i", "X", "--threads", "0"],
            "--threads <N>': expected a number of threads, at least 1",
            &[],
        ),
        (vec!["graph_mlp.so", "-i", "X"], "MBLOB_NUM_THREADS=\"abc\"", &[("MBLOB_NUM_THREADS", "abc")]),
        (vec!["graph_mlp.so", "-i", "X"], "MBLOB_NUM_THREADS=\"0\"", &[("MBLOB_NUM_THREADS", "0")]),
        (vec!["graph_mlp.so", "-i", "X"], "TVM_NUM_THREADS=\"-1\"", &[("TVM_NUM_THREADS", "-1")]),
    ];
    for (args, want, env) in cases {
        let out = dir.path().join("out");
        let mut full: Vec<std::ffi::OsString> = vec!["run".into()];
        for (i, a) in args.iter().enumerate() {
            full.push(match *a {
                "X" => x.clone().into(),
                a if i == 0 || a.ends_with(".npy") => run.join(a).into(),
                a => a.into(),
            });
        }
        full.extend(os(&["-o", s(&out)]));
        let full: Vec<&std::ffi::OsStr> = full.iter().map(|a| a.as_os_str()).collect();
        let o = mblob_env(&full, env);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
        assert!(o.stdout.is_empty() && !out.exists(), "{args:?}: nothing runs");
    }
    // What is accepted: a thread count of at least 1, from --threads or the environment.
    use std::os::unix::ffi::OsStrExt;
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"x-\xff.npy"));
    std::fs::copy(run.join("graph_mlp.in.x.npy"), &odd).unwrap();
    let mut spec = std::ffi::OsString::from("x=");
    spec.push(&odd);
    let out = dir.path().join("odd");
    let o = mblob_env(
        &["run".as_ref(), run.join("graph_mlp.so").as_os_str(), "-i".as_ref(), &spec, "-o".as_ref(), out.as_os_str()],
        &[("MBLOB_NUM_THREADS", "2")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(npy_data(&out.join("out.0.npy"), 80), npy_data(&run.join("graph_mlp.out.0.npy"), 80));
}

/// A directory where a file is expected is named as one, wherever a file is read.
#[test]
fn a_directory_given_as_a_file_is_said_to_be_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("adir");
    std::fs::create_dir(&d).unwrap();
    let g = goldens();
    let mlp = g.join("run/graph_mlp.so");
    let out = dir.path().join("out");
    let so = dir.path().join("out.so");
    let input = format!("x={}", s(&d));
    let dense = g.join("graph_dense_relu.so");
    let cases: [&[&str]; 7] = [
        &["inspect", s(&d)],
        &["extract", s(&d), "-o", s(&out)],
        &["run", s(&d)],
        &["run", s(&mlp), "--input", &input],
        &["pack", "--from", s(&d), "--blob-only", "-o", s(&so)],
        &["pack", "--from", s(&dense), "--host", s(&d), "-o", s(&so)],
        &["export", s(&d), "-o", s(&so)],
    ];
    for args in cases {
        let o = mblob(args, tmp.path());
        let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("adir") && err.contains("is a directory"), "{args:?}: {err}");
        assert!(!err.contains("no such device"), "{args:?}: {err}");
        assert!(!out.exists() && !so.exists(), "{args:?}");
    }
    assert_empty(tmp.path());
}

/// `run -o DIR`: a DIR that cannot hold the outputs is refused before the model runs; an
/// earlier run's outputs are replaced as a set (those beyond this run's count go too); a DIR
/// with other files is refused (the outputs replace it as a whole: tests/all/outputs.rs).
/// `extract -o a/b` creates `a`.
#[test]
fn output_directories_are_checked_first_and_hold_only_this_runs_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = goldens().join("run");
    let (so, x) = (run.join("graph_mlp.so"), format!("x={}", s(&run.join("graph_mlp.in.x.npy"))));
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let o = mblob(&["run", s(&so), "-i", &x, "-o", s(&file)], tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("a-file") && err.to_lowercase().contains("not a directory"), "{err}");
    assert!(o.stdout.is_empty(), "the model ran: {}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(read(&file), b"not a directory");

    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for stale in ["out.1.npy", "out.7.npy"] {
        std::fs::write(out.join(stale), b"an earlier run's").unwrap();
    }
    let o = mblob(&["run", s(&so), "-i", &x, "-o", s(&out)], tmp.path());
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let mut left: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["out.0.npy"]);
    assert_eq!(npy_data(&out.join("out.0.npy"), 80), npy_data(&run.join("graph_mlp.out.0.npy"), 80));
    for other in ["out.01.npy", "notes.txt", "out.x.npy"] {
        std::fs::write(out.join(other), b"kept").unwrap();
        let o = mblob(&["run", s(&so), "-i", &x, "-o", s(&out)], tmp.path());
        assert_eq!(o.status.code(), Some(1), "{other}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(other), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(read(&out.join(other)), b"kept");
        std::fs::remove_file(out.join(other)).unwrap();
    }

    let nested = dir.path().join("a/b");
    let o = mblob(&["extract", s(&goldens().join("graph_dense_relu.so")), "-o", s(&nested), "-q"], tmp.path());
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(nested.join("tree.json").is_file());
    assert_empty(tmp.path());
}

/// inspect lists as functions only what TVM calls: in TVM 0.19's library with a `ccompiler`
/// BYOC part, the entry points TVM's modules implement, and the C++ helpers apart.
#[test]
fn inspect_lists_only_tvm_entry_points_as_functions() {
    let tmp = tempfile::tempdir().unwrap();
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/byoc-helpers");
    let want: serde_json::Value = serde_json::from_slice(&read(&fx.join("expected.json"))).unwrap();
    let strings = |v: &serde_json::Value| -> Vec<String> {
        let mut v: Vec<String> = v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect();
        v.sort();
        v
    };
    let entry = strings(&want["entry_points"]);
    let other: Vec<String> = strings(&want["exported_functions"]).into_iter().filter(|f| !entry.contains(f)).collect();
    assert!(!other.is_empty(), "the fixture has helpers");
    let o = mblob(&["inspect", "--json", s(&fx.join("byoc_ccompiler.so"))], tmp.path());
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let host = &report["host"];
    assert_eq!(host["convention"], "classic-packed");
    let mut functions: Vec<String> =
        host["functions"].as_array().unwrap().iter().map(|f| f["symbol"].as_str().unwrap().to_owned()).collect();
    functions.sort();
    assert_eq!(functions, entry);
    assert_eq!(strings(&want["graph_func_names"]), entry, "the graph calls them all");
    assert_eq!(strings(&host["other_functions"]), other);
    let text = String::from_utf8(mblob(&["inspect", s(&fx.join("byoc_ccompiler.so"))], tmp.path()).stdout).unwrap();
    for f in &other {
        assert!(!text.contains(&format!("function {f}")), "{f} labelled a function:\n{text}");
    }
}

/// The scripts of ci/ and benches/ find what cargo built wherever CARGO_TARGET_DIR puts it (no
/// `target/` path written in them), `ci/target-dir.sh` says where that is, and ci/setup.sh
/// installs what `maturin build` needs (patchelf), as README's wheel recipe says.
#[test]
fn scripts_follow_the_target_directory_and_set_up_wheel_builds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for d in ["ci", "benches"] {
        for e in std::fs::read_dir(root.join(d)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "sh") {
                let text = String::from_utf8(read(&p)).unwrap();
                for bad in ["target/release", "target/debug", "target/python"] {
                    assert!(!text.contains(bad), "{} names {bad}", p.display());
                }
            }
        }
    }
    let elsewhere = tempfile::tempdir().unwrap();
    let o = Command::new("bash")
        .arg(root.join("ci/target-dir.sh"))
        .env("CARGO_TARGET_DIR", elsewhere.path())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        s(elsewhere.path()),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let setup = String::from_utf8(read(&root.join("ci/setup.sh"))).unwrap();
    assert!(setup.contains(" patchelf "), "ci/setup.sh installs patchelf");
    let readme = String::from_utf8(read(&root.join("README.md"))).unwrap();
    assert!(readme.contains("maturin build --release -m python/Cargo.toml"));
}
