// export_and_run: mblob's C API from C++17, both sides.
//
//   export_and_run -o OUT.so [--layout classic|classic-0.21|ffi] [--backend direct|c|llvm]
//                  --object LIB0.o... --payload TYPE_KEY=FILE [--payload-root]
//                  [--function F] --input NAME=IN.npy... [--expect OUT.npy...]
//
// Writes a deploy library from host objects and one payload module (imported by the host
// library, or with --payload-root the root importing the host library, as a Relax executable's
// tree is), then loads the library it wrote from memory, sets the inputs from .npy files as
// DLPack tensors, runs it (a Relax model: mblob_model_invoke, outputs left on the device; other
// models: mblob_model_run) and compares each output, read through a DLPack DLManagedTensor,
// with the --expect files: dtype, shape and bytes exactly. Exits 0 when all match.
#include <mblob.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

// An mblob call that failed: its status and mblob_last_error().
struct Error : std::runtime_error {
  explicit Error(const std::string &what, mblob_status status)
      : std::runtime_error(what + ": " + mblob_last_error() + " (status " + std::to_string(status) + ")"),
        status(status) {}
  mblob_status status;
};

void check(mblob_status status, const std::string &what) {
  if (status != MBLOB_OK) throw Error(what, status);
}

// Owning handles: each frees with its mblob_*_free.
template <typename T, mblob_status (*Free)(T *)>
struct Deleter {
  void operator()(T *p) const { Free(p); }
};
using Export = std::unique_ptr<mblob_export, Deleter<mblob_export, mblob_export_free>>;
using Library = std::unique_ptr<mblob_library, Deleter<mblob_library, mblob_library_free>>;
using Model = std::unique_ptr<mblob_model, Deleter<mblob_model, mblob_model_free>>;
using Tensor = std::unique_ptr<mblob_tensor, Deleter<mblob_tensor, mblob_tensor_free>>;

// A DLPack managed tensor mblob handed out: its deleter runs once, here.
struct ManagedDeleter {
  void operator()(mblob_dl_managed_tensor *t) const {
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
};
using Managed = std::unique_ptr<mblob_dl_managed_tensor, ManagedDeleter>;

std::vector<char> read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A .npy array: DLPack dtype, shape and little-endian C-order bytes.
struct Npy {
  mblob_dtype dtype{};
  std::vector<int64_t> shape;
  std::vector<char> data;
};

Npy read_npy(const std::string &path) {
  std::vector<char> bytes = read_file(path);
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) throw std::runtime_error(path + ": not a .npy file");
  size_t header_len, start;
  if (bytes[6] == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
    start = 10;
  } else {
    if (bytes.size() < 12) throw std::runtime_error(path + ": truncated");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(bytes[8 + i]);
    start = 12;
  }
  if (start + header_len > bytes.size()) throw std::runtime_error(path + ": truncated header");
  std::string header(bytes.data() + start, header_len);
  auto field = [&](const std::string &key) {
    size_t at = header.find("'" + key + "'");
    if (at == std::string::npos) throw std::runtime_error(path + ": no " + key);
    return at + key.size() + 2;
  };
  size_t d = header.find('\'', field("descr")) + 1;
  std::string descr = header.substr(d, header.find('\'', d) - d);
  struct Kind { const char *descr; uint8_t code, bits; };
  static const Kind kinds[] = {{"<f4", 2, 32}, {"<f8", 2, 64}, {"<i4", 0, 32}, {"<i8", 0, 64}, {"|i1", 0, 8}, {"|u1", 1, 8}};
  Npy out;
  bool known = false;
  for (const Kind &k : kinds) {
    if (descr == k.descr) {
      out.dtype = mblob_dtype{k.code, k.bits, 1};
      known = true;
    }
  }
  if (!known) throw std::runtime_error(path + ": dtype " + descr + " is not one this example reads");
  if (header.find("True", field("fortran_order")) < header.find(',', field("fortran_order")))
    throw std::runtime_error(path + ": Fortran order");
  size_t open = header.find('(', field("shape")), close = header.find(')', open);
  std::string dims = header.substr(open + 1, close - open - 1);
  size_t count = 1;
  for (size_t p = 0; p < dims.size();) {
    size_t q = dims.find(',', p);
    std::string dim = dims.substr(p, q == std::string::npos ? std::string::npos : q - p);
    if (dim.find_first_of("0123456789") != std::string::npos) {
      out.shape.push_back(std::stoll(dim));
      count *= static_cast<size_t>(out.shape.back());
    }
    if (q == std::string::npos) break;
    p = q + 1;
  }
  size_t nbytes = count * (out.dtype.bits / 8);
  if (bytes.size() - start - header_len != nbytes) throw std::runtime_error(path + ": data size does not match the shape");
  out.data.assign(bytes.end() - static_cast<std::ptrdiff_t>(nbytes), bytes.end());
  return out;
}

mblob_dl_tensor as_dltensor(Npy &a) {
  mblob_dl_tensor t{};
  t.data = a.data.data();
  t.device = mblob_dl_device{1 /* kDLCPU */, 0};
  t.ndim = static_cast<int32_t>(a.shape.size());
  t.dtype = a.dtype;
  t.shape = a.shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

struct Args {
  std::string out, layout = "classic", backend, function;
  std::vector<std::string> objects;
  std::string payload_key, payload_file;
  bool payload_root = false;
  std::vector<std::pair<std::string, std::string>> inputs;
  std::vector<std::string> expect;
};

Args parse(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    auto split = [&](const std::string &v) {
      size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) throw std::runtime_error(arg + " takes NAME=FILE, not " + v);
      return std::make_pair(v.substr(0, eq), v.substr(eq + 1));
    };
    if (arg == "-o") a.out = value();
    else if (arg == "--layout") a.layout = value();
    else if (arg == "--backend") a.backend = value();
    else if (arg == "--function") a.function = value();
    else if (arg == "--object") a.objects.push_back(value());
    else if (arg == "--payload") std::tie(a.payload_key, a.payload_file) = split(value());
    else if (arg == "--payload-root") a.payload_root = true;
    else if (arg == "--input") a.inputs.push_back(split(value()));
    else if (arg == "--expect") a.expect.push_back(value());
    else throw std::runtime_error("unknown argument " + arg);
  }
  if (a.out.empty() || a.objects.empty() || a.payload_key.empty()) throw std::runtime_error("needs -o, --object and --payload");
  return a;
}

void write_library(const Args &a) {
  mblob_export *raw = nullptr;
  check(mblob_export_new(&raw), "mblob_export_new");
  Export e(raw);
  size_t host = 0, payload = 0;
  check(mblob_export_host(e.get(), &host), "mblob_export_host");
  for (const std::string &o : a.objects) check(mblob_export_add_object(e.get(), o.c_str()), "add object " + o);
  check(mblob_export_add_payload_file(e.get(), a.payload_key.c_str(), a.payload_file.c_str(), &payload),
        "add payload " + a.payload_file);
  if (a.payload_root) {
    check(mblob_export_import(e.get(), payload, host), "import");
    check(mblob_export_set_root(e.get(), payload), "set root");
  } else {
    check(mblob_export_import(e.get(), host, payload), "import");
  }
  check(mblob_export_set_layout(e.get(), a.layout.c_str()), "layout " + a.layout);
  if (!a.backend.empty()) check(mblob_export_set_backend(e.get(), a.backend.c_str()), "backend " + a.backend);
  check(mblob_export_write(e.get(), a.out.c_str()), "write " + a.out);
}

// Compares output `index` of `model` with `want`, reading it through DLPack.
bool compare(mblob_model *model, size_t index, const Npy &want) {
  mblob_tensor *raw = nullptr;
  check(mblob_model_output_device(model, index, &raw), "output " + std::to_string(index));
  Tensor out(raw);
  mblob_dl_device device{};
  check(mblob_tensor_device(out.get(), &device), "device");
  if (device.device_type != 1) {  // on a device: copy to the host first
    check(mblob_tensor_to_host(out.get(), &raw), "to host");
    out.reset(raw);
  }
  mblob_dl_managed_tensor *managed_raw = nullptr;
  check(mblob_tensor_to_dlpack(out.get(), &managed_raw), "to DLPack");
  Managed managed(managed_raw);
  out.reset();  // the DLPack tensor keeps the memory alive by itself
  const mblob_dl_tensor &t = managed->dl_tensor;
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  if (t.dtype.code != want.dtype.code || t.dtype.bits != want.dtype.bits || t.dtype.lanes != 1 || shape != want.shape) {
    std::fprintf(stderr, "output %zu: dtype or shape differs from the expected one\n", index);
    return false;
  }
  const char *data = static_cast<const char *>(t.data) + t.byte_offset;
  if (std::memcmp(data, want.data.data(), want.data.size()) != 0) {
    std::fprintf(stderr, "output %zu: bytes differ from the expected ones\n", index);
    return false;
  }
  return true;
}

int run(const Args &a) {
  write_library(a);
  std::printf("wrote %s\n", a.out.c_str());

  // Load what was written from memory (as a program that received it over the network would).
  std::vector<char> so = read_file(a.out);
  mblob_library *lib_raw = nullptr;
  check(mblob_library_load_memory(so.data(), so.size(), a.out.c_str(), &lib_raw), "load from memory");
  Library lib(lib_raw);
  mblob_model *model_raw = nullptr;
  check(mblob_model_new(lib.get(), 1 /* kDLCPU */, 0, &model_raw), "model");
  Model model(model_raw);
  lib.reset();  // the model keeps what it needs

  std::vector<Npy> arrays;
  for (const auto &input : a.inputs) arrays.push_back(read_npy(input.second));
  std::vector<mblob_dl_tensor> tensors;
  for (Npy &n : arrays) tensors.push_back(as_dltensor(n));
  std::vector<const mblob_dl_tensor *> pointers;
  for (const mblob_dl_tensor &t : tensors) pointers.push_back(&t);

  mblob_kind kind{};
  check(mblob_model_kind(model.get(), &kind), "kind");
  if (kind == MBLOB_MODEL_RELAX) {  // call the function by name, outputs left on the device
    size_t functions = 0;
    check(mblob_model_num_functions(model.get(), &functions), "functions");
    for (size_t i = 0; i < functions; ++i) {
      const char *name = nullptr;
      check(mblob_model_function_name(model.get(), i, &name), "function name");
      std::printf("function %s\n", name);
    }
    const char *function = a.function.empty() ? nullptr : a.function.c_str();
    check(mblob_model_invoke(model.get(), function, pointers.data(), pointers.size()), "invoke");
  } else {  // set the inputs by name and run
    if (!a.function.empty()) check(mblob_model_select_function(model.get(), a.function.c_str()), "function");
    for (size_t i = 0; i < tensors.size(); ++i)
      check(mblob_model_set_input_dltensor(model.get(), a.inputs[i].first.c_str(), 0, &tensors[i]), "input " + a.inputs[i].first);
    check(mblob_model_run(model.get()), "run");
  }
  size_t outputs = 0;
  check(mblob_model_num_outputs(model.get(), &outputs), "outputs");
  std::printf("%zu outputs\n", outputs);
  if (!a.expect.empty() && a.expect.size() != outputs) {
    std::fprintf(stderr, "%zu outputs, %zu expected\n", outputs, a.expect.size());
    return 1;
  }
  bool all = true;
  for (size_t k = 0; k < a.expect.size(); ++k) all = compare(model.get(), k, read_npy(a.expect[k])) && all;
  if (all && !a.expect.empty()) std::printf("all outputs equal the expected ones\n");
  return all ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception &e) {
    std::fprintf(stderr, "export_and_run: %s\n", e.what());
    return 2;
  }
}
