//! Where calls are counted: the counter segment, each module's records in
//! it, per-thread stripes, which functions count now, registration with
//! rtprofd, and the C API.

pub mod api;
pub mod cost;
pub(crate) mod records;
pub mod register;
pub mod segment;
pub(crate) mod stripes;
pub mod thread_rows;
pub mod threads;
