//! Carrying plans out: stub memory near each module, the stubs, and the
//! entries rewritten into jumps to them; and counting switched per stub.

pub mod install;
pub mod loop_probes;
pub mod stopworld;
pub mod stubmem;
pub mod switch;
pub mod traps;
