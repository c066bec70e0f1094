#!/usr/bin/env python3
"""Import circles among the source files of the crates (runtime/src, src, capi/src, python/src).

Each file is a node (a `mod.rs` or folder module counts as its own node). An edge A -> B means
that the code of A names an item of B: a `use` path or a `crate::`/`super::`/`self::` path in
the code, resolved to the file that defines the module it names, following `pub use`
re-exports to the file that defines the item. Not edges: `mod` declarations, a re-export line
itself (`pub use x::Y` is an alias, not a use, unless the file's own code names `Y` too), code
in comments and strings, and unit tests (`#[cfg(test)] mod ... { }`), which may use the whole
crate. Every strongly connected component of more than one file is reported with the edges
inside it; the exit status is 1 when there is one.

Usage: ci/import_cycles.py [--quiet]   (from the repository root)
"""

import os
import re
import sys
from collections import defaultdict

CRATES = [
    ("runtime/src", ["lib.rs"]),
    ("src", ["lib.rs", "main.rs"]),
    ("capi/src", ["lib.rs"]),
    ("python/src", ["lib.rs"]),
]

WORD = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """The text with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime.
            m = re.match(r"'(\\[^']{1,10}|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def strip_test_modules(code):
    """Blanks `#[cfg(test)] mod name { ... }` blocks."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+" + WORD + r"\s*\{", code)
        if not m:
            return code
        end = matching_brace(code, m.end() - 1)
        code = code[: m.start()] + re.sub(r"[^\n]", " ", code[m.start() : end + 1]) + code[end + 1 :]


def inline_modules(code):
    """(start, end, name) of each inline `mod name { ... }` block."""
    out = []
    for m in re.finditer(r"\bmod\s+(" + WORD + r")\s*\{", code):
        out.append((m.start(), matching_brace(code, m.end() - 1), m.group(1)))
    return out


def modpath_at(modpath, inline, pos):
    """The module at offset `pos` of a file of module `modpath`, inside its inline modules."""
    names = [name for start, end, name in sorted(inline) if start <= pos <= end]
    return tuple(modpath) + tuple(names)


def split_top(s, sep=","):
    parts, depth, cur = [], 0, ""
    for c in s:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    if cur.strip():
        parts.append(cur)
    return parts


def expand_use_tree(tree, prefix=()):
    """Paths (tuples of segments) and the name each binds, of a `use` tree."""
    tree = tree.strip()
    if not tree:
        return []
    if tree.startswith("::"):
        tree = tree[2:]
    # `a::b::{c, d::e}`: find a top-level `{`.
    depth = 0
    for i, c in enumerate(tree):
        if c == "{" and depth == 0:
            head = tree[:i].rstrip(":").strip()
            inner = tree[i + 1 : tree.rfind("}")]
            segs = tuple(s for s in head.split("::") if s) if head else ()
            out = []
            for part in split_top(inner):
                out += expand_use_tree(part, prefix + segs)
            return out
        if c == "{":
            depth += 1
    m = re.match(r"(.*?)\s+as\s+(" + WORD + r")$", tree)
    alias = None
    if m:
        tree, alias = m.group(1).strip(), m.group(2)
    segs = tuple(s.strip() for s in tree.split("::") if s.strip())
    if segs and segs[-1] == "self":
        segs = segs[:-1]
        path = prefix + segs
        return [(path, alias or (path[-1] if path else None))]
    path = prefix + segs
    if not path:
        return []
    return [(path, alias or (path[-1] if path[-1] != "*" else None))]


class Crate:
    def __init__(self, src_dir, roots):
        self.src = src_dir
        self.module_file = {}  # module path (tuple) -> file
        self.file_module = {}  # file -> module path
        self.children = defaultdict(set)  # module path -> child module names
        self.macros = {}  # #[macro_export] macro name -> file (they live at the crate root)
        self.defined = {}  # file -> names of the items it defines
        self.public = {}  # file -> names of the `pub` items it defines (what a glob re-exports)
        for root in roots:
            path = os.path.join(src_dir, root)
            if os.path.exists(path):
                self.walk((), path, os.path.dirname(path), top=True)

    def walk(self, modpath, file, dir_of_children, top=False):
        if file in self.file_module:
            return
        self.module_file.setdefault(modpath, file)
        self.file_module[file] = modpath
        code = strip_comments_and_strings(open(file, encoding="utf-8").read())
        for m in re.finditer(r"#\[macro_export\]\s*macro_rules!\s*(" + WORD + r")", code):
            self.macros[m.group(1)] = file
        # Items at the top of the file (methods in `impl` blocks are not named by paths).
        top_item = r"(?m)^(pub(?:\([^)]*\))?\s+)?(?:(?:unsafe|extern|const|async)\s+)*"
        top_item += r"(?:fn|struct|enum|const|static|type|trait|union)\s+(" + WORD + r")"
        found = re.findall(top_item, strip_test_modules(code))
        self.defined[file] = {name for _, name in found}
        self.public[file] = {name for vis, name in found if vis.strip() == "pub"}
        for m in re.finditer(r"(?m)^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + WORD + r")\s*;", code):
            name = m.group(1)
            self.children[modpath].add(name)
            for cand in (os.path.join(dir_of_children, name + ".rs"), os.path.join(dir_of_children, name, "mod.rs")):
                if os.path.exists(cand):
                    sub_dir = os.path.join(dir_of_children, name)
                    self.walk(modpath + (name,), cand, sub_dir)
                    break

    def resolve(self, path, depth=0):
        """The file that defines the item at absolute module path `path` (following
        re-exports), or None."""
        if depth > 20:
            return None
        # Longest prefix that is a module.
        for k in range(len(path), -1, -1):
            if path[:k] in self.module_file:
                break
        else:
            return None
        module = path[:k]
        if k == len(path):
            return self.module_file[module]
        item = path[k]
        if k == 0 and item in self.macros:
            return self.macros[item]
        target = self.reexports.get(module, {}).get(item)
        if target is not None:
            return self.resolve(target + path[k + 1 :], depth + 1) or self.module_file[module]
        # A glob re-export (`pub use x::*`) that has the item.
        for glob in self.globs.get(module, []):
            got = self.resolve(glob + path[k:], depth + 1)
            if got is not None and got != self.module_file.get(glob):
                return got
        return self.module_file[module]

    def absolute(self, modpath, segs):
        """`segs` (a path as written in module `modpath`) as an absolute module path, or None
        for a path outside the crate."""
        segs = list(segs)
        if not segs:
            return None
        if segs[0] == "crate":
            return tuple(segs[1:])
        base = list(modpath)
        if segs[0] in ("self", "super"):
            while segs and segs[0] in ("self", "super"):
                if segs[0] == "super":
                    if not base:
                        return None
                    base.pop()
                segs.pop(0)
            return tuple(base + segs)
        if segs[0] in self.children[modpath]:
            return tuple(base + segs)
        return None


def known_lines():
    """The lines of ci/checks-known.txt: the violations recorded there, each to be fixed."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checks-known.txt")
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def main():
    quiet = "--quiet" in sys.argv
    nodes, edges = set(), defaultdict(set)
    why = {}
    for src, roots in CRATES:
        if not os.path.isdir(src):
            continue
        crate = Crate(src, roots)
        crate.reexports = defaultdict(dict)
        crate.globs = defaultdict(list)
        parsed = {}
        for file, modpath in crate.file_module.items():
            code = strip_test_modules(strip_comments_and_strings(open(file, encoding="utf-8").read()))
            uses = []
            inline = inline_modules(code)
            for m in re.finditer(r"(?s)(^|[;{}\n])\s*(?:#\[[^\]]*\]\s*)*(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);", code):
                public = bool(m.group(2)) and not m.group(2).startswith("pub(self)")
                here = modpath_at(modpath, inline, m.start(3))
                for segs, name in expand_use_tree(m.group(3)):
                    uses.append((public, segs, name, m.start(3), m.end(3), here))
            parsed[file] = (modpath, code, uses, inline)
            # Every import binds a name in its module that its submodules can name too (a
            # private one as well): resolution follows them.
            for public, segs, name, _, _, here in uses:
                absolute = crate.absolute(here, segs)
                if absolute is None:
                    continue
                if segs[-1] == "*":
                    crate.globs[here].append(absolute[:-1])
                elif name:
                    crate.reexports[here][name] = absolute
        for file, (modpath, code, uses, inline) in parsed.items():
            nodes.add(file)
            spans = [(start, end) for _, _, _, start, end, _ in uses]
            # The file's code without its `use` and `mod` lines: what names a re-export.
            rest = code
            for start, end in spans:
                rest = rest[:start] + " " * (end - start) + rest[end:]
            rest = re.sub(r"\b(pub(\([^)]*\))?\s+)?(use|mod)\b[^;{]*;", " ", rest)
            for public, segs, name, start, end, here in uses:
                glob = segs[-1] == "*"
                absolute = crate.absolute(here, [s for s in segs if s != "*"])
                if absolute is None:
                    continue
                target = crate.resolve(absolute)
                if public and glob:
                    # A glob re-export: an edge only if the file's own code names one of the
                    # items of the module it re-exports.
                    names = crate.public.get(target, set()) - crate.defined.get(file, set())
                    if not any(re.search(r"\b" + re.escape(n) + r"\b", rest) for n in names):
                        continue
                elif public and name:
                    # A re-export: an edge only if the file's own code names it too.
                    if not re.search(r"\b" + re.escape(name) + r"\b", rest):
                        continue
                if target and target != file:
                    edges[file].add(target)
                    why.setdefault((file, target), "use " + "::".join(segs))
            # Paths in the code outside `use` lines.
            masked = code
            for start, end in spans:
                masked = masked[:start] + " " * (end - start) + masked[end:]
            for m in re.finditer(r"\b(?:crate|super|self)(?:::(?:super|" + WORD + r"))+", masked):
                segs = m.group(0).split("::")
                absolute = crate.absolute(modpath_at(modpath, inline, m.start()), segs)
                if absolute is None:
                    continue
                target = crate.resolve(absolute)
                if target and target != file:
                    edges[file].add(target)
                    why.setdefault((file, target), m.group(0))

    # Tarjan's strongly connected components.
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]

    def strong(v):
        work = [(v, iter(sorted(edges[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    # Circles the known list (ci/checks-known.txt) records, being taken apart: reported, not
    # failed. A circle is known when all its files lie in one known circle's files.
    known = [set(line.split()[1:]) for line in known_lines() if line.startswith("cycle ")]
    old = [c for c in comps if any(set(c) <= k for k in known)]
    comps = [c for c in comps if c not in old]
    for comp in sorted(old):
        print(f"import circle (known, in ci/checks-known.txt): {', '.join(comp)}")
    if not comps:
        if not quiet:
            print(f"import circles: none new among {len(nodes)} files")
        return 0
    print(f"import circles: {len(comps)} new among {len(nodes)} files")
    for comp in sorted(comps):
        members = set(comp)
        print(f"- {len(comp)} files: {', '.join(comp)}")
        for a in comp:
            for b in sorted(edges[a] & members):
                print(f"    {a} -> {b}   ({why[(a, b)]})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
