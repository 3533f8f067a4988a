//! Why a function was left unpatched. The numeric codes are part of the ABI.

use crate::codes::abi_codes;
use std::fmt;

abi_codes! {
pub enum Refusal {
    /// Fewer than 5 bytes of function and padding after the entry.
    TooSmall = 1,
    /// A direct branch (in this function or another) targets the overwritten bytes.
    BranchIntoWindow = 2,
    /// A jump-table entry targets the overwritten bytes.
    JumpTableIntoWindow = 3,
    /// An instruction in the window cannot be moved (e.g. `xbegin`, rsp-based call).
    UnsupportedInstruction = 4,
    /// A `call` in the window is not its last instruction, so its return
    /// address would point into the overwritten bytes.
    CallInWindow = 5,
    /// No executable memory could be mapped within ±2 GiB of the module.
    NoMemoryInRange = 6,
    /// The bytes at the entry do not decode as valid instructions.
    DecodeError = 7,
    /// The symbol has no size, so branches into its entry cannot be ruled out.
    UnknownSize = 8,
    /// Re-encoding the moved instructions at the stub failed (target out of range).
    RelocationFailed = 9,
    /// The entry could not be made writable or written.
    WriteFailed = 10,
    /// The function lies outside the module's executable segments.
    OutsideText = 11,
    /// The counter segment had no room left for the function.
    NoCounterSpace = 12,
    /// Not decided yet: the process ended while its module was being
    /// instrumented (recorded before the decision is made).
    NotAttempted = 13,
    /// The bytes at the entry differ from the file: a debugger's breakpoint
    /// or another tool's patch is there, and must stay as it is.
    ModifiedInMemory = 14,
}
}

impl Refusal {
    /// Stable snake_case name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::TooSmall => "too_small",
            Refusal::BranchIntoWindow => "branch_into_window",
            Refusal::JumpTableIntoWindow => "jump_table_into_window",
            Refusal::UnsupportedInstruction => "unsupported_instruction",
            Refusal::CallInWindow => "call_in_window",
            Refusal::NoMemoryInRange => "no_memory_in_range",
            Refusal::DecodeError => "decode_error",
            Refusal::UnknownSize => "unknown_size",
            Refusal::RelocationFailed => "relocation_failed",
            Refusal::WriteFailed => "write_failed",
            Refusal::OutsideText => "outside_text",
            Refusal::NoCounterSpace => "no_counter_space",
            Refusal::NotAttempted => "not_attempted",
            Refusal::ModifiedInMemory => "modified_in_memory",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::REASON_SLOTS;

    #[test]
    fn codes_round_trip_and_fit_module_record() {
        for &r in Refusal::ALL {
            assert_eq!(Refusal::from_code(r.code()), Some(r));
            assert!((r.code() as usize) < REASON_SLOTS);
        }
        assert_eq!(Refusal::from_code(0), None);
        assert_eq!(Refusal::from_code(99), None);
    }
}
