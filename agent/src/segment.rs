//! The counter segment in shared memory: an anonymous memfd, or a file in the
//! private directory `rtprof run` collects from. Memory is reserved with
//! fallocate before use, so a full disk or tmpfs means "no new stripe"
//! (the thread counts in the shared stripe), never SIGBUS in the host.

use rtprof_shared::{Capacities, Layout, SegmentWriter};
use std::ffi::CString;
use std::fmt;
use std::io;

#[derive(Debug)]
pub enum SegmentError {
    RunDir(String),
    Create(io::Error),
    Reserve(io::Error),
    Map(io::Error),
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentError::RunDir(why) => write!(f, "run directory unusable: {why}"),
            SegmentError::Create(e) => write!(f, "cannot create counter segment: {e}"),
            SegmentError::Reserve(e) => write!(f, "cannot reserve counter memory: {e}"),
            SegmentError::Map(e) => write!(f, "cannot map counter segment: {e}"),
        }
    }
}

pub struct Segment {
    pub writer: SegmentWriter,
    fd: libc::c_int,
    /// Identity of the file behind `fd`, checked before each use: a program
    /// may close every descriptor and reuse the number.
    ident: (u64, u64),
    pub path: Option<String>,
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

fn identity(fd: libc::c_int) -> Option<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Opens `<dir>/<pid>-<n>.seg`, after checking the directory is ours alone.
fn create_in_dir(dir: &str) -> Result<(libc::c_int, String), SegmentError> {
    let cdir = CString::new(dir).map_err(|_| SegmentError::RunDir("NUL in path".into()))?;
    let dfd = unsafe {
        libc::open(
            cdir.as_ptr(),
            libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_RDONLY,
        )
    };
    if dfd < 0 {
        return Err(SegmentError::RunDir(format!("{dir}: {}", last_err())));
    }
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::fstat(dfd, &mut st) } == 0
        && st.st_uid == unsafe { libc::geteuid() }
        && st.st_mode & 0o077 == 0;
    if !ok {
        unsafe { libc::close(dfd) };
        return Err(SegmentError::RunDir(format!(
            "{dir}: not a private directory owned by this user"
        )));
    }
    let pid = std::process::id();
    let mut result = Err(SegmentError::Create(io::Error::from_raw_os_error(
        libc::EEXIST,
    )));
    for n in 0..1000 {
        let name = format!("{pid}-{n}.seg");
        let cname = CString::new(name.clone()).unwrap();
        let fd = unsafe {
            libc::openat(
                dfd,
                cname.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd >= 0 {
            result = Ok((fd, format!("{dir}/{name}")));
            break;
        }
        let e = last_err();
        if e.raw_os_error() != Some(libc::EEXIST) {
            result = Err(SegmentError::Create(e));
            break;
        }
    }
    unsafe { libc::close(dfd) };
    result
}

fn reserve(fd: libc::c_int, off: u64, len: u64) -> io::Result<()> {
    match unsafe { libc::fallocate(fd, 0, off as libc::off_t, len as libc::off_t) } {
        0 => Ok(()),
        _ => Err(last_err()),
    }
}

impl Segment {
    pub fn create(
        caps: Capacities,
        run_dir: Option<&str>,
        pid: u32,
        ppid: u32,
        start_ns: u64,
    ) -> Result<Segment, SegmentError> {
        let layout = Layout::new(caps);
        let (fd, path) = match run_dir {
            Some(d) => {
                let (fd, p) = create_in_dir(d)?;
                (fd, Some(p))
            }
            None => {
                let fd = unsafe { libc::memfd_create(c"rtprof".as_ptr(), libc::MFD_CLOEXEC) };
                if fd < 0 {
                    return Err(SegmentError::Create(last_err()));
                }
                (fd, None)
            }
        };
        let fail = |e: SegmentError| {
            unsafe { libc::close(fd) };
            if let Some(p) = &path {
                let _ = std::fs::remove_file(p);
            }
            Err(e)
        };
        // Sparse file: stripes are reserved one at a time as threads start.
        if unsafe { libc::ftruncate(fd, layout.total_size as libc::off_t) } != 0 {
            return fail(SegmentError::Reserve(last_err()));
        }
        // Metadata and the shared stripe must always be backed.
        if let Err(e) = reserve(fd, 0, layout.stripe_off(1)) {
            return fail(SegmentError::Reserve(e));
        }
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.total_size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return fail(SegmentError::Map(last_err()));
        }
        let writer = unsafe { SegmentWriter::init(p as *mut u8, layout, pid, ppid, start_ns) };
        let ident = identity(fd).unwrap_or_default();
        Ok(Segment {
            writer,
            fd,
            ident,
            path,
        })
    }

    /// A stripe for a new thread, backed by memory, or `None`.
    pub fn new_stripe(&self, tid: u32) -> Option<u32> {
        let idx = self.writer.alloc_stripe(tid)?;
        let l = self.writer.layout();
        let backed = identity(self.fd) == Some(self.ident)
            && reserve(self.fd, l.stripe_off(idx), l.stripe_bytes).is_ok();
        if !backed {
            self.writer.retire_stripe(idx);
            return None;
        }
        Some(idx)
    }

    /// The whole segment, for building a report of this process.
    pub fn bytes(&self) -> &[u8] {
        unsafe {
            std::slice::from_raw_parts(self.writer.base(), self.writer.layout().total_size as usize)
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
            stripes: 4,
        }
    }

    #[test]
    fn memfd_segment_round_trips() {
        let mut s = Segment::create(caps(), None, 1, 0, 0).unwrap();
        s.writer.set_exe(b"/x").unwrap();
        s.writer.add_module(b"/x", 0).unwrap();
        let f = s.writer.add_function(b"f", 0x10, 4).unwrap();
        let st = s.new_stripe(9).unwrap();
        unsafe { *s.writer.stripe_ptr(st).add(f as usize) += 2 };
        let snap = rtprof_shared::read_snapshot(s.bytes()).unwrap();
        assert_eq!(snap.functions[0].calls, 2);
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
            Err(SegmentError::RunDir(_))
        ));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let s = Segment::create(caps(), Some(d), 1, 0, 0).unwrap();
        let p = s.path.clone().unwrap();
        let s2 = Segment::create(caps(), Some(d), 1, 0, 0).unwrap();
        assert_ne!(
            s2.path.unwrap(),
            p,
            "a second segment of one pid (exec) gets a new name"
        );
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
