//! The pieces of `mblob demo`: a host part with real functions (built with inkwell when the
//! `llvm` feature is on, from C otherwise), a vector-add PTX kernel, and the graph factory
//! that roots the tree. The orchestration lives in `cli/demo/mod.rs`.

use mblob_runtime::Layout;

/// The demo's CUDA kernel, hand-written PTX: `mblob_vector_add(a, b, out, n)` sets
/// `out[i] = a[i] + b[i]` for `i < n`, one thread per element.
pub const VECTOR_ADD_PTX: &str = include_str!("../../../data/vector_add.ptx");

/// Name of the kernel in [`VECTOR_ADD_PTX`].
pub const KERNEL_NAME: &str = "mblob_vector_add";

/// Name of the host function `mblob_demo_add(a, b, out)`: `out[i] = a[i] + b[i]` over three
/// float32 vectors of one length on the CPU. It is also the graph's kernel (its `tvm_op`).
pub const HOST_ADD: &str = "mblob_demo_add";

/// Name of the second host function, `mblob_demo_dot(a, b)`: returns the dot product of two
/// float32 vectors of one length on the CPU, as a float.
pub const HOST_DOT: &str = "mblob_demo_dot";

/// What the host functions say when their arguments are not what they take.
const ADD_TAKES: &str = "mblob_demo_add takes three float32 vectors of one length on the CPU (a, b, out)";
const DOT_TAKES: &str = "mblob_demo_dot takes two float32 vectors of one length on the CPU (a, b)";

/// The calling convention of the demo's host functions: TVM's packed-function ABI of the
/// layout's TVM generation, as the host code TVM compiles has it (`tvm-abi.md`), with the
/// context slot its loader fills, so that the one classifier of host code
/// (`mblob_runtime::format::convention`) tells the same generation as the layout.
///
/// - classic (TVM 0.8-0.20): `int32_t f(TVMValue* args, int32_t* type_codes, int32_t num_args,
///   TVMValue* ret, int32_t* ret_code, void* resource)`, errors through `TVMAPISetLastError`,
///   slot `__tvm_module_ctx`;
/// - TVM 0.21: tvm-ffi's `int32_t f(void* self, const TVMFFIAny* args, int32_t num_args,
///   TVMFFIAny* ret)`, errors through `TVMFFIErrorSetRaisedFromCStr`, slot
///   `__tvm_ffi_library_ctx`;
/// - TVM 0.22+: the same, each function exported as `__tvm_ffi_<name>`, slot
///   `__tvm_ffi__library_ctx`.
///
/// Tensors come as `DLTensor*` (type code 7 in both ABIs).
#[derive(Debug, Clone, Copy)]
pub struct Convention {
    layout: Layout,
}

/// The type code (classic) and type index (tvm-ffi) of a `DLTensor*` argument.
const DLTENSOR_CODE: u64 = 7;

impl Convention {
    /// The convention of the TVM that reads `layout`.
    pub fn of(layout: Layout) -> Convention {
        Convention { layout }
    }

    /// Whether the functions use tvm-ffi's ABI (TVM 0.21+), not the classic one.
    fn ffi(self) -> bool {
        self.layout.ffi_values()
    }

    /// The exported symbol of host function `name`.
    fn symbol(self, name: &str) -> String {
        if self.layout.prefixes_functions() {
            format!("__tvm_ffi_{name}")
        } else {
            name.to_owned()
        }
    }

    /// The context slot the library defines (its loader writes the runtime's context there).
    fn context_slot(self) -> &'static str {
        match self.layout {
            Layout::Classic => "__tvm_module_ctx",
            Layout::Classic021 => "__tvm_ffi_library_ctx",
            Layout::Ffi => "__tvm_ffi__library_ctx",
        }
    }

    /// Bytes per argument slot: a `TVMValue` (8) or a `TVMFFIAny` (16, the value at 8).
    #[cfg(feature = "llvm")]
    fn slot_bytes(self) -> u64 {
        if self.ffi() {
            16
        } else {
            8
        }
    }
}

/// The offsets in DLPack's `DLTensor` (64-bit): `data`, `device.device_type`, `ndim`, `dtype`
/// (code, bits, lanes: float32 reads 0x0001_2002 as a little-endian `u32`), `shape`,
/// `byte_offset`.
#[cfg_attr(not(feature = "llvm"), allow(dead_code))]
mod dltensor {
    pub const DATA: u64 = 0;
    pub const DEVICE_TYPE: u64 = 8;
    pub const NDIM: u64 = 16;
    pub const DTYPE: u64 = 20;
    pub const SHAPE: u64 = 24;
    pub const BYTE_OFFSET: u64 = 40;
    pub const FLOAT32: u64 = 0x0001_2002;
    pub const CPU: u64 = 1;
}

/// The host functions in C in `conv`'s convention, for builds without LLVM.
#[cfg(not(feature = "llvm"))]
pub fn host_c_source(conv: Convention) -> String {
    let abi = if conv.ffi() {
        format!(
            "typedef struct {{ int32_t type_index; uint32_t zero_padding; union {{ int64_t v_int64; double v_float64; void* v_ptr; }}; }} TVMFFIAny;\n\
             void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message);\n\
             void* {slot} = NULL;\n\
             #define ARGS void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* ret\n\
             #define TENSOR(i) (args[i].type_index == {code} ? (const DLTensor*)args[i].v_ptr : NULL)\n\
             #define FAIL(message) do {{ TVMFFIErrorSetRaisedFromCStr(\"TypeError\", message); return -1; }} while (0)\n\
             #define RETURN_FLOAT(x) do {{ ret->type_index = 3; ret->zero_padding = 0; ret->v_float64 = (x); }} while (0)\n",
            slot = conv.context_slot(),
            code = DLTENSOR_CODE,
        )
    } else {
        format!(
            "typedef union {{ int64_t v_int64; double v_float64; void* v_handle; }} TVMValue;\n\
             void TVMAPISetLastError(const char* message);\n\
             void* {slot} = NULL;\n\
             #define ARGS TVMValue* args, int32_t* type_codes, int32_t num_args, TVMValue* ret, int32_t* ret_code, void* resource\n\
             #define TENSOR(i) (type_codes[i] == {code} ? (const DLTensor*)args[i].v_handle : NULL)\n\
             #define FAIL(message) do {{ TVMAPISetLastError(message); return -1; }} while (0)\n\
             #define RETURN_FLOAT(x) do {{ ret->v_float64 = (x); *ret_code = 2; }} while (0)\n",
            slot = conv.context_slot(),
            code = DLTENSOR_CODE,
        )
    };
    format!(
        r#"#include <stddef.h>
#include <stdint.h>

/* DLPack's tensor. */
typedef struct {{
  void* data;
  int32_t device_type, device_id;
  int32_t ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
}} DLTensor;

{abi}
static int is_f32_vector(const DLTensor* t) {{
  return t && t->device_type == 1 && t->ndim == 1 && t->code == 2 && t->bits == 32 && t->lanes == 1;
}}

static const float* f32_data(const DLTensor* t) {{
  return (const float*)((const char*)t->data + t->byte_offset);
}}

int32_t {add}(ARGS) {{
  if (num_args != 3) FAIL("{add_takes}");
  const DLTensor *a = TENSOR(0), *b = TENSOR(1), *out = TENSOR(2);
  if (!is_f32_vector(a) || !is_f32_vector(b) || !is_f32_vector(out)) FAIL("{add_takes}");
  int64_t n = a->shape[0];
  if (b->shape[0] != n || out->shape[0] != n) FAIL("{add_takes}");
  const float *x = f32_data(a), *y = f32_data(b);
  float* z = (float*)f32_data(out);
  for (int64_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
  return 0;
}}

int32_t {dot}(ARGS) {{
  if (num_args != 2) FAIL("{dot_takes}");
  const DLTensor *a = TENSOR(0), *b = TENSOR(1);
  if (!is_f32_vector(a) || !is_f32_vector(b) || b->shape[0] != a->shape[0]) FAIL("{dot_takes}");
  const float *x = f32_data(a), *y = f32_data(b);
  float acc = 0.0f;
  for (int64_t i = 0; i < a->shape[0]; ++i) acc += x[i] * y[i];
  RETURN_FLOAT(acc);
  return 0;
}}
"#,
        add = conv.symbol(HOST_ADD),
        dot = conv.symbol(HOST_DOT),
        add_takes = ADD_TAKES,
        dot_takes = DOT_TAKES,
    )
}

/// The host functions built with inkwell in `conv`'s convention, as a compiler backend would
/// hand them over.
#[cfg(feature = "llvm")]
pub fn host_llvm_module(
    ctx: &inkwell::context::Context,
    conv: Convention,
) -> crate::Result<inkwell::module::Module<'_>> {
    let module = ctx.create_module("mblob_demo_host");
    let gen = llvm_host::HostGen::new(ctx, conv);
    gen.build(&module).map_err(|e| crate::Error::Llvm { step: "build demo host", message: e.to_string() })?;
    module.verify().map_err(|m| crate::Error::Llvm { step: "verify demo host", message: m.to_string() })?;
    Ok(module)
}

#[cfg(feature = "llvm")]
mod llvm_host {
    use inkwell::builder::{Builder, BuilderError};
    use inkwell::context::Context;
    use inkwell::module::Module;
    use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum, FloatType, IntType};
    use inkwell::values::{FunctionValue, IntValue, PointerValue};
    use inkwell::{AddressSpace, IntPredicate};

    use super::{dltensor, Convention, ADD_TAKES, DLTENSOR_CODE, DOT_TAKES, HOST_ADD, HOST_DOT};

    type Body<'a, 'ctx> = &'a dyn Fn(IntValue<'ctx>) -> Result<(), BuilderError>;

    pub struct HostGen<'ctx> {
        ctx: &'ctx Context,
        conv: Convention,
        b: Builder<'ctx>,
        f32t: FloatType<'ctx>,
        i32t: IntType<'ctx>,
        i64t: IntType<'ctx>,
    }

    /// The parameters of one packed function, as addresses (integers) and the count.
    struct Params<'ctx> {
        f: FunctionValue<'ctx>,
        args: IntValue<'ctx>,
        /// The classic ABI's type codes (`None` for tvm-ffi: the index is in each slot).
        codes: Option<IntValue<'ctx>>,
        num_args: IntValue<'ctx>,
        ret: IntValue<'ctx>,
        /// The classic ABI's return type code.
        ret_code: Option<IntValue<'ctx>>,
    }

    impl<'ctx> HostGen<'ctx> {
        pub fn new(ctx: &'ctx Context, conv: Convention) -> Self {
            HostGen {
                ctx,
                conv,
                b: ctx.create_builder(),
                f32t: ctx.f32_type(),
                i32t: ctx.i32_type(),
                i64t: ctx.i64_type(),
            }
        }

        /// Loads an integer of type `ty` at address `base + offset`, widened to i64 (zero
        /// extended). Addresses are computed with integer arithmetic: inkwell's GEP is an
        /// `unsafe fn`, and this crate has no unsafe code; LLVM folds both forms to the same
        /// machine code.
        fn load_int(
            &self,
            ty: IntType<'ctx>,
            base: IntValue<'ctx>,
            offset: u64,
        ) -> Result<IntValue<'ctx>, BuilderError> {
            let v = self.b.build_load(self.at(ty.into(), base, offset)?, "v")?.into_int_value();
            if ty.get_bit_width() < 64 {
                self.b.build_int_z_extend(v, self.i64t, "wide")
            } else {
                Ok(v)
            }
        }

        /// A pointer to a `ty` at `base + offset`.
        fn at(
            &self,
            ty: BasicTypeEnum<'ctx>,
            base: IntValue<'ctx>,
            offset: u64,
        ) -> Result<PointerValue<'ctx>, BuilderError> {
            let addr = self.b.build_int_add(base, self.i64t.const_int(offset, false), "addr")?;
            self.b.build_int_to_ptr(addr, ty.ptr_type(AddressSpace::default()), "p")
        }

        /// `a == b` of two i64s.
        fn eq(&self, a: IntValue<'ctx>, b: u64) -> Result<IntValue<'ctx>, BuilderError> {
            self.b.build_int_compare(IntPredicate::EQ, a, self.i64t.const_int(b, false), "eq")
        }

        /// Declares the packed function `name` in the convention's signature; its entry block
        /// is current after.
        fn declare(&self, module: &Module<'ctx>, name: &str) -> Result<Params<'ctx>, BuilderError> {
            let ptr: BasicMetadataTypeEnum<'ctx> = self.ctx.i8_type().ptr_type(AddressSpace::default()).into();
            let params: Vec<BasicMetadataTypeEnum<'ctx>> = if self.conv.ffi() {
                vec![ptr, ptr, self.i32t.into(), ptr]
            } else {
                vec![ptr, ptr, self.i32t.into(), ptr, ptr, ptr]
            };
            let f = module.add_function(&self.conv.symbol(name), self.i32t.fn_type(&params, false), None);
            self.b.position_at_end(self.ctx.append_basic_block(f, "entry"));
            let param = |i: u32| f.get_nth_param(i).ok_or(BuilderError::UnsetPosition);
            let addr = |i: u32| -> Result<IntValue<'ctx>, BuilderError> {
                self.b.build_ptr_to_int(param(i)?.into_pointer_value(), self.i64t, "addr")
            };
            Ok(if self.conv.ffi() {
                Params {
                    f,
                    args: addr(1)?,
                    codes: None,
                    num_args: param(2)?.into_int_value(),
                    ret: addr(3)?,
                    ret_code: None,
                }
            } else {
                Params {
                    f,
                    args: addr(0)?,
                    codes: Some(addr(1)?),
                    num_args: param(2)?.into_int_value(),
                    ret: addr(3)?,
                    ret_code: Some(addr(4)?),
                }
            })
        }

        /// Returns -1 after reporting `message` as the convention reports errors.
        fn fail(
            &self,
            module: &Module<'ctx>,
            p: &Params<'ctx>,
            message: &str,
        ) -> Result<inkwell::basic_block::BasicBlock<'ctx>, BuilderError> {
            let block = self.ctx.append_basic_block(p.f, "fail");
            let here = self.b.get_insert_block().ok_or(BuilderError::UnsetPosition)?;
            self.b.position_at_end(block);
            let text = self.b.build_global_string_ptr(message, "message")?.as_pointer_value();
            let str_type: BasicMetadataTypeEnum<'ctx> = self.ctx.i8_type().ptr_type(AddressSpace::default()).into();
            let void = self.ctx.void_type();
            if self.conv.ffi() {
                let name = "TVMFFIErrorSetRaisedFromCStr";
                let f = module
                    .get_function(name)
                    .unwrap_or_else(|| module.add_function(name, void.fn_type(&[str_type, str_type], false), None));
                let kind = self.b.build_global_string_ptr("TypeError", "kind")?.as_pointer_value();
                self.b.build_call(f, &[kind.into(), text.into()], "")?;
            } else {
                let name = "TVMAPISetLastError";
                let f = module
                    .get_function(name)
                    .unwrap_or_else(|| module.add_function(name, void.fn_type(&[str_type], false), None));
                self.b.build_call(f, &[text.into()], "")?;
            }
            self.b.build_return(Some(&self.i32t.const_int(u64::MAX, true)))?;
            self.b.position_at_end(here);
            Ok(block)
        }

        /// Checks that the call has `n` arguments, all `DLTensor*`s of float32 vectors on the
        /// CPU of one length, going to `fail` otherwise; returns the tensors' addresses and the
        /// length.
        fn tensors(
            &self,
            p: &Params<'ctx>,
            n: u64,
            fail: inkwell::basic_block::BasicBlock<'ctx>,
        ) -> Result<(Vec<IntValue<'ctx>>, IntValue<'ctx>), BuilderError> {
            let count = self.b.build_int_z_extend(p.num_args, self.i64t, "n")?;
            let codes = self.ctx.append_basic_block(p.f, "codes");
            self.b.build_conditional_branch(self.eq(count, n)?, codes, fail)?;
            self.b.position_at_end(codes);
            let mut ok = self.ctx.bool_type().const_int(1, false);
            for i in 0..n {
                let code = match p.codes {
                    Some(codes) => self.load_int(self.i32t, codes, 4 * i)?,
                    None => self.load_int(self.i32t, p.args, self.conv.slot_bytes() * i)?,
                };
                ok = self.b.build_and(ok, self.eq(code, DLTENSOR_CODE)?, "ok")?;
            }
            let shapes = self.ctx.append_basic_block(p.f, "tensors");
            self.b.build_conditional_branch(ok, shapes, fail)?;
            self.b.position_at_end(shapes);
            let value_at = if self.conv.ffi() { 8 } else { 0 };
            let mut tensors = Vec::new();
            let mut ok = self.ctx.bool_type().const_int(1, false);
            let mut shapes = Vec::new();
            for i in 0..n {
                let t = self.load_int(self.i64t, p.args, self.conv.slot_bytes() * i + value_at)?;
                let device = self.load_int(self.i32t, t, dltensor::DEVICE_TYPE)?;
                let ndim = self.load_int(self.i32t, t, dltensor::NDIM)?;
                let dtype = self.load_int(self.i32t, t, dltensor::DTYPE)?;
                for c in [self.eq(device, dltensor::CPU)?, self.eq(ndim, 1)?, self.eq(dtype, dltensor::FLOAT32)?] {
                    ok = self.b.build_and(ok, c, "ok")?;
                }
                tensors.push(t);
                shapes.push(self.load_int(self.i64t, t, dltensor::SHAPE)?);
            }
            // The lengths are read once each tensor is known to be a vector (its shape has
            // one entry), in their own block.
            let lengths = self.ctx.append_basic_block(p.f, "lengths");
            self.b.build_conditional_branch(ok, lengths, fail)?;
            self.b.position_at_end(lengths);
            let first = *shapes.first().ok_or(BuilderError::UnsetPosition)?;
            let n0 = self.load_int(self.i64t, first, 0)?;
            let mut same = self.ctx.bool_type().const_int(1, false);
            for shape in &shapes[1..] {
                let ni = self.load_int(self.i64t, *shape, 0)?;
                same = self.b.build_and(same, self.b.build_int_compare(IntPredicate::EQ, ni, n0, "same")?, "same")?;
            }
            let body = self.ctx.append_basic_block(p.f, "body");
            self.b.build_conditional_branch(same, body, fail)?;
            self.b.position_at_end(body);
            Ok((tensors, n0))
        }

        /// The address of element `i` of tensor `t`'s float data (`data + byte_offset + 4 i`).
        fn element(&self, t: IntValue<'ctx>, i: IntValue<'ctx>) -> Result<PointerValue<'ctx>, BuilderError> {
            let data = self.load_int(self.i64t, t, dltensor::DATA)?;
            let offset = self.load_int(self.i64t, t, dltensor::BYTE_OFFSET)?;
            let base = self.b.build_int_add(data, offset, "base")?;
            let at =
                self.b.build_int_add(base, self.b.build_int_mul(i, self.i64t.const_int(4, false), "off")?, "at")?;
            self.at(self.f32t.into(), at, 0)
        }

        /// A counted loop over `[0, n)` running `body(i)`; leaves the builder in the exit block.
        fn counted_loop(
            &self,
            f: FunctionValue<'ctx>,
            n: IntValue<'ctx>,
            body: Body<'_, 'ctx>,
        ) -> Result<(), BuilderError> {
            let entry = self.b.get_insert_block().ok_or(BuilderError::UnsetPosition)?;
            let head = self.ctx.append_basic_block(f, "head");
            let step = self.ctx.append_basic_block(f, "step");
            let exit = self.ctx.append_basic_block(f, "exit");
            self.b.build_unconditional_branch(head)?;
            self.b.position_at_end(head);
            let i = self.b.build_phi(self.i64t, "i")?;
            let iv = i.as_basic_value().into_int_value();
            let more = self.b.build_int_compare(IntPredicate::SLT, iv, n, "more")?;
            self.b.build_conditional_branch(more, step, exit)?;
            self.b.position_at_end(step);
            body(iv)?;
            let next = self.b.build_int_add(iv, self.i64t.const_int(1, false), "next")?;
            let latch = self.b.get_insert_block().ok_or(BuilderError::UnsetPosition)?;
            self.b.build_unconditional_branch(head)?;
            i.add_incoming(&[(&self.i64t.const_zero(), entry), (&next, latch)]);
            self.b.position_at_end(exit);
            Ok(())
        }

        pub fn build(&self, module: &Module<'ctx>) -> Result<(), BuilderError> {
            let b = &self.b;
            let ptr = self.ctx.i8_type().ptr_type(AddressSpace::default());
            // The context slot the loader fills (it marks the code's TVM generation).
            let slot = module.add_global(ptr, Some(AddressSpace::default()), self.conv.context_slot());
            slot.set_initializer(&ptr.const_null());

            // mblob_demo_add(a, b, out)
            let p = self.declare(module, HOST_ADD)?;
            let fail = self.fail(module, &p, ADD_TAKES)?;
            let (t, n) = self.tensors(&p, 3, fail)?;
            self.counted_loop(p.f, n, &|i| {
                let x = b.build_load(self.element(t[0], i)?, "x")?.into_float_value();
                let y = b.build_load(self.element(t[1], i)?, "y")?.into_float_value();
                b.build_store(self.element(t[2], i)?, b.build_float_add(x, y, "sum")?)?;
                Ok(())
            })?;
            b.build_return(Some(&self.i32t.const_zero()))?;

            // mblob_demo_dot(a, b) -> float
            let p = self.declare(module, HOST_DOT)?;
            let fail = self.fail(module, &p, DOT_TAKES)?;
            let (t, n) = self.tensors(&p, 2, fail)?;
            let acc = b.build_alloca(self.f32t, "acc")?;
            b.build_store(acc, self.f32t.const_zero())?;
            self.counted_loop(p.f, n, &|i| {
                let x = b.build_load(self.element(t[0], i)?, "x")?.into_float_value();
                let y = b.build_load(self.element(t[1], i)?, "y")?.into_float_value();
                let old = b.build_load(acc, "old")?.into_float_value();
                b.build_store(acc, b.build_float_add(old, b.build_float_mul(x, y, "prod")?, "new")?)?;
                Ok(())
            })?;
            let result = b.build_load(acc, "result")?.into_float_value();
            let wide = b.build_float_ext(result, self.ctx.f64_type(), "wide")?;
            // The float result: a `TVMValue` and type code 2 (classic), or a `TVMFFIAny` of
            // type index 3 (tvm-ffi: index, padding, value).
            match p.ret_code {
                Some(code) => {
                    b.build_store(self.at(self.ctx.f64_type().into(), p.ret, 0)?, wide)?;
                    b.build_store(self.at(self.i32t.into(), code, 0)?, self.i32t.const_int(2, false))?;
                }
                None => {
                    b.build_store(self.at(self.i32t.into(), p.ret, 0)?, self.i32t.const_int(3, false))?;
                    b.build_store(self.at(self.i32t.into(), p.ret, 4)?, self.i32t.const_zero())?;
                    b.build_store(self.at(self.ctx.f64_type().into(), p.ret, 8)?, wide)?;
                }
            }
            b.build_return(Some(&self.i32t.const_zero()))?;
            Ok(())
        }
    }
}
