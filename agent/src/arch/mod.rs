//! Instruction-set specifics, behind one interface: scanning a function for
//! branch targets, choosing the window of instructions to move, encoding the
//! counting stub, and the bytes written over the entry. A second
//! architecture is a sibling folder exporting the same items.

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::*;
