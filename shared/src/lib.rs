//! What the rtprof agent and tool share beyond the ABI (`rtprof-abi`):
//! analysis (control flow and natural loops, `cfg`; names and their
//! demangling, `names`; separate debug files, `debuginfo`), the reports
//! rendered from a snapshot (`report`, `json`), and plumbing (secure file
//! writing, `files`; the plan cache's directories, `cachedir`; name globs,
//! `glob`; system calls retried after a signal, `syscall_restart`).

pub mod cachedir;
pub mod cfg;
pub mod debuginfo;
pub mod files;
pub mod glob;
pub mod json;
pub mod names;
pub mod report;
pub mod syscall_restart;

pub use glob::glob_match;
