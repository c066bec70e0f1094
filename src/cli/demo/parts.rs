//! The pieces of `mblob demo`: a host part with real functions (built with inkwell when the
//! `llvm` feature is on, from C otherwise), a vector-add PTX kernel, and the graph factory
//! that roots the tree. The orchestration lives in `cli/demo/mod.rs`.

/// The demo's CUDA kernel, hand-written PTX: `mblob_vector_add(a, b, out, n)` sets
/// `out[i] = a[i] + b[i]` for `i < n`, one thread per element.
pub const VECTOR_ADD_PTX: &str = include_str!("../../../data/vector_add.ptx");

/// Name of the kernel in [`VECTOR_ADD_PTX`].
pub const KERNEL_NAME: &str = "mblob_vector_add";

/// Name of the host function: `void mblob_demo_add(const float* a, const float* b, float* out,
/// int64_t n)` sets `out[i] = a[i] + b[i]`.
pub const HOST_ADD: &str = "mblob_demo_add";

/// Name of the second host function: `float mblob_demo_dot(const float* a, const float* b,
/// int64_t n)` returns the dot product.
pub const HOST_DOT: &str = "mblob_demo_dot";

/// The host functions in C, for builds without LLVM.
#[cfg(not(feature = "llvm"))]
pub const HOST_C_SOURCE: &str = r#"#include <stdint.h>

void mblob_demo_add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

float mblob_demo_dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}
"#;

/// The host functions built with inkwell, as a compiler backend would hand them over.
#[cfg(feature = "llvm")]
pub fn host_llvm_module(ctx: &inkwell::context::Context) -> crate::Result<inkwell::module::Module<'_>> {
    let module = ctx.create_module("mblob_demo_host");
    let gen = llvm_host::HostGen::new(ctx);
    gen.build(&module).map_err(|e| crate::Error::Llvm { step: "build demo host", message: e.to_string() })?;
    module.verify().map_err(|m| crate::Error::Llvm { step: "verify demo host", message: m.to_string() })?;
    Ok(module)
}

#[cfg(feature = "llvm")]
mod llvm_host {
    use inkwell::builder::{Builder, BuilderError};
    use inkwell::context::Context;
    use inkwell::module::Module;
    use inkwell::types::{FloatType, IntType, PointerType};
    use inkwell::values::{FunctionValue, IntValue, PointerValue};
    use inkwell::{AddressSpace, IntPredicate};

    use super::{HOST_ADD, HOST_DOT};

    type Body<'a, 'ctx> = &'a dyn Fn(IntValue<'ctx>) -> Result<(), BuilderError>;

    pub struct HostGen<'ctx> {
        ctx: &'ctx Context,
        b: Builder<'ctx>,
        f32t: FloatType<'ctx>,
        i64t: IntType<'ctx>,
        ptr: PointerType<'ctx>,
    }

    impl<'ctx> HostGen<'ctx> {
        pub fn new(ctx: &'ctx Context) -> Self {
            let f32t = ctx.f32_type();
            HostGen {
                ctx,
                b: ctx.create_builder(),
                f32t,
                i64t: ctx.i64_type(),
                ptr: f32t.ptr_type(AddressSpace::default()),
            }
        }

        /// Element `i` of a float array. The address is computed with integer arithmetic:
        /// inkwell's GEP is an `unsafe fn`, and this crate has no unsafe code; LLVM folds both
        /// forms to the same machine code.
        fn element(&self, base: PointerValue<'ctx>, i: IntValue<'ctx>) -> Result<PointerValue<'ctx>, BuilderError> {
            let addr = self.b.build_ptr_to_int(base, self.i64t, "addr")?;
            let offset = self.b.build_int_mul(i, self.i64t.const_int(4, false), "offset")?;
            let at = self.b.build_int_add(addr, offset, "at")?;
            self.b.build_int_to_ptr(at, self.ptr, "elem")
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
            let step = self.ctx.append_basic_block(f, "body");
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
            let (b, f32t, i64t, ptr) = (&self.b, self.f32t, self.i64t, self.ptr);
            let param = |f: FunctionValue<'ctx>, i| f.get_nth_param(i).ok_or(BuilderError::UnsetPosition);

            // void mblob_demo_add(const float* a, const float* b, float* out, int64_t n)
            let add_type = self.ctx.void_type().fn_type(&[ptr.into(), ptr.into(), ptr.into(), i64t.into()], false);
            let add = module.add_function(HOST_ADD, add_type, None);
            b.position_at_end(self.ctx.append_basic_block(add, "entry"));
            let (x, y) = (param(add, 0)?.into_pointer_value(), param(add, 1)?.into_pointer_value());
            let (out, n) = (param(add, 2)?.into_pointer_value(), param(add, 3)?.into_int_value());
            self.counted_loop(add, n, &|i| {
                let xi = b.build_load(self.element(x, i)?, "x")?.into_float_value();
                let yi = b.build_load(self.element(y, i)?, "y")?.into_float_value();
                b.build_store(self.element(out, i)?, b.build_float_add(xi, yi, "sum")?)?;
                Ok(())
            })?;
            b.build_return(None)?;

            // float mblob_demo_dot(const float* a, const float* b, int64_t n)
            let dot_type = f32t.fn_type(&[ptr.into(), ptr.into(), i64t.into()], false);
            let dot = module.add_function(HOST_DOT, dot_type, None);
            b.position_at_end(self.ctx.append_basic_block(dot, "entry"));
            let acc = b.build_alloca(f32t, "acc")?;
            b.build_store(acc, f32t.const_zero())?;
            let (x, y, n) = (
                param(dot, 0)?.into_pointer_value(),
                param(dot, 1)?.into_pointer_value(),
                param(dot, 2)?.into_int_value(),
            );
            self.counted_loop(dot, n, &|i| {
                let xi = b.build_load(self.element(x, i)?, "x")?.into_float_value();
                let yi = b.build_load(self.element(y, i)?, "y")?.into_float_value();
                let old = b.build_load(acc, "old")?.into_float_value();
                b.build_store(acc, b.build_float_add(old, b.build_float_mul(xi, yi, "prod")?, "new")?)?;
                Ok(())
            })?;
            let result = b.build_load(acc, "result")?;
            b.build_return(Some(&result))?;
            Ok(())
        }
    }
}
