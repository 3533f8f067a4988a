//! The presentation segment: what `rtprofd` publishes every tick for
//! schedulers and `rtprof top/report` to read.
//!
//! Two buffers and a generation counter: the daemon writes the buffer
//! readers are not using, then flips the generation, so a reader never
//! waits and never sees a half-written table. Each buffer also carries a
//! sequence number (odd while written) so a reader that was lapped by two
//! publishes notices and retries, and the time it was published, so a
//! reader can tell a live daemon's table from the last one of a daemon that
//! died (the file stays behind with its last span in it).
//!
//! `layout` is the format (shared with the C reader), `writer` the
//! daemon's side, `reader` the validating readers'.

mod layout;
mod reader;
mod writer;

pub use layout::{
    key_hash, now_ns, segment_bytes, BufferHeader, Claim, PresentError, PresentHeader, ProcEntry,
    Row, MAGIC, PROC_ENDED, ROW_ACCELERATED, ROW_ACTIVE, ROW_AGENT, ROW_AT_LEAST, ROW_COUNTED,
    ROW_COUNTING_OFF, ROW_ESTIMATED, ROW_GLOBAL, ROW_IMPLEMENTATION, ROW_OFFERED, ROW_THREAD,
    ROW_THREAD_HEAD, STALE_SLACK_NS, STALE_TICKS, VERSION,
};
pub use reader::{
    age, lookup, open_file, read_process, read_process_into, read_view, OpenError, ProcView,
    ProcessRows, RowRef, RowView, ThreadView, View,
};
pub use writer::{
    IdRow, PresentWriter, ProcRows, ProcTable, RowIn, RowNames, ThreadRows, AGENT_MODULE,
    UNKNOWN_MODULE,
};
