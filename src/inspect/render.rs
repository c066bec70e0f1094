//! The text form of a [`Report`].

use mblob_runtime::TreeShape;

use super::report::{AotReport, FileKind, LoadedNode, ModuleReport, RelaxReport, Report, TreeNode};

/// The text form of a report.
pub fn render_text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "{}", r.file);
    if let Some(tar) = &r.tar {
        let _ = writeln!(s, "  tar      {} members", tar.members.len());
        for m in &tar.members {
            let mark = if tar.blob_member.as_deref() == Some(m.name.as_str()) { "  (holds the blob)" } else { "" };
            let _ = writeln!(s, "           {} ({} bytes){mark}", m.name, m.bytes);
        }
        for u in &tar.unread {
            let _ = writeln!(s, "           not read: {}: {}", u.name, u.reason);
        }
    }
    if let Some(c) = &r.container {
        let member = c.member.as_deref().map(|m| format!(", member {m}")).unwrap_or_default();
        let runs = if c.runs_here { "" } else { " (cannot be loaded or run on this machine)" };
        let _ = writeln!(s, "  container {} for {}{member}{runs}", c.format, c.machine);
    }
    if let Some(models) = &r.bundle {
        let _ = writeln!(s, "  bundle   {} models (inspect one with --prefix PREFIX)", models.len());
        for m in models {
            let sys = if m.system_lib { ", system-lib" } else { "" };
            let member = m.member.as_deref().unwrap_or("?");
            let _ = writeln!(s, "           {:<24} {} ({} layout{sys}, member {member})", m.prefix, m.symbol, m.layout);
        }
        return s;
    }
    match (&r.symbol, r.kind) {
        (Some(sym), _) => {
            let at = r.file_offset.map_or("rebuilt from the data segments".to_owned(), |o| format!("file offset {o}"));
            let _ = writeln!(s, "  symbol   {sym} (section {}, {at})", r.section.as_deref().unwrap_or("?"));
            if let Some(p) = r.prefix.as_deref().filter(|p| !p.is_empty()) {
                let _ = writeln!(s, "  prefix   {p}");
            }
            if r.system_lib == Some(true) {
                let _ = writeln!(s, "  system-lib (registers the blob with TVM's system library at start-up)");
            }
        }
        (
            None,
            FileKind::Elf | FileKind::Macho | FileKind::Pe | FileKind::Coff | FileKind::Wasm | FileKind::Archive,
        ) => {
            let _ = writeln!(s, "  symbol   none: a plain library (loads as one `library` module)");
        }
        (None, FileKind::Tar) => {
            let _ = writeln!(s, "  symbol   none: no member holds a blob");
        }
        (None, FileKind::Blob) => {
            let _ = writeln!(s, "  symbol   none: raw blob file");
        }
    }
    if let Some(layout) = r.layout {
        let legacy = if r.legacy { " (legacy: no import tree)" } else { "" };
        let _ = writeln!(s, "  layout   {layout}{legacy}");
        let _ = writeln!(s, "  blob     {} bytes", r.blob_len.unwrap_or(0));
        let _ = writeln!(s, "  entries  (offsets from the first byte of the blob)");
        let width = r.type_keys.iter().map(|k| k.len()).max().unwrap_or(8).max(8);
        let _ = writeln!(s, "    {:>5}  {:<width$}  {:>12}  {:>10}", "index", "type_key", "payload", "offset");
        for (i, m) in r.modules.iter().enumerate() {
            let index = m.index.map_or("-".to_owned(), |i| i.to_string());
            let _ = writeln!(
                s,
                "    {:>5}  {:<width$}  {:>12}  {:>10}",
                index, m.type_key, m.payload_len, r.payload_offsets[i]
            );
            render_module(&mut s, m);
        }
        if let Some(tree) = &r.tree {
            let _ = writeln!(s, "  import tree");
            for line in tree_shape(tree).render().lines() {
                let _ = writeln!(s, "    {line}");
            }
        }
    }
    if let Some(host) = &r.host {
        let _ = writeln!(
            s,
            "  host     {}",
            host.generation.map_or("plain C functions (no TVM context symbols)", |g| g.convention_text())
        );
        if !host.context_symbols.is_empty() {
            let _ = writeln!(s, "           context {}", host.context_symbols.join(", "));
        }
        if !host.unsupported_imports.is_empty() {
            let _ = writeln!(
                s,
                "           warning: imports TVM runtime functions mblob does not provide: {} (mblob cannot load it)",
                host.unsupported_imports.join(", ")
            );
        }
        for f in &host.functions {
            if f.name == f.symbol {
                let _ = writeln!(s, "           function {}", f.name);
            } else {
                let _ = writeln!(s, "           function {} (symbol {})", f.name, f.symbol);
            }
        }
        if !host.other_functions.is_empty() {
            let _ = writeln!(
                s,
                "           other    {} (exported code, not TVM entry points)",
                host.other_functions.join(", ")
            );
        }
    }
    if let Some(loaded) = &r.loaded {
        let _ = writeln!(s, "  loaded tree");
        for line in loaded_shape(loaded).render().lines() {
            let _ = writeln!(s, "    {line}");
        }
    }
    s
}

fn render_module(s: &mut String, m: &ModuleReport) {
    use std::fmt::Write as _;
    const AT: &str = "           ";
    if let Some(e) = &m.error {
        let _ = writeln!(s, "{AT}error {e}");
    }
    if let Some(note) = &m.note {
        let _ = writeln!(s, "{AT}{note}");
    }
    if let Some(r) = &m.relax {
        let _ = writeln!(s, "{AT}Relax executable {}", r.version);
        for f in &r.functions {
            let _ = writeln!(s, "{AT}function {}({}) [{}]", f.name, f.params.join(", "), f.kind);
        }
        if !r.externs.is_empty() {
            let _ = writeln!(s, "{AT}calls {}", r.externs.join(", "));
        }
        render_relax_more(s, r);
    }
    if let Some(a) = &m.aot {
        render_aot(s, a);
    }
    if let Some(g) = &m.graph {
        let _ = writeln!(s, "{AT}module {} (graph JSON {} bytes)", g.module_name, g.graph_json_len);
        for t in &g.inputs {
            let _ = writeln!(s, "{AT}input {} {}{:?}", t.name, t.dtype, t.shape);
        }
        for (i, t) in g.outputs.iter().enumerate() {
            let _ = writeln!(s, "{AT}output {i} {}{:?} (from {})", t.dtype, t.shape, t.name);
        }
        if let Some(e) = &g.graph_error {
            let _ = writeln!(s, "{AT}inputs and outputs unknown: {e}");
        }
        for p in &g.params {
            let _ = writeln!(s, "{AT}param {} {}{:?} ({} bytes)", p.name, p.dtype, p.shape, p.bytes);
        }
    }
    if let Some(d) = &m.device {
        if !d.format.is_empty() {
            let _ = writeln!(s, "{AT}format {}", d.format);
        }
        for (name, f) in &d.functions.0 {
            let args: Vec<String> = f.arg_types.iter().map(|t| t.0.to_string()).collect();
            let _ = writeln!(s, "{AT}kernel {name}({}) launch [{}]", args.join(", "), f.launch_param_tags.join(", "));
        }
        for src in &d.smap {
            let _ = writeln!(s, "{AT}source {} ({} bytes)", src.name, src.bytes);
        }
        for sh in &d.shaders {
            let _ = writeln!(s, "{AT}shader {} ({} bytes of SPIR-V)", sh.name, sh.bytes);
        }
    }
}

/// A Relax executable's constants and the calls mblob cannot serve, for the text form.
fn render_relax_more(s: &mut String, r: &RelaxReport) {
    use std::fmt::Write as _;
    const AT: &str = "           ";
    let _ = writeln!(
        s,
        "{AT}constants {} in the pool, {} tensors ({} bytes; `mblob extract` writes them as a params file)",
        r.constant_pool_len,
        r.constants.len(),
        r.constants_bytes
    );
    for c in &r.constants {
        let _ = writeln!(s, "{AT}constant c[{}] {}{:?} ({} bytes)", c.index, c.dtype, c.shape, c.bytes);
    }
    for st in &r.strings {
        let _ = writeln!(s, "{AT}string c[{}] {}", st.index, abbreviate(&st.text));
    }
    render_calls(s, r);
    if let Some(calls) = r.unsupported_calls.as_ref().filter(|c| !c.is_empty()) {
        let _ = writeln!(
            s,
            "{AT}warning: mblob cannot serve {} (not a builtin of its VM, a global function of mblob, or a function of the library): a run that calls one fails",
            calls.join(", ")
        );
    }
}

/// An AOT factory, for the text form.
fn render_aot(s: &mut String, a: &AotReport) {
    use std::fmt::Write as _;
    const AT: &str = "           ";
    let _ = writeln!(s, "{AT}AOT module {}", a.module_name);
    for t in a.inputs.iter().flatten() {
        let _ = writeln!(s, "{AT}input {} {}{:?}", t.name, t.dtype, t.shape);
    }
    for (i, t) in a.outputs.iter().flatten().enumerate() {
        let _ = writeln!(s, "{AT}output {i} {}{:?} ({})", t.dtype, t.shape, t.name);
    }
    if let Some(e) = &a.io_error {
        let _ = writeln!(s, "{AT}inputs and outputs unknown: {e}");
    }
    for p in &a.params {
        let _ = writeln!(s, "{AT}param {} {}{:?} ({} bytes)", p.name, p.dtype, p.shape, p.bytes);
    }
}

fn tree_shape(n: &TreeNode) -> TreeShape {
    let type_key = match n.index {
        Some(i) => format!("[{i}] {}", n.type_key),
        None => n.type_key.clone(),
    };
    TreeShape { type_key, imports: n.imports.iter().map(tree_shape).collect() }
}

fn loaded_shape(n: &LoadedNode) -> TreeShape {
    TreeShape { type_key: n.type_key.clone(), imports: n.imports.iter().map(loaded_shape).collect() }
}

/// Longest string shown whole in the text form (`--json` gives every string whole).
const SHOWN: usize = 96;

/// A string as the text form shows it: on one line, cut after [`SHOWN`] characters.
fn abbreviate(text: &str) -> String {
    let one_line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let n = one_line.chars().count();
    if n <= SHOWN {
        format!("{one_line:?}")
    } else {
        let head: String = one_line.chars().take(SHOWN).collect();
        format!("{head:?}... ({n} characters; --json gives it whole)")
    }
}

/// The builtin calls with constant arguments, for the text form: one line per builtin, with
/// the arguments of its first call and how many calls there are (`--json` lists every call).
fn render_calls(s: &mut String, r: &super::report::RelaxReport) {
    use std::fmt::Write as _;
    const AT: &str = "           ";
    let mut seen: Vec<(&str, usize, String)> = Vec::new();
    for c in &r.calls {
        if let Some((_, n, _)) = seen.iter_mut().find(|(callee, _, _)| *callee == c.callee) {
            *n += 1;
            continue;
        }
        let args: Vec<String> = c
            .args
            .iter()
            .map(|a| match a {
                serde_json::Value::String(t)
                    if t.starts_with('%') || t.starts_with('@') || t.starts_with("tensor ") =>
                {
                    t.clone()
                }
                serde_json::Value::String(t) => abbreviate(t),
                v => v.to_string(),
            })
            .collect();
        seen.push((&c.callee, 1, format!("{}({}) in {}", c.callee, args.join(", "), c.function)));
    }
    for (_, n, line) in &seen {
        let more = if *n > 1 { format!(" (first of {n} calls)") } else { String::new() };
        let _ = writeln!(s, "{AT}call {line}{more}");
    }
}
