//! x86-64: decoding and re-encoding with iced-x86.

mod scan;
mod stub;
mod window;

pub use scan::{jump_table_targets, scan_function, FunctionScan};
pub use stub::{counting_switch, emit_stub, entry_patch, stub_len, CounterRef};
pub use window::{plan_window, FixKind, Fixup, Plan, MAX_FIXUPS, MAX_WINDOW, MIN_WINDOW};

/// Stubs must be reachable from the entry with a `jmp rel32`.
pub const BRANCH_RANGE: u64 = 0x7FFF_0000;
