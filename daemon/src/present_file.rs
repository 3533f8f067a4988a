//! The presentation segment's file: made complete beside its path, then
//! renamed over it, so readers find either the previous segment or a whole
//! new header. Made with `O_CREAT|O_EXCL|O_NOFOLLOW` and renamed relative
//! to the directory's descriptor (`rtprof_shared::files`): a name planted
//! beside it is never followed nor taken over; a device or FIFO at the
//! path, or a directory other users may write, is refused.

use crate::error::Error;
use rtprof_abi::present::{segment_bytes, PresentWriter};
use rtprof_shared::files::{Destination, FileError};
use std::path::Path;

/// The id of group `name`, if there is one.
fn group_id(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is NUL-terminated; the result, if not null, points at
    // libc's static entry, read at once (single-threaded start-up).
    let g = unsafe { libc::getgrnam(c.as_ptr()) };
    // SAFETY: as above: a non-null entry, read at once.
    (!g.is_null()).then(|| unsafe { (*g).gr_gid })
}

/// Creates the segment at `path` with two buffers of `buffer_mib` MiB each,
/// readable by `group` (besides root), announcing a tick of `tick_ms`.
/// The mapping must outlive the writer.
pub fn create(
    path: &Path,
    group: Option<&str>,
    buffer_mib: u64,
    tick_ms: u64,
) -> Result<(memmap2::MmapMut, PresentWriter), Error> {
    let len = segment_bytes(buffer_mib << 20);
    let not_regular = || Error::PresentRefused(FileError::NotRegular { path: path.into() });
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(not_regular());
    }
    let (dir, name) = match Destination::prepare(path).map_err(Error::PresentRefused)? {
        Destination::Replace { dir, name } => (dir, name),
        Destination::InPlace(_) => return Err(not_regular()),
    };
    let (tmp, f) = dir
        .create_temp(&name, 0o640)
        .map_err(|source| Error::PresentCreate {
            path: dir.path().join(&name),
            source,
        })?;
    let made = fill(f, group, len, tick_ms).and_then(|made| {
        // Readers find a complete header or the previous segment, never
        // half.
        dir.rename(&tmp, &name).map_err(Error::PresentRename)?;
        Ok(made)
    });
    if made.is_err() {
        let _ = dir.unlink(&tmp);
    }
    made
}

/// Gives `f` all its `len` bytes now: a sparse file would take its blocks
/// as the mapping is first written, and a file system another user filled
/// meanwhile would answer SIGBUS. The file (new, beside the segment's
/// path) is dropped if it cannot be: the previous segment stays.
fn allocate(f: &std::fs::File, len: u64) -> Result<(), Error> {
    use std::os::fd::AsRawFd;
    let off = libc::off_t::try_from(len).map_err(|_| Error::PresentAllocate {
        len,
        source: std::io::Error::from_raw_os_error(libc::EFBIG),
    })?;
    // SAFETY: allocates blocks of our own new file; takes integers only.
    match unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, off) } {
        0 => Ok(()),
        e => Err(Error::PresentAllocate {
            len,
            source: std::io::Error::from_raw_os_error(e),
        }),
    }
}

/// Sizes, maps and initialises the new segment file `f`.
fn fill(
    f: std::fs::File,
    group: Option<&str>,
    len: u64,
    tick_ms: u64,
) -> Result<(memmap2::MmapMut, PresentWriter), Error> {
    if let Some(g) = group {
        let gid = group_id(g).ok_or_else(|| Error::NoGroup(g.to_string()))?;
        std::os::unix::fs::fchown(&f, None, Some(gid)).map_err(Error::PresentChown)?;
    }
    allocate(&f, len)?;
    // SAFETY: a file only we write (readers map it read-only), of `len`
    // bytes, all of them allocated (so a write to the mapping cannot
    // fault for want of room), which nobody truncates while we run.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }.map_err(Error::PresentMap)?;
    // SAFETY: `map` is `len` bytes, writable, and outlives the writer
    // (the caller keeps both to the end).
    let w = unsafe { PresentWriter::init(map.as_mut_ptr(), len, tick_ms * 1_000_000) };
    Ok((map, w))
}
