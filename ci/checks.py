#!/usr/bin/env python3
"""Structure checks of the sources (runtime/src, src, capi/src, python/src), each listing what
fails it; the exit status is 1 when one does.

- size: no source file over 1,000 lines.
- unsafe: `unsafe` (blocks, functions, impls) only in runtime/src/ffi, runtime/src/device and
  capi/src, in the single edge files of `UNSAFE_FILES` (python/src/dlpack.rs), and else only
  at the library-loading entry points (the trust boundary): the `ALLOWED` list below. Comments and strings do not count.
- cycles: no import circle among the files (ci/import_cycles.py).

Violations recorded in ci/checks-known.txt (files over the size, `unsafe` lines, circles) are
listed as known and do not fail the check: the list only shrinks; anything not on it fails.

Usage: ci/checks.py [size] [unsafe] [cycles]   (all three by default; from the repository root)
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from import_cycles import known_lines, strip_comments_and_strings  # noqa: E402

ROOTS = ["runtime/src", "src", "capi/src", "python/src"]
MAX_LINES = 1000

# Where `unsafe` belongs: the FFI edge, the device backends, the C API.
UNSAFE_FOLDERS = ["runtime/src/ffi/", "runtime/src/device/", "capi/src/"]

# Single files at an FFI edge outside those folders, where all of their crate's `unsafe` of
# one kind lives.
UNSAFE_FILES = [
    # The Python package's edge with memory Python owns or is handed: `Tensor.__dlpack__`
    # hands a tensor's memory to the consumer in a PyCapsule whose destructor and DLPack
    # deleter are C callbacks over raw pointers (PyO3 has no safe DLPack capsule: its own
    # capsules free their value on destruction, which a consumer that took the tensor must not
    # see), and `export` reads numpy's parameter arrays in place through their array interface
    # (PyO3's safe buffer API needs Python 3.11's stable ABI; the package targets 3.9).
    "python/src/dlpack.rs",
]

# The library-loading entry points outside those folders: (file, what the line must contain).
# A line that calls `load_library`/`load_library_bytes` is one anywhere.
ALLOWED = [
    # The loading entry points themselves: mapping the file, opening the library (which runs
    # its initialisers), and the functions that take the caller's trust for it.
    ("runtime/src/load.rs", "Mmap::map("),
    ("runtime/src/load.rs", "fn load_opened("),
    ("runtime/src/load.rs", "load_opened("),
    ("runtime/src/load.rs", "library::open("),
    # Calling a function of a loaded tree by name with owned tensors: the trust was taken at
    # `load_library`; `exec::call` is safe for its callers (the CLI, Python).
    ("runtime/src/exec/call.rs", "f.call(&values)"),
]
LOADING_CALL = re.compile(r"\bload_library(_bytes)?\s*\(")


def sources():
    for root in ROOTS:
        for dirpath, _, files in os.walk(root):
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(dirpath, f)


def check_size():
    over = []
    for path in sources():
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            over.append((n, path))
    known = {line.split()[1] for line in known_lines() if line.startswith("size ")}
    for n, path in sorted(over, reverse=True):
        if path in known:
            print(f"size (known, in ci/checks-known.txt): {path}: {n} lines")
    over = [(n, path) for n, path in over if path not in known]
    if over:
        print(f"size: {len(over)} source files over {MAX_LINES} lines:")
        for n, path in sorted(over, reverse=True):
            print(f"    {path}: {n}")
        return 1
    print(f"size: no source file over {MAX_LINES} lines but the known ones")
    return 0


def check_unsafe():
    known = set(known_lines())
    found = []
    for path in sources():
        if any(path.startswith(folder) for folder in UNSAFE_FOLDERS) or path in UNSAFE_FILES:
            continue
        with open(path, encoding="utf-8") as f:
            code = strip_comments_and_strings(f.read())
        for number, line in enumerate(code.split("\n"), 1):
            if not re.search(r"\bunsafe\b", line) or re.search(r"\b(allow|deny|forbid|warn)\(unsafe_code\)", line):
                continue
            if LOADING_CALL.search(line) or any(path == p and what in line for p, what in ALLOWED):
                continue
            if f"unsafe {path} {line.strip()}" in known:
                print(f"unsafe (known, in ci/checks-known.txt): {path}:{number}: {line.strip()}")
                continue
            found.append(f"    {path}:{number}: {line.strip()}")
    if found:
        print(f"unsafe: {len(found)} uses outside {', '.join(UNSAFE_FOLDERS + UNSAFE_FILES)} and the loading entry points:")
        print("\n".join(found))
        return 1
    print("unsafe: only in " + ", ".join(UNSAFE_FOLDERS + UNSAFE_FILES) + " and at the loading entry points")
    return 0


def check_cycles():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "import_cycles.py")
    return subprocess.call([sys.executable, script])


def main():
    checks = {"size": check_size, "unsafe": check_unsafe, "cycles": check_cycles}
    asked = sys.argv[1:] or list(checks)
    failed = [name for name in asked if checks[name]()]
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
