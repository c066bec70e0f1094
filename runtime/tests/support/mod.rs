//! Helpers shared by the integration tests.

pub mod blobs;
pub mod adversarial;
