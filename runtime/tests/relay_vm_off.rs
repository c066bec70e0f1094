//! Without the `relay-vm` feature (`cargo test -p mblob-runtime --no-default-features --test
//! relay_vm_off`), a Relay VM library that TVM 0.19 built loads with its executable kept as raw
//! bytes, and a model of it is refused with an error naming the feature. With the feature this
//! file tests nothing (`relay_vm.rs` runs those libraries).
#![cfg(not(feature = "relay-vm"))]

use std::path::Path;

use mblob_runtime::exec::model::Model;
use mblob_runtime::{load_library, Device, LoadOptions, Registry};

#[test]
fn relay_vm_model_is_refused_without_the_feature() {
    let so = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/relay-vm/closure.so");
    // SAFETY: a library TVM built for the tests; running its initialisers is what TVM's own
    // loader does.
    let tree = unsafe { load_library(&so, &Registry::default(), &LoadOptions::default()) }.unwrap();
    assert_eq!(tree.type_keys()[0], "VMExecutable");
    let err = Model::new(&tree, Device::cpu(0)).unwrap_err().to_string();
    assert!(err.contains("Relay VM executable") && err.contains("`relay-vm` feature"), "{err}");
}
