//! The process's life as the agent follows it: start-up before `main`,
//! libraries loaded and unloaded, fork, the image ending, and the
//! machine-wide controls that decide whether the agent acts at all.

pub(crate) mod credentials;
pub(crate) mod fork;
pub(crate) mod interpose;
pub(crate) mod libc_hooks;
pub(crate) mod loader;
pub(crate) mod lock;
pub(crate) mod locked;
pub(crate) mod private_files;
pub(crate) mod process_mark;
pub(crate) mod sandbox;
pub(crate) mod startup;
pub mod system;
pub(crate) mod worker;
