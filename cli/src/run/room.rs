//! Whether the run can be profiled at all: a private directory for the
//! agents' counter segments, on a filesystem with room for one.

use crate::error::Error;
use rtprof_abi::{Capacities, Layout};
use std::path::{Path, PathBuf};

/// A private directory, removed when dropped.
pub struct RunDir(pub PathBuf);

/// Where run directories go, and how messages name it: `TMPDIR` if it is
/// set; else `/dev/shm`, a tmpfs, if it is one: counter segments are
/// shared memory, and on a disk's filesystem (a `/tmp` that is not a
/// tmpfs) every process's set-up waited for blocks to be allocated (12 ms
/// of a small program's 23 here); else `/tmp`.
pub fn base() -> (PathBuf, String) {
    let shm = Path::new("/dev/shm");
    if std::env::var_os("TMPDIR").is_none_or(|v| v.is_empty()) && is_tmpfs(shm) {
        return (shm.to_path_buf(), shm.display().to_string());
    }
    let t = std::env::temp_dir();
    let named = format!(
        "TMPDIR ({})",
        rtprof_abi::escape::escape_text(&t.to_string_lossy())
    );
    (t, named)
}

/// A writable tmpfs directory.
fn is_tmpfs(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `st` is written by statfs before it is read; `c` is a
    // NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let tmpfs = unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0 && st.f_type == libc::TMPFS_MAGIC;
    // SAFETY: a NUL-terminated path; access only reads it.
    tmpfs && unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0
}

impl RunDir {
    pub fn new(base: &Path) -> std::io::Result<RunDir> {
        let base = base.join("rtprof-run-XXXXXX");
        let mut tmpl = base.into_os_string().into_encoded_bytes();
        tmpl.push(0);
        // mkdtemp creates the directory with mode 0700.
        // SAFETY: `tmpl` is a writable, NUL-terminated template.
        let p = unsafe { libc::mkdtemp(tmpl.as_mut_ptr() as *mut libc::c_char) };
        if p.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        tmpl.pop();
        Ok(RunDir(PathBuf::from(
            String::from_utf8_lossy(&tmpl).into_owned(),
        )))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn out_of_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// What is wrong with the run directories' place, said after its name: full, or unable to hold
/// counter segments at all.
pub fn trouble(e: &Error) -> String {
    if e.is_out_of_space() {
        format!("is full: {e}")
    } else {
        format!("cannot hold counter segments: {e}")
    }
}

/// Bytes the agent reserves at start-up for the smallest segment it makes
/// (a program with no functions): `capacities()` in
/// agent/src/lifecycle/startup.rs with its 512 spare modules, the spare
/// functions and name bytes, and one stripe, honouring the same variables.
/// A filesystem that cannot hold this cannot hold any segment.
fn smallest_segment() -> u64 {
    let var = |k: &str| std::env::var(k).ok()?.trim().parse::<u32>().ok();
    let spare = var("RTPROF_SPARE_FUNCTIONS").map_or(16384, |n| n.min(1 << 22));
    let threads = var("RTPROF_MAX_THREADS").map_or(1024, |n| n.clamp(1, 1 << 16));
    Layout::new(Capacities {
        modules: 512 + 1,
        functions: spare,
        strings: spare.saturating_mul(48).saturating_add(4096),
        stripes: threads + 3,
    })
    .stripe_off(1)
}

/// Whether `dir`'s filesystem has room for a counter segment: free blocks
/// and inodes (statvfs), then a reservation of the smallest segment's size
/// with fallocate, as the agent makes it. [`Error::is_out_of_space`] tells
/// a full filesystem from one that cannot hold segments at all.
pub fn room_for_segments(dir: &Path) -> Result<(), Error> {
    let c =
        std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| Error::NulInPath)?;
    // SAFETY: all-zero is a valid statvfs (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path, `st` a struct to fill.
    let ok = unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0;
    // Root may use the blocks and inodes a filesystem keeps for it.
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let (blocks, inodes) = if root {
        (st.f_bfree, st.f_ffree)
    } else {
        (st.f_bavail, st.f_favail)
    };
    if ok && blocks == 0 {
        return Err(Error::NoFreeSpace);
    }
    // Some filesystems report no inode counts at all (f_files 0).
    if ok && st.f_files != 0 && inodes == 0 {
        return Err(Error::NoFreeInodes);
    }
    let need = smallest_segment();
    let free = blocks.saturating_mul(st.f_frsize);
    let probe = dir.join(".rtprof-space-probe");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| {
            if out_of_space(&e) {
                Error::OutOfSpace(e)
            } else {
                Error::CannotCreateFile(e)
            }
        })?;
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a descriptor this function owns.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, need as libc::off_t) };
    let err = std::io::Error::last_os_error();
    drop(f);
    let _ = std::fs::remove_file(&probe);
    match r {
        0 => Ok(()),
        _ if out_of_space(&err) => Err(Error::TooLittleSpace { free, need }),
        _ => Err(Error::CannotReserve(err)),
    }
}
