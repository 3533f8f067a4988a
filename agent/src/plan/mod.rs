//! What to do with each function: one pipeline per module (cache or
//! analysis, then the per-process check of the bytes in memory).

pub mod analysis;
pub mod cache;
pub(crate) mod pipeline;
