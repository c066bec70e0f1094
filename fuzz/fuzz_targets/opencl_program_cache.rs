//! The reader of TVM's OpenCL program cache (the bytes `opencl.SetPreCompiledPrograms` takes,
//! `device::program_cache::parse`): a typed error, or programs that lie within the input and
//! that `write` turns back into exactly the input (the reader refuses trailing bytes).
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{bounded, READ_FACTOR};
use mblob_runtime::device::program_cache::{parse, write};

fuzz_target!(|data: &[u8]| {
    let read = bounded(data.len(), READ_FACTOR, "program_cache::parse", || parse(data));
    match read {
        Err(e) => {
            let _ = e.to_string();
        }
        Ok(programs) => {
            let range = data.as_ptr_range();
            for p in &programs {
                assert!(!p.name.is_empty(), "an empty kernel name was accepted");
                assert!(p.binary.is_empty() || range.contains(&p.binary.as_ptr()), "a binary outside the input");
            }
            let again = write(programs.iter().map(|p| (p.name, p.binary)));
            assert_eq!(again, data, "parse, write changed the bytes");
        }
    }
});
