//! The counter segment in shared memory: an anonymous memfd, or a file in the
//! private directory `rtprof run` collects from. Memory is reserved before
//! use (fallocate for the metadata, MADV_POPULATE_WRITE for a thread's
//! stripe), so a full disk or tmpfs means "no new stripe" (the thread counts
//! in the shared stripe), never SIGBUS in the host. Once mapped, the file's
//! descriptor is closed: the program never sees a descriptor it did not open.

use crate::count::stripes::Stripes;
use crate::error::CountError;
use crate::log::vlog;
use rtprof_abi::layout::PAGE;
use rtprof_abi::writer::Counters;
use rtprof_abi::{Capacities, Layout, SegmentWriter};
use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The mapped segment: its counters (lock-free, for every thread) and
/// what its forked children need. The metadata writer, made with it, is
/// kept under the agent's state lock.
pub struct Segment {
    pub counters: Counters,
    /// The run directory (if any), for the segment of a forked child.
    run_dir: Option<CString>,
    /// Functions whose counters every stripe must have memory for: raised
    /// before records are added, so a thread that takes a stripe meanwhile
    /// backs them too.
    reserved_funcs: AtomicU32,
    /// Functions and name bytes whose records already have memory
    /// (`funcs << 32 | strings`): each reservation backs only what is new.
    records_backed: AtomicU64,
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// Opens `<dir>/<pid>-<n>.seg`, after checking the directory is ours alone.
fn create_in_dir(dir: &CStr) -> Result<libc::c_int, CountError> {
    let shown = || dir.to_string_lossy();
    // SAFETY: a NUL-terminated path; opening only reads it.
    let dfd = unsafe {
        libc::open(
            dir.as_ptr(),
            libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_RDONLY,
        )
    };
    if dfd < 0 {
        return Err(CountError::RunDir(format!("{}: {}", shown(), last_err())));
    }
    // SAFETY: `stat` is integers, for which zero bytes are valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dfd` is open and `st` a live local that fstat writes.
    let ok = unsafe { libc::fstat(dfd, &mut st) } == 0
            // SAFETY: takes nothing.
        && st.st_uid == unsafe { libc::geteuid() }
        && st.st_mode & 0o077 == 0;
    if !ok {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(dfd) };
        return Err(CountError::RunDir(format!(
            "{}: not a private directory owned by this user",
            shown()
        )));
    }
    let pid = std::process::id();
    let mut result = Err(CountError::Create(io::Error::from_raw_os_error(
        libc::EEXIST,
    )));
    // An exec'd program keeps its pid: it takes the next free number.
    for n in 0..1000 {
        let name = segment_name(pid, n);
        // SAFETY: `dfd` is open; `name` is NUL-terminated (segment_name leaves zeros after it).
        let fd = unsafe {
            libc::openat(
                dfd,
                name.as_ptr().cast(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd >= 0 {
            FILE.store((pid as u64) << 32 | n as u64, Ordering::Relaxed);
            result = Ok(fd);
            break;
        }
        let e = last_err();
        if e.raw_os_error() != Some(libc::EEXIST) {
            result = Err(CountError::Create(e));
            break;
        }
    }
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(dfd) };
    result
}

/// Writes `bytes` to `<dir>/<pid>-<n>.<suffix>`, beside this process's
/// segment file there (none: nothing is written). A new file, private, in
/// the private run directory. It appears whole or not at all: written
/// under a hidden name first, then linked to its own. `rtprof run` reads
/// the directory once its program has exited, while a process the program
/// left behind (a helper ending after it) may still be writing.
fn write_beside_file(dir: &std::ffi::OsStr, suffix: &str, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let at = FILE.load(Ordering::Relaxed);
    if at == u64::MAX || (at >> 32) as u32 != std::process::id() {
        return Ok(());
    }
    let name = format!("{}-{}.{suffix}", at >> 32, at & 0xffff_ffff);
    let dir = std::path::Path::new(dir);
    let (part, path) = (dir.join(format!(".{name}.part")), dir.join(name));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&part)?
        .write_all(bytes);
    // A link, not a rename: an existing file of that name is never replaced.
    let linked = written.and_then(|()| std::fs::hard_link(&part, &path));
    let _ = std::fs::remove_file(&part);
    linked
}

/// The pid and number of this process's segment file in the run directory
/// (`pid << 32 | n`), for the files written beside it.
static FILE: AtomicU64 = AtomicU64::new(u64::MAX);

/// `<pid>-<n>.seg`, NUL-terminated, built without the heap: a forked
/// child runs this before other libraries' fork handlers have released
/// their allocator's locks.
fn segment_name(pid: u32, n: u32) -> [u8; 32] {
    fn put(buf: &mut [u8; 32], at: &mut usize, v: u32) {
        let mut digits = [0u8; 10];
        let (mut v, mut k) = (v, 0);
        loop {
            digits[k] = b'0' + (v % 10) as u8;
            v /= 10;
            k += 1;
            if v == 0 {
                break;
            }
        }
        for d in digits[..k].iter().rev() {
            buf[*at] = *d;
            *at += 1;
        }
    }
    let mut buf = [0u8; 32];
    let mut at = 0;
    put(&mut buf, &mut at, pid);
    buf[at] = b'-';
    at += 1;
    put(&mut buf, &mut at, n);
    buf[at..at + 4].copy_from_slice(b".seg");
    buf
}

/// Ended threads' stripes folded together: each keeps its memory until
/// then, and a thread that finds no stripe free has them folded first.
const FOLD_BATCH: u32 = 4;

/// Backs `len` bytes of the mapping at `addr` with memory now, reporting
/// failure instead of a later SIGBUS. (Linux 5.14+; before that, threads
/// count in the shared stripe.)
fn populate(addr: *mut u64, len: u64) -> io::Result<()> {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: callers pass a range of our own shared mapping; populating changes no contents.
    match unsafe { libc::madvise(addr.cast(), len as usize, MADV_POPULATE_WRITE) } {
        0 => Ok(()),
        _ => Err(last_err()),
    }
}

fn reserve(fd: libc::c_int, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: only reserves blocks of our own file; a bad range makes it fail.
    match unsafe { libc::fallocate(fd, 0, off as libc::off_t, len as libc::off_t) } {
        0 => Ok(()),
        _ => Err(last_err()),
    }
}

/// The parts of a segment whose size does not depend on how many functions
/// it holds: header and module table, stripe table, the head of the
/// per-thread samples and each stripe's samples. (offset, length)
fn fixed_ranges(l: &Layout) -> [(u64, u64); 3] {
    [
        (0, l.funcs_off),
        (l.stripe_table_off, l.stripes_off - l.stripe_table_off),
        (
            l.thread_samples_off,
            l.thread_entries_off - l.thread_samples_off,
        ),
    ]
}

/// Gives memory to `len` bytes of the segment at `p` before they are first
/// written (the per-thread sample table's pages, as samples reach them):
/// whether it could. Async-signal-safe.
pub fn back_pages(p: *mut u8, len: usize) -> bool {
    let (lo, len) = pages(p as u64, len as u64);
    populate(lo as *mut u64, len).is_ok()
}

/// The parts that hold the first `funcs` functions and `strings` bytes of
/// names: function records, names, sample counters, the shared stripe.
fn record_ranges(l: &Layout, funcs: u32, strings: u32) -> [(u64, u64); 4] {
    let (funcs, strings) = (funcs as u64, strings as u64);
    let record = std::mem::size_of::<rtprof_abi::layout::FunctionRecord>() as u64;
    [
        (l.funcs_off, funcs * record),
        (l.strings_off, strings),
        (l.samples_off, funcs * 8),
        (l.stripes_off, funcs * 8),
    ]
}

/// Bytes of a stripe that hold the counters of `funcs` functions, in whole
/// pages.
fn stripe_bytes_for(l: &Layout, funcs: u32) -> u64 {
    (funcs as u64 * 8)
        .div_ceil(PAGE)
        .max(1)
        .saturating_mul(PAGE)
        .min(l.stripe_bytes)
}

/// `(off, len)` widened to whole pages.
fn pages(off: u64, len: u64) -> (u64, u64) {
    let lo = off / PAGE * PAGE;
    (lo, (off + len).div_ceil(PAGE) * PAGE - lo)
}

/// A new backing file of `layout.total_size` bytes whose fixed parts are
/// reserved.
fn new_backing(layout: &Layout, run_dir: Option<&CStr>) -> Result<libc::c_int, CountError> {
    let fd = match run_dir {
        Some(d) => create_in_dir(d)?,
        None => {
            // SAFETY: a NUL-terminated static name.
            let fd = unsafe {
                libc::memfd_create(
                    rtprof_abi::protocol::SEGMENT_MEMFD.as_ptr(),
                    libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
                )
            };
            if fd < 0 {
                return Err(CountError::Create(last_err()));
            }
            fd
        }
    };
    let fail = |e: CountError| {
        // Left empty, a run-dir file is skipped by rtprof; a file with
        // holes would make its reader allocate pages on a full tmpfs
        // (SIGBUS in the reader).
        // SAFETY: `fd` is this function's own descriptor, closed once here.
        unsafe {
            libc::ftruncate(fd, 0);
            libc::close(fd)
        };
        Err(e)
    };
    // The fixed parts (header, module table, stripe table) are reserved
    // before the file grows: a failed fallocate leaves it as it was. The
    // rest stays sparse and is reserved as it is used: function records,
    // names, sample counters and the shared stripe as functions are added
    // ([`Segment::reserve_records`]), a thread's stripe as it starts.
    for (off, len) in fixed_ranges(layout) {
        if let Err(e) = reserve(fd, off, len) {
            return fail(CountError::Reserve(e));
        }
    }
    // SAFETY: `fd` is this function's own new file.
    if unsafe { libc::ftruncate(fd, layout.total_size as libc::off_t) } != 0 {
        return fail(CountError::Reserve(last_err()));
    }
    if run_dir.is_none() {
        // Its size is final: sealed, the daemon can map it without fearing
        // a later shrink (SIGBUS). Best effort: unsealed, the daemon
        // refuses it, and profiling here goes on.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: seals our own memfd; takes integers only.
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
            vlog!("cannot seal the counter segment: {}", last_err());
        }
    }
    Ok(fd)
}

fn map(len: u64, fd: libc::c_int, at: *mut libc::c_void) -> Result<*mut u8, CountError> {
    let fixed = if at.is_null() { 0 } else { libc::MAP_FIXED };
    // SAFETY: maps our own file; `at` is null or, in a forked child, the parent's mapping of the
    // same size, which MAP_FIXED replaces in place (stubs hold its address).
    let p = unsafe {
        libc::mmap(
            at,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | fixed,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CountError::Map(last_err()));
    }
    Ok(p as *mut u8)
}

impl Segment {
    pub fn create(
        caps: Capacities,
        run_dir: Option<&str>,
        pid: u32,
        ppid: u32,
        start_ns: u64,
    ) -> Result<(Segment, SegmentWriter), CountError> {
        let layout = Layout::new(caps);
        let run_dir = run_dir
            .map(CString::new)
            .transpose()
            .map_err(|_| CountError::RunDir("NUL in path".into()))?;
        let fd = new_backing(&layout, run_dir.as_deref())?;
        let base = match map(layout.total_size, fd, std::ptr::null_mut()) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: the descriptor new_backing gave us, closed once.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        crate::count::register::offer(fd);
        // SAFETY: mapped and offered: the descriptor is not needed any more.
        unsafe { libc::close(fd) };
        // SAFETY: a fresh mapping of `total_size` zeroed bytes, page
        // aligned, never unmapped (stubs hold addresses into it).
        let writer = unsafe { SegmentWriter::init(base, layout, pid, ppid, start_ns) };
        let segment = Segment {
            counters: *writer.counters(),
            run_dir,
            reserved_funcs: AtomicU32::new(0),
            records_backed: AtomicU64::new(0),
        };
        Ok((segment, writer))
    }

    /// Backs the records of functions up to `funcs` in all and names up to
    /// `strings` bytes (and their sample counters and shared-stripe
    /// counters) with memory before they are written: `false` if the
    /// capacity or the memory is not there (a full tmpfs), and nothing may
    /// be added.
    pub fn reserve_records(&self, funcs: u32, strings: u32) -> bool {
        let l = self.counters.layout();
        if funcs > l.caps.functions || strings > l.caps.strings {
            return false;
        }
        let base = self.counters.base();
        let backed = self.records_backed.load(Ordering::Relaxed);
        let (had_funcs, had_strings) = ((backed >> 32) as u32, backed as u32);
        let (funcs_now, strings_now) = (funcs.max(had_funcs), strings.max(had_strings));
        let metadata = record_ranges(l, funcs_now, strings_now)
            .into_iter()
            .zip(record_ranges(l, had_funcs, had_strings))
            .filter(|&((_, len), (_, had))| len > had)
            .all(|((off, len), (_, had))| {
                let (off, len) = pages(off + had, len - had);
                // SAFETY: the range lies inside the mapping (checked against
                // the capacities above, which the layout is made from).
                let p = unsafe { base.add(off as usize) };
                populate(p.cast(), len).is_ok()
            });
        if !metadata {
            return false;
        }
        self.records_backed.store(
            u64::from(funcs_now) << 32 | u64::from(strings_now),
            Ordering::Relaxed,
        );
        // Every stripe a thread holds, an ended thread's and the sums get
        // the new counters (a fold reads them unchecked); a thread that
        // takes a stripe after this store backs them itself, as a fold does
        // the sum it writes (SeqCst on both sides: either it sees the new
        // count or this sees its stripe).
        let from = stripe_bytes_for(l, self.funcs_to_back()) / PAGE * PAGE;
        let before = self.reserved_funcs.fetch_max(funcs, Ordering::SeqCst);
        let to = stripe_bytes_for(l, funcs);
        let backed = to <= from
            || self.counters.stripes_not_free().into_iter().all(|i| {
                // SAFETY: [from, to) lies inside stripe i (to <= stripe_bytes).
                let p = unsafe { (self.counters.stripe_ptr(i) as *mut u8).add(from as usize) };
                populate(p.cast(), to - from).is_ok()
            });
        if !backed {
            // Not reserved after all: the next reservation backs every
            // stripe from the old size again (a fold reads them unchecked).
            // Callers reserve under the agent's lock, one at a time.
            self.reserved_funcs.store(before, Ordering::SeqCst);
        }
        backed
    }

    /// Bytes of a stripe that hold the counters of existing (and reserved)
    /// functions; the spare slots stay unreserved until functions are added.
    fn stripe_used_bytes(&self) -> u64 {
        stripe_bytes_for(self.counters.layout(), self.funcs_to_back())
    }

    fn funcs_to_back(&self) -> u32 {
        self.counters
            .func_count()
            .max(self.reserved_funcs.load(Ordering::SeqCst))
    }

    /// A stripe for a new thread, backed by memory, or `None`. If all are
    /// taken, some by ended threads, those are folded first (waiting for a
    /// fold under way).
    pub fn new_stripe(&self, tid: u32) -> Option<u32> {
        self.new_stripe_with(tid, true)
    }

    /// As [`Segment::new_stripe`] without folding (which allocates): for
    /// threads that are held where they are.
    pub fn new_stripe_unfolded(&self, tid: u32) -> Option<u32> {
        self.new_stripe_with(tid, false)
    }

    fn new_stripe_with(&self, tid: u32, fold: bool) -> Option<u32> {
        // Backing a stripe is a system call a seccomp filter may forbid.
        if crate::lifecycle::sandbox::on() {
            return None;
        }
        let idx = match self.counters.alloc_stripe(tid) {
            Some(i) => i,
            None if fold && self.counters.ended_stripes() > 0 => {
                // All taken, some by ended threads not folded yet.
                self.fold_ended(true);
                self.counters.alloc_stripe(tid)?
            }
            None => return None,
        };
        if populate(self.counters.stripe_ptr(idx), self.stripe_used_bytes()).is_err() {
            // Nothing was counted in it: hand it back unread (folding would
            // read pages the full tmpfs could not supply: SIGBUS).
            self.counters.release_unused_stripe(idx);
            return None;
        }
        Some(idx)
    }

    /// Stripe `i`'s thread ended: its counts stay counted (one store); once
    /// [`FOLD_BATCH`] stripes have ended, they are folded into the ended
    /// threads' sum at once (a fold scans the old sum: once per batch, not
    /// per thread), the new sum's pages given memory first; on a full
    /// tmpfs they stay as they are, counted.
    pub fn retire_stripe(&self, i: u32) {
        self.counters.end_stripe(i);
        // A fold backs its sum with memory: not under a seccomp filter.
        if self.counters.ended_stripes() >= FOLD_BATCH && !crate::lifecycle::sandbox::on() {
            self.fold_ended(false);
        }
    }

    /// Folds the ended stripes (see [`Stripes::fold_ended`]); with `wait`,
    /// after a fold under way rather than leaving them to it.
    fn fold_ended(&self, wait: bool) {
        self.counters.fold_ended(wait, |p, bytes| {
            // As many as the fold writes, and as a thread's stripe has.
            let (lo, len) = pages(p as u64, bytes.max(self.stripe_used_bytes()));
            populate(lo as *mut u64, len).is_ok()
        });
    }

    /// In a forked child: gives the child a segment of its own at the same
    /// address (stubs hold absolute addresses into it), with the parent's
    /// metadata and zero counts. Only the forking thread exists, so only its
    /// stripe (`keep`) stays. On failure the child's counts go to anonymous
    /// memory, never into the parent's segment.
    pub fn reopen_in_child(
        &self,
        keep: Option<u32>,
        pid: u32,
        ppid: u32,
        start_ns: u64,
    ) -> Result<(), CountError> {
        self.reopen(keep, self.run_dir.as_deref(), pid, ppid, start_ns)
    }

    /// `rtprof attach` again after a detach: a fresh segment at the same
    /// address (in `run_dir`, or a memfd), with the metadata and zero
    /// counts, as a forked child's. Call with no entry patched (no thread
    /// counts meanwhile); the threads count in the shared stripe.
    pub fn reopen_for_attach(
        &self,
        run_dir: Option<&str>,
        start_ns: u64,
    ) -> Result<(), CountError> {
        let dir = run_dir
            .map(CString::new)
            .transpose()
            .map_err(|_| CountError::RunDir("NUL in path".into()))?;
        // SAFETY: a system call without arguments.
        let ppid = unsafe { libc::getppid() } as u32;
        self.reopen(None, dir.as_deref(), std::process::id(), ppid, start_ns)
    }

    fn reopen(
        &self,
        keep: Option<u32>,
        run_dir: Option<&CStr>,
        pid: u32,
        ppid: u32,
        start_ns: u64,
    ) -> Result<(), CountError> {
        let l = *self.counters.layout();
        let base = self.counters.base();
        let result = (|| {
            let fd = new_backing(&l, run_dir)?;
            let w = &self.counters;
            let used = record_ranges(&l, w.func_count(), w.strings_len());
            // The child's file has memory for what is copied, no more.
            self.records_backed.store(
                u64::from(w.func_count()) << 32 | u64::from(w.strings_len()),
                Ordering::Relaxed,
            );
            // Metadata in use is copied (the counters start from zero);
            // what the child will write is reserved.
            let copy = fixed_ranges(&l)
                .into_iter()
                .chain(used[..2].iter().copied());
            let copied = copy.filter(|&(_, len)| len > 0).all(|(off, len)| {
                // SAFETY: a range of the parent's mapping that is in use,
                // hence backed.
                let src = unsafe { base.add(off as usize) };
                // SAFETY: `src..src+len` is readable (above); `fd` is ours.
                let n = unsafe { libc::pwrite(fd, src.cast(), len as usize, off as libc::off_t) };
                n == len as isize
            });
            let reserved = used[2..]
                .iter()
                .filter(|&&(_, len)| len > 0)
                .all(|&(off, len)| {
                    let (off, len) = pages(off, len);
                    reserve(fd, off, len).is_ok()
                });
            let kept =
                keep.is_none_or(|k| reserve(fd, l.stripe_off(k), self.stripe_used_bytes()).is_ok());
            if !copied || !reserved || !kept {
                let e = last_err();
                // Empty, the file is skipped by its reader (see new_backing).
                // SAFETY: `fd` is the child's new descriptor, closed once.
                unsafe {
                    libc::ftruncate(fd, 0);
                    libc::close(fd)
                };
                return Err(CountError::Reserve(e));
            }
            match map(l.total_size, fd, base.cast()) {
                Ok(_) => Ok(fd),
                Err(e) => {
                    // SAFETY: the child's new descriptor, closed once.
                    unsafe { libc::close(fd) };
                    Err(e)
                }
            }
        })();
        if result.is_err() {
            // Anonymous shared memory: the stubs keep working, the parent
            // never sees the child's calls.
            // SAFETY: replaces the parent's mapping at the same place and size with anonymous
            // memory: nothing but our counters lives there.
            let p = unsafe {
                libc::mmap(
                    base.cast(),
                    l.total_size as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                vlog!("cannot detach from the parent's counters: {}", last_err());
            }
            return result.map(|_| ());
        }
        self.counters.reset_for_child(keep, pid, ppid, start_ns);
        // Offered once it names the child: the daemon checks the pid.
        if let Ok(fd) = result {
            crate::count::register::offer(fd);
            // SAFETY: offered: the child's descriptor is not needed any more.
            unsafe { libc::close(fd) };
        }
        Ok(())
    }

    /// A copy of the segment as it is now, as `<run_dir>/<pid>-<n>.seg`:
    /// for an agent loaded by `rtprof attach`, whose live segment is a
    /// memfd (so that rtprofd can map it) that rtprof cannot open. What is
    /// in use is written; the rest stays a hole no reader reads.
    pub fn copy_into_dir(&self, run_dir: &str) -> Result<(), CountError> {
        let dir = CString::new(run_dir).map_err(|_| CountError::RunDir("NUL in path".into()))?;
        let fd = create_in_dir(&dir)?;
        let l = *self.counters.layout();
        let base = self.counters.base();
        let w = &self.counters;
        let stripe = self.stripe_used_bytes();
        // The parts of the per-thread sample table that were written (and
        // so have memory): the head's marks say which.
        let (written, per_part) = w.thread_samples(None).written_parts();
        let part = per_part as u64 * 16;
        let parts = (0..64u64)
            .filter(move |b| written & 1 << b != 0)
            .map(move |b| (l.thread_entries_off + b * part, part));
        let ranges = fixed_ranges(&l)
            .into_iter()
            .chain(record_ranges(&l, w.func_count(), w.strings_len()))
            .chain((1..w.stripe_count()).map(|i| (l.stripe_off(i), stripe)))
            .chain(parts);
        // SAFETY: our new file; takes integers only.
        let mut ok = unsafe { libc::ftruncate(fd, l.total_size as libc::off_t) } == 0;
        for (off, len) in ranges.filter(|&(_, len)| len > 0) {
            // SAFETY: a range of our mapping that is in use, hence backed;
            // `fd` is ours.
            let n = unsafe {
                libc::pwrite(
                    fd,
                    base.add(off as usize).cast(),
                    len as usize,
                    off as libc::off_t,
                )
            };
            ok &= n == len as isize;
        }
        let e = last_err();
        if !ok {
            // Empty, the file is skipped by its reader.
            // SAFETY: our descriptor.
            unsafe { libc::ftruncate(fd, 0) };
        }
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(fd) };
        if ok {
            Ok(())
        } else {
            Err(CountError::Reserve(e))
        }
    }

    /// Files are written beside the segment ([`Segment::write_beside`]).
    pub fn has_run_dir(&self) -> bool {
        self.run_dir.is_some()
    }

    /// Writes `bytes` to `<run dir>/<pid>-<n>.<suffix>`, beside this
    /// process's segment file (none: nothing is written). A new file,
    /// private, in the private run directory.
    pub fn write_beside(&self, suffix: &str, bytes: &[u8]) -> io::Result<()> {
        match &self.run_dir {
            Some(dir) => {
                write_beside_file(std::ffi::OsStr::from_bytes(dir.as_bytes()), suffix, bytes)
            }
            None => Ok(()),
        }
    }

    /// As [`Segment::write_beside`], beside the copy
    /// [`Segment::copy_into_dir`] just made in `dir`.
    pub fn write_beside_copy(dir: &str, suffix: &str, bytes: &[u8]) -> io::Result<()> {
        write_beside_file(std::ffi::OsStr::new(dir), suffix, bytes)
    }

    /// The whole segment, for building a report of this process.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the whole mapping, which stays mapped for the process's life; bytes other
        // threads update are read as plain bytes by a reader that validates them.
        unsafe {
            std::slice::from_raw_parts(
                self.counters.base(),
                self.counters.layout().total_size as usize,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Capacities {
        Capacities {
            modules: 2,
            functions: 100,
            strings: 1000,
            stripes: 6,
        }
    }

    #[test]
    fn memfd_segment_round_trips() {
        let (s, mut w) = Segment::create(caps(), None, 1, 0, 0).unwrap();
        w.set_exe(b"/x").unwrap();
        w.add_module(b"/x", 0).unwrap();
        let f = w.add_function(b"f", 0x10, 4).unwrap();
        let st = s.new_stripe(9).unwrap();
        // SAFETY: a slot below func_count of a stripe handed out.
        unsafe { *s.counters.stripe_ptr(st).add(f as usize) += 2 };
        let snap = rtprof_abi::read_snapshot(s.bytes()).unwrap();
        assert_eq!(snap.functions[0].calls, 2);
    }

    #[test]
    fn child_copy_keeps_metadata_and_starts_from_zero() {
        let (s, mut w) = Segment::create(caps(), None, 1, 0, 0).unwrap();
        w.set_exe(b"/x").unwrap();
        w.add_module(b"/x", 0).unwrap();
        let f = w.add_function(b"f", 0x10, 4).unwrap();
        let kept = s.new_stripe(9).unwrap();
        let other = s.new_stripe(10).unwrap();
        let base = s.counters.base();
        // SAFETY: slots below func_count of stripes handed out.
        unsafe {
            *s.counters.stripe_ptr(kept).add(f as usize) += 2;
            *s.counters.stripe_ptr(other).add(f as usize) += 3;
            *s.counters.stripe_ptr(0).add(f as usize) += 4;
        }
        s.reopen_in_child(Some(kept), 77, 1, 5).unwrap();
        assert_eq!(s.counters.base(), base, "same address: stubs hold it");
        let snap = rtprof_abi::read_snapshot(s.bytes()).unwrap();
        assert_eq!((snap.pid, snap.ppid, snap.exe.as_str()), (77, 1, "/x"));
        assert_eq!(snap.functions[0].calls, 0, "the child starts from zero");
        // SAFETY: a slot below func_count of a stripe handed out.
        unsafe { *s.counters.stripe_ptr(kept).add(f as usize) += 1 };
        let snap = rtprof_abi::read_snapshot(s.bytes()).unwrap();
        assert_eq!(snap.functions[0].calls, 1, "and counts in its kept stripe");
        assert!(
            s.new_stripe(11).is_some(),
            "and can give threads new stripes"
        );
    }

    #[test]
    fn segment_names_are_built_without_the_heap() {
        let before = crate::test_alloc::allocs();
        let n = segment_name(4_294_967_295, 999);
        assert_eq!(
            crate::test_alloc::allocs(),
            before,
            "segment_name allocated"
        );
        assert_eq!(
            &n[..n.iter().position(|&b| b == 0).unwrap()],
            b"4294967295-999.seg"
        );
        let n = segment_name(7, 0);
        assert_eq!(&n[..9], b"7-0.seg\0\0");
    }

    #[test]
    fn run_dir_must_be_private() {
        let dir = std::env::temp_dir().join(format!("rtprof-seg-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = dir.to_str().unwrap();
        assert!(matches!(
            Segment::create(caps(), Some(d), 1, 0, 0),
            Err(CountError::RunDir(_))
        ));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let _s1 = Segment::create(caps(), Some(d), 1, 0, 0).unwrap();
        let s2 = Segment::create(caps(), Some(d), 1, 0, 0).unwrap();
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        files.sort_by_key(|e| e.file_name());
        let pid = std::process::id();
        let names: Vec<String> = files
            .iter()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        // A second segment of one pid (after exec) gets the next name.
        assert_eq!(names, vec![format!("{pid}-0.seg"), format!("{pid}-1.seg")]);
        for f in &files {
            assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        }
        // Beside the newest segment: whole, private, under its own name
        // only (no hidden part left), and never replacing a file.
        s2.0.write_beside("stacks", b"first").unwrap();
        assert!(s2.0.write_beside("stacks", b"second").is_err());
        let beside = dir.join(format!("{pid}-1.stacks"));
        assert_eq!(std::fs::read(&beside).unwrap(), b"first");
        assert_eq!(
            beside.metadata().unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
