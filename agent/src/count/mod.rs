//! Where calls are counted: the counter segment, each module's records in
//! it, per-thread stripes, which functions count now, registration with
//! rtprofd, and the C API.

pub mod api;
pub(crate) mod budget;
pub mod callers;
pub mod cost;
pub mod loop_counts;
pub(crate) mod records;
pub mod register;
pub mod segment;
pub mod switching;
pub mod thread_counts;
pub mod threads;
