//! Helpers shared by the integration tests.

pub mod adversarial;
pub mod blobs;
