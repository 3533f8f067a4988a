//! `rtprofd`: follows every registered process and publishes, every tick,
//! per-span statistics in the presentation segment that schedulers read.
//! It only aggregates: agents count and sample.

mod registry;
mod spans;

use clap::Parser;
use registry::{Mapped, Registered};
use rtprof_shared::present::{segment_bytes, PresentWriter};
use spans::Tracked;
use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "rtprofd",
    version,
    about = "Publishes per-span statistics of every profiled process"
)]
struct Args {
    /// Unix socket agents register at.
    #[arg(long, default_value = "/run/rtprof/rtprofd.sock")]
    socket: PathBuf,
    /// Presentation segment schedulers map.
    #[arg(long, default_value = "/run/rtprof/present")]
    present: PathBuf,
    /// Milliseconds between snapshots (at least 50).
    #[arg(long, default_value_t = 1000)]
    tick: u64,
    /// Milliseconds a span covers.
    #[arg(long, default_value_t = 5000)]
    span: u64,
    /// Group allowed to read the presentation segment (besides root).
    #[arg(long)]
    group: Option<String>,
    /// Size of each of the segment's two buffers, in MiB.
    #[arg(long, default_value_t = 64)]
    buffer_mib: u64,
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A segment being followed.
struct Entry {
    reg: Registered,
    map: Option<Mapped>,
    tracked: Option<Tracked>,
    /// Ticks it has stayed unreadable (an agent still starting).
    pending: u32,
}

impl Entry {
    fn new(reg: Registered) -> Entry {
        Entry {
            reg,
            map: None,
            tracked: None,
            pending: 0,
        }
    }

    /// Reads the segment at `now`: `Ok(None)` while the agent is still
    /// filling it in.
    fn observe(&mut self, now: u64, span_ns: u64) -> Result<Option<spans::Seen>, String> {
        if self.map.is_none() {
            self.map = Some(Mapped::open(&self.reg.fd)?);
        }
        let map = self.map.as_ref().unwrap();
        let Some(bytes) = map.bytes() else {
            return Ok(None);
        };
        let h = rtprof_shared::read_header(bytes).map_err(|e| e.to_string())?;
        map.check_size(&h)?;
        let seen = match &mut self.tracked {
            Some(t) => t.observe(bytes, &h, now, span_ns),
            None => Tracked::new(bytes, &h, now, span_ns).map(|(t, seen)| {
                self.tracked = Some(t);
                seen
            }),
        };
        match seen {
            Ok(s) => Ok(Some(s)),
            // Still starting: filled in but not yet consistent.
            Err(_)
                if self.tracked.is_none() && h.state == rtprof_shared::layout::state::STARTING =>
            {
                Ok(None)
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

fn alive(pid: u32) -> bool {
    unsafe { libc::kill(pid as i32, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

fn group_id(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    let g = unsafe { libc::getgrnam(c.as_ptr()) };
    (!g.is_null()).then(|| unsafe { (*g).gr_gid })
}

fn create_present(a: &Args) -> Result<(memmap2::MmapMut, PresentWriter), String> {
    let len = segment_bytes(a.buffer_mib << 20);
    let tmp = a.present.with_extension("new");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    if let Some(g) = &a.group {
        let gid = group_id(g).ok_or_else(|| format!("no group {g}"))?;
        std::os::unix::fs::fchown(&f, None, Some(gid)).map_err(|e| e.to_string())?;
    }
    f.set_len(len).map_err(|e| e.to_string())?;
    let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }.map_err(|e| e.to_string())?;
    let w = unsafe { PresentWriter::init(map.as_mut_ptr(), len, a.tick * 1_000_000) };
    // Readers find a complete header or the previous segment, never half.
    std::fs::rename(&tmp, &a.present).map_err(|e| e.to_string())?;
    Ok((map, w))
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    // Every tick builds tables of about the same size: keep freed memory
    // rather than giving it back to the kernel and faulting it in again.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
    let tick = Duration::from_millis(a.tick.max(50));
    let span_ns = a.span.max(a.tick) * 1_000_000;
    if let Some(dir) = a.socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let listener = match registry::listen(&a.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rtprofd: cannot listen at {}: {e}", a.socket.display());
            return std::process::ExitCode::from(1);
        }
    };
    let (_map, mut writer) = match create_present(&a) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("rtprofd: cannot create {}: {e}", a.present.display());
            return std::process::ExitCode::from(1);
        }
    };
    eprintln!(
        "rtprofd: listening at {}, publishing {} every {} ms over {} ms",
        a.socket.display(),
        a.present.display(),
        tick.as_millis(),
        span_ns / 1_000_000
    );
    let mut entries: Vec<Entry> = Vec::new();
    // Agents that started before us (root only: others' map_files are closed).
    entries.extend(registry::discover(&|_| false).into_iter().map(Entry::new));
    if !entries.is_empty() {
        eprintln!("rtprofd: found {} running agent(s)", entries.len());
    }
    loop {
        let started = Instant::now();
        // New registrations.
        while let Ok((conn, _)) = listener.accept() {
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
            match registry::receive(&conn) {
                Ok(reg) => entries.push(Entry::new(reg)),
                Err(e) => eprintln!("rtprofd: registration refused: {e}"),
            }
        }
        let now = now_ns();
        // Snapshot everyone; note who ended.
        let mut newest_start: HashMap<u32, u64> = HashMap::new();
        entries.retain_mut(|e| {
            let seen = match e.observe(now, span_ns) {
                Ok(Some(s)) => s,
                Ok(None) if e.pending < 50 => {
                    e.pending += 1;
                    return true;
                }
                Ok(None) => {
                    eprintln!(
                        "rtprofd: pid {}: segment never filled in; dropped",
                        e.reg.pid
                    );
                    return false;
                }
                Err(err) => {
                    eprintln!(
                        "rtprofd: pid {} (uid {}): segment rejected: {err}",
                        e.reg.pid, e.reg.uid
                    );
                    return false;
                }
            };
            // A process may only speak for itself.
            if seen.pid != e.reg.pid {
                eprintln!(
                    "rtprofd: pid {} registered a segment of pid {} ({}); rejected",
                    e.reg.pid,
                    seen.pid,
                    e.tracked.as_ref().map_or("?", |t| t.exe.as_str())
                );
                return false;
            }
            let ns = newest_start.entry(seen.pid).or_default();
            *ns = (*ns).max(seen.start_ns);
            let t = e.tracked.as_mut().unwrap();
            if seen.state == rtprof_shared::layout::state::EXITED || !alive(seen.pid) {
                t.ended = true;
            }
            true
        });
        // An image replaced by exec: the same pid registered again, later.
        for e in &mut entries {
            if let Some(t) = &mut e.tracked {
                if newest_start.get(&t.pid).is_some_and(|&s| s > t.start_ns) {
                    t.ended = true;
                }
            }
        }
        let tables: Vec<_> = entries
            .iter()
            .filter_map(|e| e.tracked.as_ref().map(Tracked::table))
            .collect();
        if let Err(e) = writer.publish(now, span_ns, &tables) {
            eprintln!("rtprofd: cannot publish: {e}");
        }
        // Ended processes were published once more, with their last counts.
        entries.retain(|e| !e.tracked.as_ref().is_some_and(|t| t.ended));
        std::thread::sleep(tick.saturating_sub(started.elapsed()));
    }
}
