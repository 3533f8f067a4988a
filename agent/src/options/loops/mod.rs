//! Exact loop counts (`RTPROF_LOOPS`): the loops of the functions a user
//! names are found in their code (`plan`), each loop's entry and back
//! edges get probes (`probes`), whose counts are kept per thread and
//! written at exit (`counts`).

pub mod counts;
pub mod plan;
pub mod probes;
