//! librtprof.so: the rtprof agent.
pub mod arch;
