//! The process's memory map from /proc/self/maps: which ranges may be read
//! (ELF flags say what a segment was mapped as, not what the program has
//! since made of it) and where the free gaps are.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub exec: bool,
    /// The mapped file's device (major, minor) and inode; 0 for anonymous
    /// memory.
    pub dev: (u32, u32),
    pub inode: u64,
}

#[derive(Debug, Default)]
pub struct Maps {
    /// Sorted by start, non-overlapping.
    pub mappings: Vec<Mapping>,
}

impl Maps {
    pub fn parse(text: &str) -> Maps {
        let mut mappings: Vec<Mapping> = text
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let (a, b) = w.next()?.split_once('-')?;
                let perms = w.next()?;
                let _offset = w.next()?;
                let (major, minor) = w.next()?.split_once(':')?;
                Some(Mapping {
                    start: u64::from_str_radix(a, 16).ok()?,
                    end: u64::from_str_radix(b, 16).ok()?,
                    read: perms.starts_with('r'),
                    exec: perms.as_bytes().get(2) == Some(&b'x'),
                    dev: (
                        u32::from_str_radix(major, 16).ok()?,
                        u32::from_str_radix(minor, 16).ok()?,
                    ),
                    inode: w.next()?.parse().ok()?,
                })
            })
            .collect();
        mappings.sort_by_key(|m| m.start);
        Maps { mappings }
    }

    pub fn current() -> Maps {
        Maps::parse(&read_proc("/proc/self/maps"))
    }

    /// Whether every byte of [addr, addr+len) is mapped readable.
    pub fn readable(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let mut at = addr;
        let mut i = self.mappings.partition_point(|m| m.end <= at);
        while at < end {
            match self.mappings.get(i) {
                Some(m) if m.start <= at && m.read => {
                    at = m.end;
                    i += 1;
                }
                _ => return false,
            }
        }
        true
    }

    /// Whether `addr` lies in a mapping that may be executed.
    pub fn executable(&self, addr: u64) -> bool {
        self.at(addr).is_some_and(|m| m.exec)
    }

    /// The mapping that holds `addr`.
    pub fn at(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.end <= addr);
        self.mappings.get(i).filter(|m| m.start <= addr)
    }

    /// Unmapped ranges from `lowest` up to `limit`.
    pub fn gaps(&self, lowest: u64, limit: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut prev = lowest;
        for m in self.mappings.iter().filter(|m| m.start < limit) {
            if m.start > prev {
                gaps.push((prev, m.start));
            }
            prev = prev.max(m.end);
        }
        if prev < limit {
            gaps.push((prev, limit));
        }
        gaps
    }
}

/// A file of /proc read whole (empty if it cannot be). Its size is
/// unknown beforehand (0 in a stat): with room for 16 KiB from the start,
/// not the doubling steps from 32 bytes a read of unknown size makes.
pub fn read_proc(path: &str) -> String {
    let Ok(c) = std::ffi::CString::new(path) else {
        return String::new();
    };
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return String::new();
    }
    let bytes = read_all(fd);
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    String::from_utf8(bytes).unwrap_or_default()
}

/// Everything `fd` reads, with `read` alone: no size asked first (`statx`)
/// nor position (`lseek`), as `std::fs` would, since before a seccomp
/// filter is tried out only calls the dynamic loader made itself are
/// sure to be allowed (openat, read, close, newfstatat, access, mmap...).
pub fn read_all(fd: libc::c_int) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(16 << 10);
    loop {
        if out.capacity() - out.len() < 4096 {
            out.reserve(out.capacity());
        }
        let spare = out.capacity() - out.len();
        // SAFETY: reads into the vector's spare capacity, `spare` bytes.
        let n = unsafe { libc::read(fd, out.as_mut_ptr().add(out.len()).cast(), spare) };
        if n > 0 {
            // SAFETY: the kernel wrote `n` bytes there.
            unsafe { out.set_len(out.len() + n as usize) };
        } else if n == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
00400000-00401000 r--p 00000000 08:01 1 /bin/x
00401000-00402000 r-xp 00001000 08:01 1 /bin/x
00402000-00403000 ---p 00000000 00:00 0
00500000-00600000 rw-p 00000000 00:00 0 [heap]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
";

    #[test]
    fn readability_spans_adjacent_mappings_and_stops_at_holes() {
        let m = Maps::parse(SAMPLE);
        assert!(m.readable(0x400ff0, 0x20));
        assert!(!m.readable(0x401ff0, 0x20), "next page is PROT_NONE");
        assert!(!m.readable(0x403000, 1), "unmapped");
        assert!(m.readable(0x500000, 0x100000));
        assert!(!m.readable(u64::MAX - 1, 4));
        let x = m.at(0x401234).unwrap();
        assert_eq!((x.dev, x.inode), ((8, 1), 1));
        assert_eq!(m.at(0x500000).unwrap().inode, 0);
        assert!(m.at(0x403000).is_none());
    }

    #[test]
    fn gaps_stay_below_the_limit() {
        let m = Maps::parse(SAMPLE);
        let g = m.gaps(0x100000, 0x7fff_ffff_f000);
        assert_eq!(g[0], (0x100000, 0x400000));
        assert_eq!(g[1], (0x403000, 0x500000));
        assert_eq!(*g.last().unwrap(), (0x600000, 0x7fff_ffff_f000));
        assert!(g.iter().all(|&(a, b)| a < b));
    }

    #[test]
    fn own_maps_parse() {
        let m = Maps::current();
        let here = own_maps_parse as *const () as u64;
        assert!(m.readable(here, 16));
    }
}
