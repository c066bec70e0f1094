/* mblob-runtime's provider for the TVM runtime functions that compiled host code may import by
 * name (TVM 0.22+ argument checks, the C host target, system-lib builds).
 *
 * mblob-runtime never makes these names visible to the process: it opens this library as the
 * first object of a private link-map namespace (glibc's dlmopen with LM_ID_NEWLM) and opens the
 * libraries that import these names into that namespace only, where their imports bind here.
 * TVM, tvm-ffi or any other provider of the same names in the main namespace is untouched.
 *
 * Built with -nostdlib: it needs no libc, so the namespace holds no second C library unless a
 * model needs one itself. Each function forwards to the Rust function whose address
 * mblob-runtime stores in `mblob_shim_table`; nothing else lives here. Written for mblob (no TVM
 * code). */
#include <stddef.h>
#include <stdint.h>

#define MBLOB_SHIM_SLOTS 13
void* mblob_shim_table[MBLOB_SHIM_SLOTS];

typedef void (*set_parts_t)(const char*, const char**, int32_t);
typedef void (*set_cstr_t)(const char*, const char*);
typedef void (*set_last_t)(const char*);
typedef void* (*alloc_t)(int, int, uint64_t, int, int);
typedef int (*free_t)(int, int, void*);
typedef int (*launch_t)(void*, void*, int);
typedef int (*barrier_t)(int, void*);
typedef int (*get_func_t)(void*, const char*, void**);
typedef int (*func_call_t)(void*, void*, int*, int, void*, int*);
typedef int (*ffi_call_t)(void*, const void*, int32_t, void*);
typedef int (*lookup_t)(void*, const char*, void**);
typedef int (*init_once_t)(void**, int (*)(void**));
/* The registration also gets the caller's address (see below). */
typedef int (*syslib_reg_t)(const char*, void*, void*);

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  set_parts_t f = (set_parts_t)mblob_shim_table[0];
  if (f) f(kind, parts, n);
}
void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  set_cstr_t f = (set_cstr_t)mblob_shim_table[1];
  if (f) f(kind, message);
}
void TVMAPISetLastError(const char* message) {
  set_last_t f = (set_last_t)mblob_shim_table[2];
  if (f) f(message);
}
void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int code, int bits) {
  alloc_t f = (alloc_t)mblob_shim_table[3];
  return f ? f(device_type, device_id, nbytes, code, bits) : NULL;
}
int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  free_t f = (free_t)mblob_shim_table[4];
  return f ? f(device_type, device_id, ptr) : -1;
}
int TVMBackendParallelLaunch(void* lambda, void* cdata, int num_task) {
  launch_t f = (launch_t)mblob_shim_table[5];
  return f ? f(lambda, cdata, num_task) : -1;
}
int TVMBackendParallelBarrier(int task_id, void* env) {
  barrier_t f = (barrier_t)mblob_shim_table[6];
  return f ? f(task_id, env) : -1;
}
int TVMBackendGetFuncFromEnv(void* mod, const char* name, void** out) {
  get_func_t f = (get_func_t)mblob_shim_table[7];
  return f ? f(mod, name, out) : -1;
}
int TVMFuncCall(void* handle, void* values, int* codes, int n, void* ret, int* ret_code) {
  func_call_t f = (func_call_t)mblob_shim_table[8];
  return f ? f(handle, values, codes, n, ret, ret_code) : -1;
}
int TVMFFIFunctionCall(void* handle, const void* args, int32_t n, void* result) {
  ffi_call_t f = (ffi_call_t)mblob_shim_table[9];
  return f ? f(handle, args, n, result) : -1;
}
int TVMFFIEnvModLookupFromImports(void* ctx, const char* name, void** out) {
  lookup_t f = (lookup_t)mblob_shim_table[10];
  return f ? f(ctx, name, out) : -1;
}
int TVMFFIHandleInitOnce(void** handle, int (*init)(void**)) {
  init_once_t f = (init_once_t)mblob_shim_table[11];
  return f ? f(handle, init) : -1;
}
/* This library comes first in its namespace's lookup scope, so a library there that defines its
 * own TVMBackendRegisterSystemLibSymbol (a program's own registry) and calls it binds here too.
 * mblob-runtime therefore gets the caller's address, and calls the caller's own definition when
 * its library has one; otherwise (a TVM system-lib build) it registers the symbol itself. */
int TVMBackendRegisterSystemLibSymbol(const char* name, void* ptr) {
  syslib_reg_t f = (syslib_reg_t)mblob_shim_table[12];
  return f ? f(name, ptr, __builtin_return_address(0)) : -1;
}
