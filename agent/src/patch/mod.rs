//! Carrying plans out: stub memory near each module, the stubs, and the
//! entries rewritten into jumps to them.

pub mod install;
pub mod stubmem;
