//! Carrying plans out: stub memory near each module, the stubs, and the
//! entries rewritten into jumps to them; and counting switched per stub.

pub mod image;
pub mod install;
pub mod stopworld;
pub mod stubmem;
pub mod switch;
