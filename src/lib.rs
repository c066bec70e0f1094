//! mblob
