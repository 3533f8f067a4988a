//! The agent's side of the counter segment, in two parts with different
//! rules. [`SegmentWriter`] writes the metadata (module and function
//! records, names): one writer, `&mut` for every change, so the agent
//! keeps it under its state lock. [`Counters`] is a `Copy` handle for what
//! any thread, signal handler or forked child may do at any time: count,
//! read and set stripes' slots, add samples, set the header's state. It
//! only does atomic operations on the shared memory.
//!
//! These are the primitives the layout defines. Which thread gets which
//! stripe, and how ended threads' stripes are folded into sums (the fold
//! protocol of [`stripe_state`]), is the agent's thread-lifecycle policy,
//! built on them in the agent.
//!
//! Both write through raw pointers because the memory is shared with other
//! processes that read it concurrently (they validate what they read).

use crate::layout::*;
use crate::sampling::{Sampler, Why};
use std::mem::{offset_of, size_of};
use std::ptr::{addr_of, addr_of_mut};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteError {
    /// More modules, functions or string bytes than the segment was sized for.
    Full,
    /// A function for a module whose range does not end the function
    /// table (another module's functions were recorded after it): it
    /// would lie outside its module's range.
    NotLast,
}

/// Lock-free access to a mapped segment's counters, stripes, samples and
/// header state.
#[derive(Clone, Copy)]
pub struct Counters {
    base: *mut u8,
    layout: Layout,
}

// SAFETY: `base` points to a process-wide shared mapping (see
// `SegmentWriter::init`), and every access through `Counters` is atomic
// (or, for `reset_for_child`, made while the process has one thread).
unsafe impl Send for Counters {}
// SAFETY: as for `Send`: shared `&Counters` only perform atomic operations.
unsafe impl Sync for Counters {}

/// The metadata writer over a mapped segment of `layout.total_size` bytes.
pub struct SegmentWriter {
    counters: Counters,
    // Published in the header too (for readers); kept here so the writer
    // never reads back what others could change.
    module_count: u32,
    func_count: u32,
    strings_len: u32,
}

// SAFETY: the writer owns the metadata it writes; moving it to another
// thread (into a lock) moves that ownership. Its `&self` methods only read
// metadata, which changes only through `&mut self`.
unsafe impl Send for SegmentWriter {}
// SAFETY: as above: shared references only read.
unsafe impl Sync for SegmentWriter {}

impl SegmentWriter {
    /// Writes a fresh header. Stripe 0 (shared) is marked live.
    ///
    /// # Safety
    /// `base` must point to `layout.total_size` writable, zeroed bytes,
    /// aligned to 8, that stay mapped for as long as the writer and every
    /// [`Counters`] copied from it are used.
    pub unsafe fn init(base: *mut u8, layout: Layout, pid: u32, ppid: u32, start_ns: u64) -> Self {
        let h = Header {
            magic: MAGIC,
            version: VERSION,
            header_size: size_of::<Header>() as u32,
            total_size: layout.total_size,
            pid,
            ppid,
            state: state::STARTING,
            start_ns,
            modules_off: layout.modules_off,
            module_cap: layout.caps.modules,
            funcs_off: layout.funcs_off,
            func_cap: layout.caps.functions,
            strings_off: layout.strings_off,
            strings_cap: layout.caps.strings,
            samples_off: layout.samples_off,
            stripe_table_off: layout.stripe_table_off,
            stripes_off: layout.stripes_off,
            stripe_bytes: layout.stripe_bytes,
            stripe_cap: layout.caps.stripes,
            stripe_count: 1,
            thread_samples_off: layout.thread_samples_off,
            ..Header::default()
        };
        // SAFETY: the caller's contract: `base` is writable, aligned and
        // holds at least a header; nothing reads it yet.
        unsafe { std::ptr::write_volatile(base as *mut Header, h) };
        let head = TableHead {
            cap: THREAD_SAMPLE_ENTRIES,
            ..TableHead::default()
        };
        // SAFETY: the layout puts a TableHead at `thread_samples_off`
        // (8-aligned) inside the `total_size` bytes the caller provides.
        unsafe {
            std::ptr::write_volatile(
                base.add(layout.thread_samples_off as usize) as *mut TableHead,
                head,
            )
        };
        let counters = Counters { base, layout };
        counters
            .stripe_slot(0)
            .0
            .store(stripe_state::LIVE, Ordering::Release);
        counters.keep_sum_stripes();
        SegmentWriter {
            counters,
            module_count: 0,
            func_count: 0,
            strings_len: 0,
        }
    }

    /// The lock-free handle on this segment's counters (`Copy`: take one
    /// for threads that must not wait for the writer).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Function slots in use.
    pub fn func_count(&self) -> u32 {
        self.func_count
    }

    /// Bytes of the string table in use.
    pub fn strings_len(&self) -> u32 {
        self.strings_len
    }

    pub fn module_count(&self) -> u32 {
        self.module_count
    }

    fn module_ptr(&self, idx: u32) -> *mut ModuleRecord {
        let l = &self.counters.layout;
        assert!(idx < l.caps.modules);
        // SAFETY: `idx` is below the module capacity (asserted), so the
        // record lies inside the module table of the mapping.
        unsafe {
            self.counters
                .base
                .add(l.modules_off as usize + idx as usize * size_of::<ModuleRecord>())
                .cast()
        }
    }

    fn func_ptr(&self, idx: u32) -> *mut FunctionRecord {
        let l = &self.counters.layout;
        assert!(idx < l.caps.functions);
        // SAFETY: `idx` is below the function capacity (asserted), so the
        // record lies inside the function table of the mapping.
        unsafe {
            self.counters
                .base
                .add(l.funcs_off as usize + idx as usize * size_of::<FunctionRecord>())
                .cast()
        }
    }

    /// Records why module `idx` is not instrumented or lists no functions.
    pub fn set_module_why(&mut self, idx: u32, why: ModuleWhy) {
        if idx >= self.module_count {
            return;
        }
        let m = self.module_ptr(idx);
        // SAFETY: a written module record (idx < module_count); `&mut self`
        // makes this the only metadata write. Only the flags field is
        // touched: the record's sample counter is updated concurrently.
        unsafe {
            let flags = addr_of_mut!((*m).flags);
            let f = std::ptr::read_volatile(flags);
            let f =
                (f & !module_why::MASK) | ((why.code() << module_why::SHIFT) & module_why::MASK);
            std::ptr::write_volatile(flags, f);
        }
    }

    /// Counts `n` functions of the most recent module that got no record
    /// (no room for them) as refused for `reason`, so the module says why
    /// it lists fewer functions than it has.
    pub fn note_unrecorded(&mut self, reason: crate::Refusal, n: u32) {
        if self.module_count == 0 {
            return;
        }
        let m = self.module_ptr(self.module_count - 1);
        // SAFETY: the last written module record, one writer (`&mut
        // self`); the index is in bounds (codes are below REASON_SLOTS,
        // which a unit test of `Refusal` asserts, and indexing checks).
        unsafe {
            let slot = addr_of_mut!((*m).refused[reason.code() as usize]);
            std::ptr::write_volatile(slot, std::ptr::read_volatile(slot).saturating_add(n));
        }
    }

    /// Appends bytes to the string table; returns (offset, length).
    pub fn add_string(&mut self, s: &[u8]) -> Result<(u32, u32), WriteError> {
        let len = u32::try_from(s.len()).map_err(|_| WriteError::Full)?;
        let off = self.strings_len;
        let end = off.checked_add(len).ok_or(WriteError::Full)?;
        let l = &self.counters.layout;
        if end > l.caps.strings {
            return Err(WriteError::Full);
        }
        // SAFETY: [off, end) lies inside the string table (end <=
        // strings cap, checked); readers read only up to strings_len,
        // published after the copy.
        unsafe {
            let dst = self
                .counters
                .base
                .add((l.strings_off + off as u64) as usize);
            std::ptr::copy_nonoverlapping(s.as_ptr(), dst, s.len());
        }
        self.strings_len = end;
        self.counters
            .header_u32(offset_of!(Header, strings_len))
            .store(end, Ordering::Release);
        Ok((off, len))
    }

    pub fn set_exe(&mut self, exe: &[u8]) -> Result<(), WriteError> {
        let (off, len) = self.add_string(exe)?;
        self.counters
            .header_u32(offset_of!(Header, exe_off))
            .store(off, Ordering::Relaxed);
        self.counters
            .header_u32(offset_of!(Header, exe_len))
            .store(len, Ordering::Release);
        Ok(())
    }

    /// Adds a module record; its functions must follow with `add_function`.
    pub fn add_module(&mut self, path: &[u8], base: u64) -> Result<u32, WriteError> {
        self.add_module_with(path, base, 0)
    }

    /// Adds a module that is not instrumented: its functions are listed for
    /// sample attribution only.
    pub fn add_sampled_module(&mut self, path: &[u8], base: u64) -> Result<u32, WriteError> {
        self.add_module_with(path, base, module_flags::SAMPLED_ONLY)
    }

    fn add_module_with(&mut self, path: &[u8], base: u64, flags: u32) -> Result<u32, WriteError> {
        let idx = self.module_count;
        if idx >= self.counters.layout.caps.modules {
            return Err(WriteError::Full);
        }
        let (path_off, path_len) = self.add_string(path)?;
        let rec = ModuleRecord {
            path_off,
            path_len,
            base,
            first_func: self.func_count,
            flags,
            ..ModuleRecord::default()
        };
        // SAFETY: record `idx < module_cap` (checked above), not yet
        // published: nothing else reads or counts into it until
        // `module_count` says so (Release below).
        unsafe { std::ptr::write_volatile(self.module_ptr(idx), rec) };
        self.module_count = idx + 1;
        self.counters
            .header_u32(offset_of!(Header, module_count))
            .store(idx + 1, Ordering::Release);
        Ok(idx)
    }

    /// Adds a function to the most recently added module; returns its slot.
    pub fn add_function(&mut self, name: &[u8], vaddr: u64, size: u32) -> Result<u32, WriteError> {
        let modules = self.module_count;
        let idx = self.func_count;
        if modules == 0 || idx >= self.counters.layout.caps.functions {
            return Err(WriteError::Full);
        }
        let module = modules - 1;
        // Its range must stay contiguous: refused if functions of another
        // module were recorded after this one's (named on demand).
        if !self.ends_table(&self.module(module)) {
            return Err(WriteError::NotLast);
        }
        let (name_off, name_len) = self.add_string(name)?;
        let m = self.module_ptr(module);
        // SAFETY: a module record already written (below module_count);
        // `&mut self` makes this the only metadata writer.
        let sampled_only = unsafe { std::ptr::read_volatile(addr_of!((*m).flags)) }
            & module_flags::SAMPLED_ONLY
            != 0;
        // Undecided until `set_status`: a process that dies in between
        // must not claim the function was patched.
        let pending = crate::Refusal::NotAttempted.code();
        let rec = FunctionRecord {
            name_off,
            name_len,
            module,
            status: if sampled_only {
                STATUS_SAMPLED_ONLY
            } else {
                pending
            },
            vaddr,
            size,
            reserved: 0,
        };
        // SAFETY: slot `idx` is below the capacity (checked) and not yet
        // published; the module's fields are written one by one, never as
        // a whole record (its sample counter is updated concurrently).
        unsafe {
            std::ptr::write_volatile(self.func_ptr(idx), rec);
            let count = addr_of_mut!((*m).func_count);
            std::ptr::write_volatile(count, std::ptr::read_volatile(count) + 1);
            if !sampled_only {
                let r = addr_of_mut!((*m).refused[pending as usize]);
                std::ptr::write_volatile(r, std::ptr::read_volatile(r) + 1);
            }
        }
        self.func_count = idx + 1;
        self.counters
            .header_u32(offset_of!(Header, func_count))
            .store(idx + 1, Ordering::Release);
        Ok(idx)
    }

    /// Whether module record `m`'s functions end where the function table
    /// does (a function added now would extend its range).
    fn ends_table(&self, m: &ModuleRecord) -> bool {
        m.first_func.checked_add(m.func_count) == Some(self.func_count)
    }

    /// Lists implementation `name` of function `of` (a patched slot), at
    /// `address`, as a row of an implementations module (see
    /// [`module_flags::IMPLEMENTATIONS`]), and marks `of` offered with its
    /// own code active. Returns the row's slot.
    pub fn add_implementation(
        &mut self,
        of: u32,
        name: &[u8],
        address: u64,
    ) -> Result<u32, WriteError> {
        use crate::layout::function_flags::{ACTIVE, OFFERED};
        if of >= self.func_count {
            return Err(WriteError::Full);
        }
        // A module's functions are one contiguous range of slots: the last
        // implementations module takes this row only if nothing was
        // recorded after its rows (a module named on demand lists its
        // functions at the end of the table), else a new one starts.
        let last_takes_it = self.module_count > 0 && {
            let m = self.module(self.module_count - 1);
            m.flags & module_flags::IMPLEMENTATIONS != 0 && self.ends_table(&m)
        };
        if !last_takes_it {
            self.add_module_with(
                crate::layout::IMPLEMENTATIONS_MODULE.as_bytes(),
                0,
                module_flags::IMPLEMENTATIONS,
            )?;
        }
        let row = crate::route::row_name(self.function_name(of), name);
        let slot = self.add_function(&row, address, of)?;
        self.set_status(slot, None);
        self.update_function_flags(of, |f| {
            if f & OFFERED == 0 {
                f | OFFERED | ACTIVE
            } else {
                f
            }
        });
        Ok(slot)
    }

    /// Says whether function or implementation row `idx` runs its
    /// function's calls now.
    pub fn set_active(&mut self, idx: u32, on: bool) {
        use crate::layout::function_flags::ACTIVE;
        self.update_function_flags(idx, |f| if on { f | ACTIVE } else { f & !ACTIVE });
    }

    /// Marks module `idx` as one whose code was mapped from a page image.
    pub fn mark_code_from_image(&mut self, idx: u32) {
        use crate::layout::module_flags::CODE_FROM_IMAGE;
        if idx >= self.module_count {
            return;
        }
        let m = self.module_ptr(idx);
        // SAFETY: a written module record; one metadata writer (`&mut
        // self`); only its flags field is touched.
        unsafe {
            let flags = addr_of_mut!((*m).flags);
            let f = std::ptr::read_volatile(flags);
            std::ptr::write_volatile(flags, f | CODE_FROM_IMAGE);
        }
    }

    /// Marks sampled-only module `idx` as named on demand (`true`), or as
    /// named for good.
    pub fn set_named_on_demand(&mut self, idx: u32, on: bool) {
        use crate::layout::module_flags::NAMED_ON_DEMAND;
        if idx >= self.module_count {
            return;
        }
        let m = self.module_ptr(idx);
        // SAFETY: a written module record; one metadata writer (`&mut
        // self`); only its flags field is touched.
        unsafe {
            let flags = addr_of_mut!((*m).flags);
            let f = std::ptr::read_volatile(flags);
            let f = if on {
                f | NAMED_ON_DEMAND
            } else {
                f & !NAMED_ON_DEMAND
            };
            std::ptr::write_volatile(flags, f);
        }
    }

    /// Lists the functions of sampled-only module `idx`, which lists none
    /// yet, after every function recorded so far: `funcs` are (name,
    /// vaddr, size). Returns how many fit. The module's range is published
    /// after its records, so a reader sees all of them or none.
    pub fn name_module<'a>(
        &mut self,
        idx: u32,
        funcs: impl Iterator<Item = (&'a [u8], u64, u32)>,
    ) -> u32 {
        use crate::layout::module_flags::SAMPLED_ONLY;
        if idx >= self.module_count {
            return 0;
        }
        let m = self.module(idx);
        if m.flags & SAMPLED_ONLY == 0 || m.func_count != 0 {
            return 0;
        }
        let first = self.func_count;
        let mut n = 0;
        for (name, vaddr, size) in funcs {
            let idx_f = first + n;
            if idx_f >= self.counters.layout.caps.functions {
                break;
            }
            let Ok((name_off, name_len)) = self.add_string(name) else {
                break;
            };
            let rec = FunctionRecord {
                name_off,
                name_len,
                module: idx,
                status: STATUS_SAMPLED_ONLY,
                vaddr,
                size,
                reserved: 0,
            };
            // SAFETY: below the function capacity, not yet visible to readers.
            unsafe { std::ptr::write_volatile(self.func_ptr(idx_f), rec) };
            n += 1;
        }
        let m = self.module_ptr(idx);
        // SAFETY: a written module record, one metadata writer; its range
        // covers only records written above.
        unsafe {
            std::ptr::write_volatile(addr_of_mut!((*m).first_func), first);
            std::ptr::write_volatile(addr_of_mut!((*m).func_count), n);
        }
        self.func_count = first + n;
        self.counters
            .header_u32(offset_of!(Header, func_count))
            .store(first + n, Ordering::Release);
        n
    }

    /// Rewrites function `idx`'s flags word (see [`function_flags`]).
    fn update_function_flags(&mut self, idx: u32, f: impl FnOnce(u32) -> u32) {
        if idx >= self.func_count {
            return;
        }
        let rec = self.func_ptr(idx);
        // SAFETY: a function record below func_count, inside the segment;
        // `&mut self` makes this its only writer.
        let changed = unsafe {
            let flags = addr_of_mut!((*rec).reserved);
            let old = std::ptr::read_volatile(flags);
            let new = f(old);
            // Unchanged (a C API call marking its function again each
            // time): no write, and readers need not look again.
            if old != new {
                std::ptr::write_volatile(flags, new);
            }
            old != new
        };
        if !changed {
            return;
        }
        // After the flags: a reader that saw the new count sees them.
        self.counters
            .header_u64(offset_of!(Header, flags_changes))
            .fetch_add(1, Ordering::Release);
    }

    /// Says whether function `idx`'s counting is switched off now.
    pub fn set_counting_off(&mut self, idx: u32, off: bool) {
        use crate::layout::function_flags::COUNTING_OFF;
        self.update_function_flags(idx, |flags| {
            if off {
                flags | COUNTING_OFF
            } else {
                flags & !COUNTING_OFF
            }
        });
    }

    /// Says that the program added calls to function `idx` through the C
    /// API (it stays so).
    pub fn set_accelerated(&mut self, idx: u32) {
        use crate::layout::function_flags::ACCELERATED;
        self.update_function_flags(idx, |flags| flags | ACCELERATED);
    }

    /// Says that function `idx` is entered through a trap.
    pub fn set_trapped(&mut self, idx: u32) {
        use crate::layout::function_flags::TRAPPED;
        self.update_function_flags(idx, |flags| flags | TRAPPED);
    }

    /// Says whether function `idx`'s calls are estimated (under a budget),
    /// with the bound on the error in hundredths of a percent.
    pub fn set_estimated(&mut self, idx: u32, bound: Option<u16>) {
        use crate::layout::function_flags::{BOUND_SHIFT, ESTIMATED};
        self.update_function_flags(idx, |flags| {
            let flags = flags & !(ESTIMATED | 0xffff << BOUND_SHIFT);
            match bound {
                Some(b) => flags | ESTIMATED | (b as u32) << BOUND_SHIFT,
                None => flags,
            }
        });
    }

    /// Records the outcome for function `idx` (once): `None` = patched.
    pub fn set_status(&mut self, idx: u32, refusal: Option<crate::Refusal>) {
        assert!(idx < self.func_count);
        let f = self.func_ptr(idx);
        // SAFETY: a function record below func_count and its module's
        // record, both written; `&mut self` makes this their only writer;
        // fields are written one by one (the module's sample counter is
        // updated concurrently).
        unsafe {
            let status = addr_of_mut!((*f).status);
            let old = std::ptr::read_volatile(status);
            if old == STATUS_SAMPLED_ONLY {
                return;
            }
            let m = self.module_ptr(std::ptr::read_volatile(addr_of!((*f).module)));
            let bump = |code: u32, by: i32| {
                let r = addr_of_mut!((*m).refused[code as usize]);
                std::ptr::write_volatile(r, std::ptr::read_volatile(r).wrapping_add_signed(by));
            };
            let pending = crate::Refusal::NotAttempted.code();
            if old == pending {
                bump(pending, -1);
            }
            match refusal {
                None => {
                    std::ptr::write_volatile(status, 0);
                    let p = addr_of_mut!((*m).patched);
                    std::ptr::write_volatile(p, std::ptr::read_volatile(p) + 1);
                }
                Some(r) => {
                    std::ptr::write_volatile(status, r.code());
                    bump(r.code(), 1);
                }
            }
        }
    }

    /// A copy of function record `slot`.
    pub fn function(&self, slot: u32) -> FunctionRecord {
        assert!(slot < self.func_count);
        // SAFETY: a written record; metadata changes only through `&mut
        // self`, so nothing writes it while `&self` lives.
        unsafe { std::ptr::read_volatile(self.func_ptr(slot)) }
    }

    /// `len` bytes at `off` in the string table, as `add_string` returned
    /// them.
    fn string(&self, off: u32, len: u32) -> &[u8] {
        assert!(off as u64 + len as u64 <= self.strings_len as u64);
        // SAFETY: inside the string table's written part (asserted), which
        // is never rewritten once added.
        unsafe {
            std::slice::from_raw_parts(
                self.counters
                    .base
                    .add((self.counters.layout.strings_off + off as u64) as usize),
                len as usize,
            )
        }
    }

    /// The name of function `slot`.
    pub fn function_name(&self, slot: u32) -> &[u8] {
        let f = self.function(slot);
        self.string(f.name_off, f.name_len)
    }

    /// The path of module `idx`.
    pub fn module_path(&self, idx: u32) -> &[u8] {
        let m = self.module(idx);
        self.string(m.path_off, m.path_len)
    }

    /// A copy of module record `idx` (its sample counter as of now).
    pub fn module(&self, idx: u32) -> ModuleRecord {
        assert!(idx < self.module_count);
        // SAFETY: a written record, changed only through `&mut self`; its
        // sample counter may be counting meanwhile, and is read volatile
        // like the rest (a value of some moment).
        unsafe { std::ptr::read_volatile(self.module_ptr(idx)) }
    }
}

impl Counters {
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    fn header_u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: callers pass `offset_of!` a u32 field of the Header at
        // `base`, which `init`'s caller keeps mapped and 8-aligned for as
        // long as the writer; every access to it is atomic.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    fn header_u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: as in `header_u32`, for a u64 field (8-aligned: the
        // header is laid out with u64 fields on 8-byte offsets).
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// Function slots published so far.
    pub fn func_count(&self) -> u32 {
        self.header_u32(offset_of!(Header, func_count))
            .load(Ordering::Acquire)
    }

    /// Module records published so far.
    pub fn module_count(&self) -> u32 {
        self.header_u32(offset_of!(Header, module_count))
            .load(Ordering::Acquire)
    }

    /// Bytes of the string table published so far.
    pub fn strings_len(&self) -> u32 {
        self.header_u32(offset_of!(Header, strings_len))
            .load(Ordering::Acquire)
    }

    /// Sets the sampling period if none is set (no sampler runs): time
    /// added as samples of `period_ns` then reads as that time.
    pub fn set_period_if_unset(&self, period_ns: u64) {
        let _ = self
            .header_u64(offset_of!(Header, sample_period_ns))
            .compare_exchange(0, period_ns, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// A request rtprofd left in the segment (see
    /// [`crate::layout::control`]) and not yet answered: its sequence
    /// number, its kind, and its bytes copied into `pattern` (their length).
    pub fn control_request(
        &self,
        pattern: &mut [u8; crate::layout::control::PATTERN_MAX],
    ) -> Option<(u32, u32, usize)> {
        use crate::layout::control;
        let seq = self.header_u32(control::SEQ).load(Ordering::Acquire);
        if seq == self.header_u32(control::ACK).load(Ordering::Relaxed) {
            return None;
        }
        let len = (self.header_u32(control::LEN).load(Ordering::Relaxed) as usize)
            .min(control::PATTERN_MAX);
        let kind = self.header_u32(control::KIND).load(Ordering::Relaxed);
        for (i, b) in pattern[..len].iter_mut().enumerate() {
            // SAFETY: inside the pattern area, between the header and the
            // module records (Layout::new leaves it there); rtprofd may
            // write it meanwhile, so each byte is read once, volatile.
            *b = unsafe { std::ptr::read_volatile(self.base.add(control::PATTERN + i)) };
        }
        Some((seq, kind, len))
    }

    /// The words a thread that serves requests waits on: (sequence number,
    /// answered number). rtprofd wakes waiters on the first (a shared
    /// futex) once it has left a request.
    pub fn control_words(&self) -> (&AtomicU32, &AtomicU32) {
        use crate::layout::control;
        (self.header_u32(control::SEQ), self.header_u32(control::ACK))
    }

    /// Takes the route request waiting, whose moment of expiry is
    /// `expires_ns`, for carrying out: whether it may be (it was not
    /// withdrawn). See `crate::route` for why the mark comes before the
    /// clock.
    pub fn control_claim(&self, expires_ns: u64) -> bool {
        use crate::layout::control;
        let marked = self
            .header_u32(control::KIND)
            .compare_exchange(
                control::ROUTE,
                control::CLAIMED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok();
        marked && crate::route::monotonic_ns() < expires_ns
    }

    /// Answers the switch request `seq`.
    pub fn control_done(&self, seq: u32) {
        self.header_u32(crate::layout::control::ACK)
            .store(seq, Ordering::Release);
    }

    /// Answers the route request `seq` with `outcome`.
    pub fn control_answer(&self, seq: u32, outcome: crate::route::RouteOutcome) {
        self.header_u32(crate::layout::control::KIND)
            .store(outcome.code(), Ordering::Relaxed);
        self.control_done(seq);
    }

    /// Stripes handed out so far (the shared one included).
    pub fn stripe_count(&self) -> u32 {
        self.header_u32(offset_of!(Header, stripe_count))
            .load(Ordering::Acquire)
            .min(self.layout.caps.stripes)
    }

    /// Calls of function `idx` counted so far, over the stripes that count
    /// ([`stripe_state::counted`]). Allocates nothing (callable with other
    /// threads stopped).
    pub fn calls(&self, idx: u32) -> u64 {
        let seq = self.fold_seq();
        loop {
            let before = seq.load(Ordering::Acquire);
            let sum = (0..self.stripe_count())
                .filter(|&i| self.stripe_counted(i, before / 2))
                .map(|i| self.counter(i, idx).load(Ordering::Relaxed))
                .sum();
            std::sync::atomic::fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) == before {
                return sum;
            }
        }
    }

    /// Whether stripe `i` counts for a reader of fold generation `generation`.
    fn stripe_counted(&self, i: u32, generation: u64) -> bool {
        let (st, t) = self.stripe_slot(i);
        stripe_state::counted(
            st.load(Ordering::Acquire),
            t.load(Ordering::Relaxed),
            generation,
        )
    }

    /// Sets aside [`SUM_STRIPES`] (when the segment keeps them) for the
    /// sums of ended threads, before any thread takes a stripe.
    fn keep_sum_stripes(&self) {
        if keeps_sum_stripes(self.layout.caps.stripes) {
            for i in SUM_STRIPES {
                self.stripe_slot(i)
                    .0
                    .store(stripe_state::SPARE, Ordering::Release);
            }
            let count = self.header_u32(offset_of!(Header, stripe_count));
            count.fetch_max(SUM_STRIPES[1] + 1, Ordering::AcqRel);
        }
    }

    /// Counter `slot` of stripe `stripe`.
    pub fn counter(&self, stripe: u32, slot: u32) -> &AtomicU64 {
        assert!(stripe < self.layout.caps.stripes && slot < self.layout.caps.functions);
        // SAFETY: both indices are inside the segment's capacities
        // (asserted), stripes are 8-aligned, and counters are only
        // accessed atomically (stubs use locked adds).
        unsafe { AtomicU64::from_ptr(self.stripe_ptr(stripe).add(slot as usize)) }
    }

    /// Stripe `stripe`'s first `n` counters (at most the capacity).
    pub fn stripe_counters(&self, stripe: u32, n: u32) -> &[AtomicU64] {
        assert!(stripe < self.layout.caps.stripes);
        let n = n.min(self.layout.caps.functions) as usize;
        // SAFETY: `n` counters from the start of a stripe below the
        // capacity (both bounded above), 8-aligned, inside the mapping,
        // and only accessed atomically.
        unsafe { std::slice::from_raw_parts(self.stripe_ptr(stripe) as *const AtomicU64, n) }
    }

    /// Adds `n` calls to function `idx` in the shared stripe.
    pub fn add_calls(&self, idx: u32, n: u64) {
        if idx < self.func_count() {
            self.counter(0, idx).fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn set_setup_ns(&self, ns: u64) {
        self.header_u64(offset_of!(Header, setup_ns))
            .store(ns, Ordering::Relaxed);
    }

    pub fn set_state(&self, st: u32) {
        self.header_u32(offset_of!(Header, state))
            .store(st, Ordering::Release);
    }

    pub fn set_exit(&self, status: i32, end_ns: u64) {
        self.header_u32(offset_of!(Header, exit_status))
            .store(status as u32, Ordering::Relaxed);
        self.header_u64(offset_of!(Header, end_ns))
            .store(end_ns, Ordering::Relaxed);
        self.set_state(state::EXITED);
    }

    /// The profile ended while the process runs on (`rtprof detach`).
    pub fn set_detached(&self, end_ns: u64) {
        self.header_u64(offset_of!(Header, end_ns))
            .store(end_ns, Ordering::Relaxed);
        self.set_state(state::DETACHED);
    }

    /// Updates pid/ppid/start time (a forked child reuses its parent's layout).
    pub fn set_identity(&self, pid: u32, ppid: u32, start_ns: u64) {
        self.header_u32(offset_of!(Header, pid))
            .store(pid, Ordering::Relaxed);
        self.header_u32(offset_of!(Header, ppid))
            .store(ppid, Ordering::Relaxed);
        self.header_u64(offset_of!(Header, start_ns))
            .store(start_ns, Ordering::Release);
    }

    /// Stripe `i`'s slot in the stripe table: its state (a
    /// [`stripe_state`]) and its thread's id (or a fold's generation).
    pub fn stripe_slot(&self, i: u32) -> (&AtomicU32, &AtomicU32) {
        assert!(i < self.layout.caps.stripes);
        let off = self.layout.stripe_table_off as usize + i as usize * size_of::<StripeSlot>();
        // SAFETY: entry `i` of the stripe table (i below the capacity,
        // asserted): two 4-aligned u32 words inside the mapping, only ever
        // accessed atomically.
        unsafe {
            (
                &*(self.base.add(off) as *const AtomicU32),
                &*(self.base.add(off + 4) as *const AtomicU32),
            )
        }
    }

    /// Hands thread `tid` a stripe never handed out before (the next after
    /// `stripe_count`); `None` when there is none left. Lock-free. Its
    /// thread is set before it is LIVE: whoever finds it LIVE finds its
    /// thread's id.
    pub fn append_stripe(&self, tid: u32) -> Option<u32> {
        let count = self.header_u32(offset_of!(Header, stripe_count));
        let mut cur = count.load(Ordering::Relaxed);
        loop {
            if cur >= self.layout.caps.stripes {
                return None;
            }
            match count.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        let (st, t) = self.stripe_slot(cur);
        t.store(tid, Ordering::Relaxed);
        st.store(stripe_state::LIVE, Ordering::Release);
        Some(cur)
    }

    /// The header's `fold_seq`: twice the fold generation (see
    /// [`stripe_state`]).
    pub fn fold_seq(&self) -> &AtomicU64 {
        self.header_u64(offset_of!(Header, fold_seq))
    }

    /// The header's `fold_lock` (0 free, 1 held).
    pub fn fold_lock(&self) -> &AtomicU32 {
        self.header_u32(offset_of!(Header, fold_lock))
    }

    /// The header's `fold_again` (1: a fold was asked for while another
    /// ran).
    pub fn fold_again(&self) -> &AtomicU32 {
        self.header_u32(offset_of!(Header, fold_again))
    }

    /// The stripes held by a thread now, as (stripe, thread id).
    pub fn live_stripes(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let count = self.header_u32(offset_of!(Header, stripe_count));
        let used = count.load(Ordering::Acquire).min(self.layout.caps.stripes);
        (1..used).filter_map(|i| {
            let (st, t) = self.stripe_slot(i);
            (st.load(Ordering::Acquire) == stripe_state::LIVE)
                .then(|| (i, t.load(Ordering::Relaxed)))
        })
    }

    /// Stripe `i`'s non-zero counters, as (function slot, calls).
    pub fn stripe_counts(&self, i: u32) -> impl Iterator<Item = (u32, u64)> + '_ {
        let counters = self.stripe_counters(i, self.func_count());
        (0u32..).zip(counters).filter_map(|(k, c)| {
            let v = c.load(Ordering::Relaxed);
            (v != 0).then_some((k, v))
        })
    }

    /// Address of stripe `i`'s first counter.
    pub fn stripe_ptr(&self, i: u32) -> *mut u64 {
        assert!(i < self.layout.caps.stripes);
        // SAFETY: pointer arithmetic inside the mapping: stripe `i` is
        // below the capacity (asserted) the layout was sized for.
        unsafe { self.base.add(self.layout.stripe_off(i) as usize) as *mut u64 }
    }

    /// The stripe that starts at `p`, by address alone (what a signal
    /// handler may ask: no state read).
    pub fn stripe_index(&self, p: *const u64) -> Option<u32> {
        let off = (p as usize).checked_sub(self.base as usize)? as u64;
        let rel = off.checked_sub(self.layout.stripes_off)?;
        let i = u32::try_from(rel / self.layout.stripe_bytes).ok()?;
        (rel % self.layout.stripe_bytes == 0 && i < self.layout.caps.stripes).then_some(i)
    }

    /// The stripe thread `tid` holds now, if any.
    pub fn stripe_of_thread(&self, tid: u32) -> Option<u32> {
        self.live_stripes().find(|&(_, t)| t == tid).map(|(i, _)| i)
    }

    /// The thread that holds stripe `i` now, if one does (none for the
    /// shared stripe 0).
    pub fn stripe_holder(&self, i: u32) -> Option<u32> {
        if i == 0 || i >= self.layout.caps.stripes {
            return None;
        }
        let (st, t) = self.stripe_slot(i);
        (st.load(Ordering::Acquire) == stripe_state::LIVE).then(|| t.load(Ordering::Relaxed))
    }

    /// Whether thread `tid` holds stripe `i` now.
    pub fn stripe_holds(&self, i: u32, tid: u32) -> bool {
        self.stripe_holder(i) == Some(tid)
    }

    /// The stripe that starts at `p` and is held by thread `tid` now, if
    /// any: a thread ending folds the stripe it counts in, which need not be
    /// the one it was first given (a later attach gives it another).
    pub fn stripe_held_at(&self, p: *const u64, tid: u32) -> Option<u32> {
        self.stripe_index(p).filter(|&i| self.stripe_holds(i, tid))
    }

    /// Makes the segment a new process's (a forked child's copy of its
    /// parent's): `pid`'s, running, with the metadata and calls as they
    /// are and none of the samples, cost, exit, sampler or switch request
    /// of the process before. Its stripes' slots are the caller's.
    pub fn restart(&self, pid: u32, ppid: u32, start_ns: u64) {
        // Only the slots in use: the rest of the capacity may have no
        // memory behind it.
        for slot in 0..self.func_count() {
            self.function_samples(slot).store(0, Ordering::Relaxed);
        }
        self.header_u64(offset_of!(Header, end_ns))
            .store(0, Ordering::Relaxed);
        self.header_u32(offset_of!(Header, exit_status))
            .store(0, Ordering::Relaxed);
        for f in [
            offset_of!(Header, samples_total),
            offset_of!(Header, samples_lost),
            offset_of!(Header, samples_unknown),
        ] {
            self.header_u64(f).store(0, Ordering::Relaxed);
        }
        for i in 0..self.module_count() {
            self.module_samples(i).store(0, Ordering::Relaxed);
        }
        // What the agent cost was the parent's (or the last attach's).
        for i in 0..cost::WORDS {
            self.cost(i).store(0, Ordering::Relaxed);
        }
        self.set_sampler(Sampler::Off, Why::Unknown, 0, 0);
        // A switch request was for the parent.
        let seq = self
            .header_u32(crate::layout::control::SEQ)
            .load(Ordering::Relaxed);
        self.control_done(seq);
        self.set_identity(pid, ppid, start_ns);
        self.set_state(state::RUNNING);
    }

    /// The pid the segment belongs to.
    pub fn pid(&self) -> u32 {
        self.header_u32(offset_of!(Header, pid))
            .load(Ordering::Acquire)
    }

    /// Samples of the thread holding stripe `i` (stripe 0: of threads
    /// without one).
    pub fn stripe_samples(&self, i: u32) -> &AtomicU64 {
        assert!(i < self.layout.caps.stripes);
        let at = self.layout.thread_samples_off as usize + size_of::<TableHead>() + i as usize * 8;
        // SAFETY: entry `i` (below the capacity, asserted) of the stripe
        // samples after the table head: 8-aligned, inside the mapping,
        // only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(at) as *mut u64) }
    }

    /// Samples by (stripe, function slot): keys `stripe << 32 | slot`.
    /// `back` gives memory to a part of it before its first entry is
    /// written.
    pub fn thread_samples(
        &self,
        back: Option<crate::count_table::Back>,
    ) -> crate::count_table::Table<'_> {
        use crate::count_table::{Entry, Meta, Table};
        let l = &self.layout;
        // SAFETY: the layout puts the table's head (a `Meta`, same layout
        // as `TableHead`) at `thread_samples_off` and its
        // THREAD_SAMPLE_ENTRIES entries at `thread_entries_off`, 8-aligned,
        // inside the mapping; every access to them is atomic.
        unsafe {
            let meta = &*(self.base.add(l.thread_samples_off as usize) as *const Meta);
            let entries = std::slice::from_raw_parts(
                self.base.add(l.thread_entries_off as usize) as *const Entry,
                THREAD_SAMPLE_ENTRIES as usize,
            );
            Table::new(meta, entries, back)
        }
    }

    /// Sample counter of function `slot`.
    pub fn function_samples(&self, slot: u32) -> &AtomicU64 {
        assert!(slot < self.layout.caps.functions);
        // SAFETY: slot `slot` of the per-function sample array (below its
        // capacity, asserted), 8-aligned, only accessed atomically.
        unsafe {
            AtomicU64::from_ptr(
                (self.base.add(self.layout.samples_off as usize) as *mut u64).add(slot as usize),
            )
        }
    }

    /// Samples in module `idx` outside its listed functions.
    pub fn module_samples(&self, idx: u32) -> &AtomicU64 {
        assert!(idx < self.layout.caps.modules);
        let off = self.layout.modules_off as usize
            + idx as usize * size_of::<ModuleRecord>()
            + offset_of!(ModuleRecord, samples);
        // SAFETY: the `samples` field of module record `idx` (below the
        // capacity, asserted), 8-aligned; the metadata writer never writes
        // this field of a published record, and counting is atomic.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }

    pub fn samples_total(&self) -> &AtomicU64 {
        self.header_u64(offset_of!(Header, samples_total))
    }

    /// Word `i` of what the agent costs its process (see [`cost`]).
    pub fn cost(&self, i: usize) -> &AtomicU64 {
        assert!(i < cost::WORDS);
        // SAFETY: every segment this writer lays out (`Layout::new`) puts
        // the module records after the cost block, which is 8-aligned and
        // only ever accessed atomically.
        unsafe { &*(self.base.add(cost::AT + i * 8) as *const AtomicU64) }
    }
    pub fn samples_lost(&self) -> &AtomicU64 {
        self.header_u64(offset_of!(Header, samples_lost))
    }
    pub fn samples_unknown(&self) -> &AtomicU64 {
        self.header_u64(offset_of!(Header, samples_unknown))
    }

    /// Records which sampler runs, why (with the errno behind it, if any),
    /// and its period.
    pub fn set_sampler(&self, sampler: Sampler, why: Why, errno: u32, period_ns: u64) {
        self.header_u32(offset_of!(Header, sampler))
            .store(sampler.code(), Ordering::Relaxed);
        self.header_u32(offset_of!(Header, sampler_why))
            .store(why.code(), Ordering::Relaxed);
        self.header_u32(offset_of!(Header, sampler_errno))
            .store(errno, Ordering::Relaxed);
        self.header_u64(offset_of!(Header, sample_period_ns))
            .store(period_ns, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(layout: &Layout) -> Vec<u64> {
        vec![0u64; (layout.total_size / 8) as usize]
    }

    #[test]
    fn capacity_limits_are_enforced() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 2,
            strings: 16,
            stripes: 2,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the test's buffer: zeroed, 8-aligned, the layout's size, and alive as long as
        // the writer.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        assert_eq!(
            w.add_function(b"f", 0, 1),
            Err(WriteError::Full),
            "no module yet"
        );
        w.add_module(b"m", 0).unwrap();
        assert_eq!(w.add_module(b"n", 0), Err(WriteError::Full));
        w.add_function(b"a", 0, 1).unwrap();
        w.add_function(b"b", 0, 1).unwrap();
        assert_eq!(w.add_function(b"c", 0, 1), Err(WriteError::Full));
        assert_eq!(w.add_string(&[0u8; 64]), Err(WriteError::Full));
        assert_eq!(w.counters().append_stripe(7), Some(1));
        assert_eq!(w.counters().append_stripe(8), None);
    }

    #[test]
    fn functions_are_undecided_until_their_status_is_set() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 2,
            strings: 64,
            stripes: 1,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the test's buffer: zeroed, 8-aligned, the layout's size, and alive as long as
        // `w`.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        w.add_module(b"m", 0).unwrap();
        let a = w.add_function(b"a", 0, 1).unwrap();
        w.add_function(b"b", 0, 1).unwrap();
        w.set_status(a, None);
        // SAFETY: the buffer's own bytes, borrowed while it lives.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) };
        let snap = crate::read_snapshot(bytes).unwrap();
        assert_eq!(snap.functions[0].refused, None);
        assert_eq!(
            snap.functions[1].refused,
            Some(crate::Refusal::NotAttempted)
        );
        assert_eq!(snap.modules[0].patched, 1);
        assert_eq!(
            snap.modules[0].refused,
            vec![(crate::Refusal::NotAttempted, 1)]
        );
    }

    /// Counters folded without end (a fold sequence left odd) give no
    /// sum of one moment: the reader says so instead of a torn sum; the
    /// added time of a process without a sampler keeps its period.
    #[test]
    fn endless_folds_read_as_busy_and_time_keeps_a_period() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 2,
            strings: 64,
            stripes: 2,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the test's buffer: zeroed, 8-aligned, the layout's size, and alive as long as
        // `w`.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        w.add_module(b"m", 0).unwrap();
        w.add_function(b"a", 0, 1).unwrap();
        w.counters().set_period_if_unset(1_000_000);
        w.counters().set_period_if_unset(5);
        let bytes =
                // SAFETY: the buffer's own bytes, borrowed while it lives.
            || unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) };
        assert_eq!(
            crate::read_snapshot(bytes()).unwrap().sample_period_ns,
            1_000_000
        );
        w.counters().fold_seq().store(1, Ordering::Release);
        assert_eq!(
            crate::read_snapshot(bytes()),
            Err(crate::SegmentError::Busy)
        );
        w.counters().fold_seq().store(2, Ordering::Release);
        assert!(crate::read_snapshot(bytes()).is_ok());
    }

    /// A sampled-only module named after others were recorded: its
    /// functions follow theirs, and a reader sees a consistent segment
    /// before (with the on-demand note) and after.
    #[test]
    fn a_module_named_on_demand_lists_its_functions_last() {
        let layout = Layout::new(Capacities {
            modules: 3,
            functions: 8,
            strings: 256,
            stripes: 1,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the buffer is a whole segment of this layout and outlives `w`.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        let lib = w.add_sampled_module(b"/lib/libc.so.6", 0x7000).unwrap();
        w.set_named_on_demand(lib, true);
        w.add_module(b"/app", 0x1000).unwrap();
        let f = w.add_function(b"main", 0x10, 4).unwrap();
        w.set_status(f, None);
        let snap = |buf: &Vec<u64>| {
            // SAFETY: the buffer's own bytes, borrowed while it lives.
            let bytes =
                unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) };
            crate::read_snapshot(bytes).unwrap()
        };
        let before = snap(&buf);
        assert_eq!(before.modules[0].functions, 0);
        assert!(before.modules[0].note.unwrap().contains("when one does"));
        let funcs = [(&b"memcpy"[..], 0x100, 16), (&b"strlen"[..], 0x200, 8)];
        assert_eq!(w.name_module(lib, funcs.into_iter()), 2);
        w.set_named_on_demand(lib, false);
        // Named once only; an instrumented module is never named this way.
        assert_eq!(w.name_module(lib, funcs.into_iter()), 0);
        assert_eq!(w.name_module(1, funcs.into_iter()), 0);
        let after = snap(&buf);
        assert_eq!(after.modules[0].functions, 2);
        assert_eq!(after.modules[0].note, None);
        let names: Vec<_> = after
            .functions
            .iter()
            .map(|f| (f.name.as_str(), f.module))
            .collect();
        assert_eq!(names, vec![("main", 1), ("memcpy", 0), ("strlen", 0)]);
        assert!(!after.functions[1].instrumented);
    }
}
