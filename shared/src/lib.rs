//! The ABI shared by the rtprof agent and its readers: the counter segment's
//! layout, a writer for the agent, a validating reader, and reports.

pub mod cachedir;
pub mod cfg;
mod codes;
pub mod count_table;
pub mod debuginfo;
pub mod files;
pub mod glob;
pub mod json;
pub mod layout;
pub mod loops;
pub mod names;
pub mod present;
pub mod protocol;
pub mod reader;
pub mod refusal;
pub mod report;
pub mod sampling;
pub mod syscall_restart;
pub mod writer;

pub use glob::glob_match;
pub use layout::{Capacities, Layout};
pub use reader::{
    read_cost, read_function_flags, read_header, read_snapshot, AgentCost, Callers, EventCounts,
    EventStatus, Events, FunctionStats, ModuleStats, SegmentError, Snapshot, Stack, Stacks,
    ThreadCalls, Threads,
};
pub use refusal::Refusal;
pub use writer::{SegmentWriter, WriteError};
