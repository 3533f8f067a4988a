//! What changes after start-up, behind one lock: the stub map (libraries
//! loaded and unloaded), the modules known, the counter segment's metadata
//! writer, and the overhead budget's controller. Held by the loader hook,
//! the drain thread naming modules, counting switches and the budget (see
//! `lock` for how it waits, re-enters and resets in a fork child).

use crate::lifecycle::loader::Known;
use crate::options::budget::Controller;
use crate::patch::install::StubMap;
use rtprof_abi::SegmentWriter;

/// The state the lock guards.
pub struct Locked {
    pub stubs: StubMap,
    pub known: Known,
    pub budget: Option<Controller>,
    /// Implementations offered, and the functions routed to them.
    pub routes: crate::options::routes::Routes,
    /// Module and function records: one writer, so `&mut` through the guard.
    pub writer: SegmentWriter,
}

/// The lock over [`Locked`].
pub type StateLock = super::lock::Lock<Locked>;
