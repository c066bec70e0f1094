#!/usr/bin/env bash
# Per-inference time of `mblob run` on OpenCL against `mblob run` on the CPU, for each OpenCL
# model of tests/fixtures/device-run: NAME.so (TVM's OpenCL build) on `--device opencl`, and
# NAME.cpu.so (the same model and parameters built by TVM for `llvm`, make.py --cpu-builds) on
# the CPU, at the same --threads. Prints a markdown table and writes benches/results/run_device.json
# (a JSON array, one object per model).
#   bash benches/run_device.sh [REPEAT]        (default 200; THREADS=N to pick the thread count)
#
# What the ratio means: the OpenCL device here is usually pocl, which runs OpenCL C on the SAME
# CPU cores (`clinfo -l` names the device). So "opencl / cpu" is not a GPU speed-up: it measures
# mblob's device path (buffers, copies of inputs and outputs, kernel launches, waiting for the
# queue) plus pocl's compiled versions of TVM's GPU-scheduled kernels, against TVM's own CPU
# kernels called directly. Both runs also check their outputs against the model's reference
# (NAME.out.K.npy): OpenCL within the json's rtol, the CPU build within 1e-5, relative to
# max(1, max|ref|); the script fails when one does not match.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-200}
threads=${THREADS:-$(nproc)}
cargo build -q --release --bin mblob
B=$(bash ci/target-dir.sh)/release/mblob
D=tests/fixtures/device-run
out=benches/results/run_device.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if command -v clinfo >/dev/null 2>&1; then
  ocl_platform=$(clinfo -l 2>/dev/null | sed -n 's/^Platform #0: //p' | head -n1)
  ocl_device=$(clinfo -l 2>/dev/null | sed -n 's/^.*Device #0: //p' | head -n1)
fi
ocl_platform=${ocl_platform:-unknown}
ocl_device=${ocl_device:-unknown (no clinfo)}

# Helper: model list, `mblob run` arguments, output checks (.npy read without numpy), JSON.
cat > "$tmp/h.py" <<'EOF'
import ast, glob, json, os, struct, sys
from array import array

D = "tests/fixtures/device-run"

def meta(name):
    return json.load(open(os.path.join(D, name + ".json")))

def npy(path):
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:6] == b"\x93NUMPY", path
    if data[6] == 1:
        (hl,), start = struct.unpack_from("<H", data, 8), 10
    else:
        (hl,), start = struct.unpack_from("<I", data, 8), 12
    head = ast.literal_eval(data[start:start + hl].decode("latin1"))
    code = {"<f4": "f", "<f8": "d", "<i4": "i", "|i1": "b", "<i8": "q"}[head["descr"]]
    a = array(code)
    a.frombytes(data[start + hl:])
    return tuple(head["shape"]), list(a)

cmd = sys.argv[1]
if cmd == "models":
    for f in sorted(glob.glob(os.path.join(D, "*.json"))):
        name = os.path.basename(f)[:-5]
        if name == "manifest":
            continue
        m = meta(name)
        if m.get("device") != "opencl":
            continue
        if "cpu_so" not in m:
            print("run_device.sh: %s has no cpu_so (make.py --cpu-builds), skipped" % name, file=sys.stderr)
            continue
        print(name)
elif cmd == "args":  # NAME: mblob run arguments after the .so
    m = meta(sys.argv[2])
    args = []
    for i in m["inputs"]:
        args += ["--input", "%s=%s" % (i["name"], os.path.join(D, i["file"]))]
    if m["executor"] == "relax":
        args += ["--function", m["entry"]]
    print(" ".join(args))
elif cmd == "info":  # NAME: executor, TVM version
    m = meta(sys.argv[2])
    print(m["executor"], m["tvm_version"])
elif cmd == "check":  # NAME DIR RTOL|json: the largest error relative to max(1, max|ref|)
    m = meta(sys.argv[2])
    rtol = m["rtol"] if sys.argv[4] == "json" else float(sys.argv[4])
    worst = 0.0
    for o in m["outputs"]:
        rshape, ref = npy(os.path.join(D, o["file"]))
        gshape, got = npy(os.path.join(sys.argv[3], "out.%d.npy" % o["index"]))
        if rshape != gshape:
            sys.exit("%s: output %d has shape %s, not %s" % (sys.argv[2], o["index"], gshape, rshape))
        scale = max([1.0] + [abs(v) for v in ref])
        worst = max([worst] + [abs(g - r) / scale for g, r in zip(got, ref)])
    print("%.3g" % worst)
    if not worst <= rtol:
        sys.exit("%s: outputs of %s differ from the reference by %.3g > %g" % (sys.argv[2], sys.argv[3], worst, rtol))
elif cmd == "json":  # rows (TSV on stdin) -> JSON array
    keys = ["model", "executor", "tvm_version", "so", "cpu_so", "opencl_platform", "opencl_device",
            "threads", "repeat", "opencl_mean_us", "opencl_median_us", "opencl_min_us", "cpu_mean_us",
            "cpu_median_us", "cpu_min_us", "ratio_opencl_over_cpu_median", "opencl_max_rel_err",
            "cpu_max_rel_err"]
    rows = []
    for line in sys.stdin:
        row = dict(zip(keys, line.rstrip("\n").split("\t")))
        for k in keys[7:]:
            row[k] = int(row[k]) if k in ("threads", "repeat") else float(row[k])
        row["machine"] = sys.argv[2]
        row["note"] = ("pocl runs OpenCL on the same CPU cores: the ratio is mblob's device path "
                       "plus pocl's kernels against TVM's CPU kernels, not a GPU speed-up")
        rows.append(row)
    print(json.dumps(rows, indent=2))
EOF
h() { python3 "$tmp/h.py" "$@"; }

# `mblob run ... --repeat N` prints "N runs, T threads: mean X us, median Y us, min Z us"
times() { sed -nE 's/.* runs, [0-9]+ threads: mean ([0-9.]+) us, median ([0-9.]+) us, min ([0-9.]+) us/\1 \2 \3/p'; }

echo "OpenCL: $ocl_platform / $ocl_device; $threads threads; $repeat runs after a first one"
echo
echo "| model | executor | OpenCL device | opencl mean us | opencl median us | opencl min us | cpu median us | ratio opencl/cpu (median) |"
echo "|---|---|---|---|---|---|---|---|"
: > "$tmp/rows"
for m in $(h models); do
  read -r ex ver < <(h info "$m")
  read -ra args < <(h args "$m")
  read -r om od on < <("$B" run "$D/$m.so" --device opencl --threads "$threads" --repeat "$repeat" "${args[@]}" \
    -o "$tmp/$m.ocl" | times)
  oerr=$(h check "$m" "$tmp/$m.ocl" json)
  read -r cm cd cn < <("$B" run "$D/$m.cpu.so" --device cpu --threads "$threads" --repeat "$repeat" "${args[@]}" \
    -o "$tmp/$m.cpu" | times)
  cerr=$(h check "$m" "$tmp/$m.cpu" 1e-5)
  ratio=$(python3 -c "print('%.2f' % ($od / $cd))")
  echo "| $m | $ex | $ocl_device | $om | $od | $on | $cd | $ratio |"
  printf '%s\t' "$m" "$ex" "$ver" "$m.so" "$m.cpu.so" "$ocl_platform" "$ocl_device" "$threads" "$repeat" \
    "$om" "$od" "$on" "$cm" "$cd" "$cn" "$ratio" "$oerr" >> "$tmp/rows"
  printf '%s\n' "$cerr" >> "$tmp/rows"
done
machine="$(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
mkdir -p benches/results
h json "$machine" < "$tmp/rows" > "$tmp/run_device.json"
mv "$tmp/run_device.json" "$out"
echo
echo "wrote $out"
