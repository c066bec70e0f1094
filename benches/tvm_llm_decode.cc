// Per-token greedy decode time of TVM 0.27's own Relax VM on an MLC-LLM model library, the VM
// driven from C++ through TVM's runtime API (the wheel's `libtvm_runtime.so` and
// `libtvm_ffi.so`), the way MLC-LLM's engine drives it (`cpp/serve/function_table.cc`,
// `cpp/serve/model.cc` of mlc-ai/mlc-llm): no Python in the loop. Run by hand;
// `benches/llm_decode_cpp.sh` builds and runs it beside `mblob generate`.
//
//   TVM_NUM_THREADS=1 tvm_llm_decode LIB.so --weights DIR --prompt-ids 1,2,3
//       [--max-new-tokens 32] [--repeat 10] [--page-size 16] [--max-total-seq-len N]
//
// What it does, in MLC-LLM's words and order:
// - `Module::LoadFromFile(LIB.so)`, its `vm_load_executable()`, then the VM's
//   `vm_initialization(kDLCPU, 0, kPooled, kDLCPU, 0, kPooled)`;
// - `_metadata()` parsed with tvm-ffi's JSON reader; the weights by
//   `vm.builtin.tensor_cache.load(DIR, kDLCPU, 0)`, then
//   `vm.builtin.param_array_from_cache_by_name(names of _metadata["params"])` (or
//   `param_array_from_cache("param", -1)` when it lists none), then `tensor_cache.clear`;
// - per generation a new cache: `create_flashinfer_paged_kv_cache` if the library has it and no
//   sliding window, else `create_tir_paged_kv_cache`, with ([max_batch_size],
//   [max_total_seq_len: the context window unless given], [prefill_chunk_size], [page size],
//   [sliding window on]); `vm.builtin.kv_state_add_sequence(kv, 0)`, and
//   `attention_kv_cache_enable_sliding_window_for_seq(kv, 0, window, sinks)` for a model with
//   a sliding window;
// - every forward step: the token ids copied into a device buffer of `prefill_chunk_size` ids
//   made once (MLC's `CopyToWorker0`), `embed(ids, params)`, the embeddings viewed as
//   `[1, n, hidden]` (`Tensor::CreateView`), `kv_state_begin_forward(kv, [0], [n])`,
//   `prefill` or `decode(embeddings, kv, params)`, item 0 of its result the logits,
//   `kv_state_end_forward(kv)`; the last row of logits copied to the host and its argmax (the
//   first of equal largest) the next token;
// - the prompt in chunks of at most `prefill_chunk_size` through `prefill`, then `decode` until
//   `--max-new-tokens` tokens.
//
// Timed: each decode step from copying its token id in to the argmax, inclusive: the span `mblob
// generate --repeat` times (`runtime/src/exec/llm/generate.rs`: `begin_forward`, `embed` with
// its id copied in, `decode`, `end_forward`, the logits row to the host and the argmax; mblob
// calls `begin_forward` before `embed`, MLC-LLM's engine, and this program, after). One untimed generation first (warm-up, as `mblob generate` runs one
// before its `--repeat` runs), then REPEAT timed ones, each on a new cache, which must give the
// first one's tokens. Prints one JSON line: tokens, every decode step's time in microseconds,
// mean, median and min, the prefill times, and what was called.

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using tvm::ffi::Any;
using tvm::ffi::Array;
using tvm::ffi::Function;
using tvm::ffi::Map;
using tvm::ffi::Module;
using tvm::ffi::Optional;
using tvm::ffi::Shape;
using tvm::ffi::ShapeView;
using tvm::ffi::String;
using tvm::ffi::Tensor;
using Clock = std::chrono::steady_clock;

// `tvm::runtime::memory::AllocatorType::kPooled` (`tvm/runtime/memory/memory_manager.h`), the
// allocator MLC-LLM's engine asks for. The wheel's `tvm/runtime/` headers include
// `tvm/support/io.h` and `serializer.h`, which the wheel does not ship, so this program uses
// only tvm-ffi's headers (complete in the wheel) and TVM's runtime through its registered
// functions.
constexpr int kPooled = 2;

// A view of the contiguous tensor `t` as `shape` (row-major), sharing its data: what
// `tvm::runtime::Tensor::CreateView(shape, dtype)` gives, made with tvm-ffi's `as_strided`
// (TVMFFITensorCreateUnsafeView), a direct call as the engine's `CreateView` is.
Tensor View(const Tensor& t, std::initializer_list<int64_t> shape) {
  std::vector<int64_t> dims(shape), strides(dims.size());
  int64_t stride = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= dims[i];
  }
  if (stride > t.numel()) throw std::runtime_error("a view larger than its tensor");
  return t.as_strided(ShapeView(dims.data(), dims.size()), ShapeView(strides.data(), strides.size()));
}

struct Args {
  std::string model;
  std::string weights;
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  int64_t repeat = 1;
  int64_t page_size = 16;
  int64_t max_total_seq_len = -1;
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "tvm_llm_decode: " << why << "\n"
            << "usage: tvm_llm_decode LIB.so --weights DIR --prompt-ids ID,ID,... "
               "[--max-new-tokens N] [--repeat N] [--page-size N] [--max-total-seq-len N]\n";
  std::exit(2);
}

int64_t Number(const std::string& flag, const std::string& text, int64_t least) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < least) {
    Usage(flag + " wants a whole number of at least " + std::to_string(least) + ", not \"" + text +
          "\"");
  }
  return v;
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--weights") {
      a.weights = value();
    } else if (arg == "--prompt-ids") {
      std::stringstream ids(value());
      for (std::string t; std::getline(ids, t, ',');) {
        if (!t.empty()) a.prompt.push_back(static_cast<int32_t>(Number("--prompt-ids", t, 0)));
      }
    } else if (arg == "--max-new-tokens") {
      a.max_new_tokens = Number(arg, value(), 1);
    } else if (arg == "--repeat") {
      a.repeat = Number(arg, value(), 1);
    } else if (arg == "--page-size") {
      a.page_size = Number(arg, value(), 1);
    } else if (arg == "--max-total-seq-len") {
      a.max_total_seq_len = Number(arg, value(), 1);
    } else if (!arg.empty() && arg[0] == '-') {
      Usage("unknown option " + arg);
    } else if (a.model.empty()) {
      a.model = arg;
    } else {
      Usage("one library only (got \"" + a.model + "\" and \"" + arg + "\")");
    }
  }
  if (a.model.empty()) Usage("no library given");
  if (a.weights.empty()) Usage("no --weights DIR (the tensor cache) given");
  if (a.prompt.empty()) Usage("no --prompt-ids given");
  return a;
}

// `_metadata`'s values, as MLC-LLM's `ModelMetadata::FromJSON` reads them.
struct Metadata {
  int64_t context_window_size = 0;
  int64_t prefill_chunk_size = 0;
  int64_t max_batch_size = 0;
  int64_t sliding_window_size = -1;
  int64_t attention_sink_size = 0;
  std::string kv_state_kind = "kv_cache";
  Array<String> param_names;
};

Any Field(const Map<Any, Any>& obj, const char* key) {
  auto it = obj.find(String(key));
  if (it == obj.end()) throw std::runtime_error(std::string("_metadata has no \"") + key + "\"");
  return (*it).second;
}

Metadata ReadMetadata(const Module& vm) {
  Optional<Function> f = vm->GetFunction("_metadata");
  if (!f.has_value()) throw std::runtime_error("the library has no _metadata function");
  String text = f.value()().cast<String>();
  String error;
  Any parsed = tvm::ffi::json::Parse(text, &error);
  if (!error.empty()) throw std::runtime_error("_metadata is not JSON: " + std::string(error));
  auto obj = parsed.cast<Map<Any, Any>>();
  Metadata m;
  m.context_window_size = Field(obj, "context_window_size").cast<int64_t>();
  m.prefill_chunk_size = Field(obj, "prefill_chunk_size").cast<int64_t>();
  m.max_batch_size = Field(obj, "max_batch_size").cast<int64_t>();
  if (obj.count(String("sliding_window_size")))
    m.sliding_window_size = Field(obj, "sliding_window_size").cast<int64_t>();
  if (obj.count(String("attention_sink_size")))
    m.attention_sink_size = std::max<int64_t>(Field(obj, "attention_sink_size").cast<int64_t>(), 0);
  if (obj.count(String("kv_state_kind")))
    m.kv_state_kind = std::string(Field(obj, "kv_state_kind").cast<String>());
  for (const Any& p : Field(obj, "params").cast<Array<Any>>()) {
    m.param_names.push_back(Field(p.cast<Map<Any, Any>>(), "name").cast<String>());
  }
  return m;
}

// The model as MLC-LLM's `FunctionTable` holds it (CPU, one sequence).
struct Model {
  explicit Model(Module vm) : vm(std::move(vm)) {}
  Module vm;
  Metadata meta;
  Any params;
  Function embed, prefill, decode, create_kv;
  std::string create_name;
  Function add_sequence, enable_window, begin_forward, end_forward;
  Tensor ids_buffer;  // `prefill_chunk_size` int32 ids on the device, reused as MLC's engine does
  int64_t total = 0;
  int64_t page_size = 16;
};

Function Required(const Module& vm, const char* name) {
  Optional<Function> f = vm->GetFunction(name);
  if (!f.has_value()) throw std::runtime_error(std::string("the library has no ") + name);
  return f.value();
}

Model Load(const Args& a) {
  const DLDevice cpu{kDLCPU, 0};
  Module lib = Module::LoadFromFile(a.model);
  Optional<Function> load_exec = lib->GetFunction("vm_load_executable");
  if (!load_exec.has_value()) throw std::runtime_error(a.model + " has no vm_load_executable");
  Model m(load_exec.value()().cast<Module>());
  Required(m.vm, "vm_initialization")(static_cast<int>(cpu.device_type), cpu.device_id, kPooled,
                                      static_cast<int>(kDLCPU), 0, kPooled);
  m.meta = ReadMetadata(m.vm);
  if (m.meta.kv_state_kind != "kv_cache") {
    throw std::runtime_error("kv_state_kind " + m.meta.kv_state_kind + ": only kv_cache here");
  }
  Function::GetGlobalRequired("vm.builtin.tensor_cache.load")(
      String(a.weights), static_cast<int32_t>(cpu.device_type), cpu.device_id);
  if (m.meta.param_names.empty()) {
    m.params = Function::GetGlobalRequired("vm.builtin.param_array_from_cache")(String("param"), -1);
  } else {
    m.params = Function::GetGlobalRequired("vm.builtin.param_array_from_cache_by_name")(
        m.meta.param_names);
  }
  Function::GetGlobalRequired("vm.builtin.tensor_cache.clear")();
  m.embed = Required(m.vm, "embed");
  m.prefill = Required(m.vm, "prefill");
  m.decode = Required(m.vm, "decode");
  Optional<Function> flashinfer = m.vm->GetFunction("create_flashinfer_paged_kv_cache");
  if (flashinfer.has_value() && m.meta.sliding_window_size == -1) {
    m.create_kv = flashinfer.value();
    m.create_name = "create_flashinfer_paged_kv_cache";
  } else {
    m.create_kv = Required(m.vm, "create_tir_paged_kv_cache");
    m.create_name = "create_tir_paged_kv_cache";
  }
  m.add_sequence = Function::GetGlobalRequired("vm.builtin.kv_state_add_sequence");
  m.enable_window =
      Function::GetGlobalRequired("vm.builtin.attention_kv_cache_enable_sliding_window_for_seq");
  m.begin_forward = Function::GetGlobalRequired("vm.builtin.kv_state_begin_forward");
  m.end_forward = Function::GetGlobalRequired("vm.builtin.kv_state_end_forward");
  m.total = a.max_total_seq_len > 0 ? a.max_total_seq_len : m.meta.context_window_size;
  if (m.total <= 0) {
    throw std::runtime_error("the context window is -1: give --max-total-seq-len");
  }
  m.page_size = a.page_size;
  // `tvm::runtime::Tensor::Empty`, as TVM's runtime registers it.
  m.ids_buffer = Function::GetGlobalRequired("runtime.TVMTensorAllocWithScope")(
                     Shape({m.meta.prefill_chunk_size}), DLDataType{kDLInt, 32, 1}, cpu,
                     Optional<String>(std::nullopt))
                     .cast<Tensor>();
  return m;
}

Any NewCache(const Model& m) {
  Any kv = m.create_kv(Shape({m.meta.max_batch_size}), Shape({m.total}),
                       Shape({m.meta.prefill_chunk_size}), Shape({m.page_size}),
                       Shape({static_cast<int64_t>(m.meta.sliding_window_size != -1)}));
  m.add_sequence(kv, int64_t{0});
  if (m.meta.sliding_window_size != -1) {
    m.enable_window(kv, int64_t{0}, m.meta.sliding_window_size, m.meta.attention_sink_size);
  }
  return kv;
}

// One forward step of sequence 0 over `ids` through `func`: the argmax of the last row of logits.
int32_t Forward(const Model& m, const Function& func, const Any& kv, const int32_t* ids,
                int64_t n) {
  // The ids into the device buffer (on the CPU, TVM's `CopyFromBytes` is this memcpy).
  Tensor input = View(m.ids_buffer, {n});
  std::memcpy(static_cast<char*>(input.data_ptr()) + input.byte_offset(), ids,
              static_cast<size_t>(n) * sizeof(int32_t));
  Tensor embedded = m.embed(input, m.params).cast<Tensor>();
  if (embedded.ndim() != 2 || embedded.size(0) != n || !embedded.IsContiguous()) {
    throw std::runtime_error("embed did not give a contiguous [" + std::to_string(n) +
                             ", hidden] tensor");
  }
  Tensor view = View(embedded, {1, n, embedded.size(1)});
  m.begin_forward(kv, Shape({0}), Shape({n}));
  Any ret = func(view, kv, m.params);
  Tensor logits = ret.cast<Array<Any>>()[0].cast<Tensor>();
  m.end_forward(kv);
  if (logits.dtype().code != kDLFloat || logits.dtype().bits != 32 || logits.ndim() < 1 ||
      logits.device().device_type != kDLCPU || !logits.IsContiguous()) {
    throw std::runtime_error("logits not contiguous float32 on the CPU");
  }
  const int64_t count = logits.numel();
  const int64_t vocab = logits.size(-1);
  std::vector<float> row(static_cast<size_t>(vocab));
  const char* base = static_cast<const char*>(logits.data_ptr()) + logits.byte_offset();
  std::memcpy(row.data(), base + (count - vocab) * sizeof(float), row.size() * sizeof(float));
  int64_t best = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(row[i])) throw std::runtime_error("logits with NaN");
    if (row[i] > row[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

struct Run {
  std::vector<int32_t> tokens;
  double prefill_us = 0;
  std::vector<double> decode_us;
};

Run Generate(const Model& m, const Args& a) {
  Any kv = NewCache(m);
  Run r;
  const int64_t chunk = m.meta.prefill_chunk_size;
  const int64_t len = static_cast<int64_t>(a.prompt.size());
  auto start = Clock::now();
  int32_t token = 0;
  for (int64_t at = 0; at < len; at += chunk) {
    token = Forward(m, m.prefill, kv, a.prompt.data() + at, std::min(chunk, len - at));
  }
  r.prefill_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  r.tokens.push_back(token);
  while (static_cast<int64_t>(r.tokens.size()) < a.max_new_tokens) {
    auto t0 = Clock::now();
    token = Forward(m, m.decode, kv, &token, 1);
    r.decode_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    r.tokens.push_back(token);
  }
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

template <typename T>
std::string List(const std::vector<T>& v) {
  std::ostringstream s;
  s.precision(10);
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  s << "]";
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  try {
    Model m = Load(a);
    if (static_cast<int64_t>(a.prompt.size()) + a.max_new_tokens > m.total) {
      throw std::runtime_error("the prompt and the new tokens do not fit the cache of " +
                               std::to_string(m.total) + " tokens");
    }
    const Run first = Generate(m, a);  // warm-up, untimed
    std::vector<double> decode, prefill;
    for (int64_t i = 0; i < a.repeat; ++i) {
      Run r = Generate(m, a);
      if (r.tokens != first.tokens) {
        throw std::runtime_error("a repeated run gave other tokens " + List(r.tokens) +
                                 " than the first " + List(first.tokens));
      }
      decode.insert(decode.end(), r.decode_us.begin(), r.decode_us.end());
      prefill.push_back(r.prefill_us);
    }
    const char* threads = std::getenv("TVM_NUM_THREADS");
    std::ostringstream out;
    out.precision(10);
    out << "{\"tokens\":" << List(first.tokens) << ",\"create\":\"" << m.create_name
        << "\",\"tvm_num_threads\":\"" << (threads ? threads : "") << "\",\"steps\":"
        << decode.size();
    if (!decode.empty()) {
      out << ",\"decode_us_mean\":"
          << std::accumulate(decode.begin(), decode.end(), 0.0) / decode.size()
          << ",\"decode_us_median\":" << Median(decode)
          << ",\"decode_us_min\":" << *std::min_element(decode.begin(), decode.end());
    }
    out << ",\"prefill_us_median\":" << Median(prefill) << ",\"decode_us\":" << List(decode)
        << ",\"prefill_us\":" << List(prefill) << "}";
    std::cout << out.str() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "tvm_llm_decode: " << a.model << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
