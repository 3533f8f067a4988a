//! fork(): the child gets a counter segment of its own, starting from zero,
//! at the same address. vfork and posix_spawn children run no fork handlers
//! and do nothing here before they exec.

use crate::log::vlog;
use crate::{agent, threads};

extern "C" fn in_child() {
    let _ = std::panic::catch_unwind(|| {
        let Some(a) = agent() else { return };
        let w = &a.segment.writer;
        let p = threads::stripe() as u64;
        let first = w.stripe_ptr(0) as u64;
        let bytes = w.layout().stripe_bytes;
        let keep = (p >= first && p < first + bytes * w.layout().caps.stripes as u64)
            .then(|| ((p - first) / bytes) as u32)
            .filter(|&i| i != 0);
        let (pid, ppid) = (std::process::id(), unsafe { libc::getppid() } as u32);
        if let Err(e) = a.segment.reopen_in_child(keep, pid, ppid, crate::now_ns()) {
            vlog!("{e}; this child's calls are not recorded");
        }
    });
}

pub fn install_handler() {
    unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
}
