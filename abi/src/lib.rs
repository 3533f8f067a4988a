//! The ABI between the rtprof agent and its readers (`rtprof`, `rtprofd`,
//! schedulers): what one process writes and another reads, and nothing
//! else, so a reader links this crate and libc alone.
//!
//! - The counter segment (one per profiled process): `layout`, the
//!   agent's `writer`, the validating `reader`; the codes stored in it
//!   (`refusal`, `sampling`) and its table of samples by thread and
//!   function (`count_table`).
//! - The files the agent writes beside its segment at exit: their readers
//!   in `reader` (stacks, callers, threads, events) and `loops` (sample
//!   offsets, exact loop counts).
//! - The presentation segment rtprofd publishes for schedulers:
//!   `present`.
//! - rtprofd's socket: `protocol`; routing calls to offered
//!   implementations: `route`.
//! - `escape`: names read from a segment made safe to print.
//!
//! The C headers for programs and schedulers written in C are in
//! `include/`, the C reader of the presentation segment in `c/`.

mod codes;
pub mod count_table;
pub mod escape;
pub mod layout;
pub mod loops;
pub mod present;
pub mod protocol;
pub mod reader;
pub mod refusal;
pub mod route;
pub mod sampling;
pub mod writer;

pub use layout::{Capacities, Layout};
pub use reader::{
    read_cost, read_function_flags, read_header, read_snapshot, AgentCost, Callers, EventCounts,
    EventStatus, Events, FunctionStats, Implementation, ModuleStats, SegmentError, Snapshot, Stack,
    Stacks, ThreadCalls, Threads,
};
pub use refusal::Refusal;
pub use writer::{SegmentWriter, WriteError};

#[cfg(test)]
mod tests {
    /// Readers link this crate alone: a dependency added here is one
    /// every scheduler pulls in. Anything but libc belongs in
    /// `rtprof-shared` or the crate that needs it.
    #[test]
    fn the_abi_depends_on_libc_alone() {
        let manifest = include_str!("../Cargo.toml");
        let mut section = "";
        let mut deps = Vec::new();
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line;
            } else if section.contains("dependencies")
                && !section.contains("dev-dependencies")
                && !line.is_empty()
                && !line.starts_with('#')
            {
                deps.push((section, line.split('=').next().unwrap_or("").trim()));
            }
        }
        assert_eq!(deps, [("[dependencies]", "libc")], "{manifest}");
    }
}
