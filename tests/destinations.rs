//! Files rtprof writes where others could interfere: a device or FIFO at
//! the destination is written in place, never replaced; names planted
//! beside a destination (links to a victim, another user's files) are
//! never followed nor taken over; a directory other users may write is
//! refused unless sticky and the destination is the writer's own; reports
//! are private (0600) whatever the umask; a link on the way that another
//! user may have planted in a sticky shared directory is not followed. The
//! agent's `RTPROF_REPORT`, `rtprof run --json` and rtprofd's presentation
//! segment alike; a report failing at exit goes to syslog when stderr
//! cannot take it.

use rtprof_e2e::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn chmod(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// Runs `script` as nobody.
fn as_nobody(script: &str) {
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["/bin/sh", "-c", script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{script}: {o:?}");
}

/// `bin` (waits_for_input.c) under the agent with `RTPROF_REPORT=report`
/// and umask 000: `between` runs once the process has started and told
/// its pid, before it goes on to its end. Returns its stderr.
fn run_reporting(bin: &Path, report: &Path, between: impl FnOnce(u32)) -> String {
    let (status, stderr) = run_reporting_with(bin, report, "", |pid, _| between(pid));
    assert!(status.success(), "{status:?}: {stderr}");
    stderr
}

/// As [`run_reporting`], the program started with the shell's `redirect`
/// (`2>&-`) and `between` given the child too (to close its stderr's other
/// end); returns its status and stderr, whatever they are.
fn run_reporting_with(
    bin: &Path,
    report: &Path,
    redirect: &str,
    between: impl FnOnce(u32, &mut std::process::Child),
) -> (std::process::ExitStatus, String) {
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("umask 000; exec '{}' {redirect}", bin.display()))
        .env("LD_PRELOAD", agent())
        .env("RTPROF_REPORT", report)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid: u32 = line.trim().strip_prefix("pid ").unwrap().parse().unwrap();
    between(pid, &mut child);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = child.wait_with_output().unwrap();
    (o.status, String::from_utf8_lossy(&o.stderr).into_owned())
}

fn report_calls(report: &Path) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    function_named(&v["processes"][0], "work")["calls"]
        .as_u64()
        .unwrap()
}

/// Root writes its report in a sticky directory every user may write
/// (as /tmp): another user planted, under temporary names earlier agents
/// used, links to a root-owned victim and files of her own.
/// The victim is untouched, her files stay hers, and the report is
/// root's, 0600 although the umask was 000.
#[test]
fn planted_names_beside_a_report_are_neither_followed_nor_taken_over() {
    let dir = scratch("planted");
    let bin = compile_o2("waits_for_input.c", &[], &dir);
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let victim = dir.join("victim");
    std::fs::write(&victim, "root's own\n").unwrap();
    let report = shared.join("r.json");
    let mut hers = PathBuf::new();
    let stderr = run_reporting(&bin, &report, |pid| {
        let v = victim.display();
        let s = shared.display();
        hers = shared.join(format!(".r.json.rtprof-{pid}-1"));
        as_nobody(&format!(
            "set -e
             ln -s {v} {s}/r.json.{pid}.tmp
             ln -s {v} {s}/.r.json.rtprof-{pid}-0
             echo hers > {h}
             chmod 666 {h}",
            h = hers.display()
        ));
    });
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's own\n");
    assert_eq!(std::fs::read_to_string(&hers).unwrap(), "hers\n");
    assert_eq!(std::fs::metadata(&hers).unwrap().uid(), 65534);
    let m = std::fs::symlink_metadata(&report).unwrap();
    assert!(m.is_file(), "{stderr}");
    assert_eq!((m.uid(), mode(&report)), (0, 0o600), "{stderr}");
    assert_eq!(report_calls(&report), 1000);
}

/// In a sticky shared directory, a report name another user holds (her
/// file, or her link) is refused with one message, and left as it is; a
/// directory others may write that is not sticky is refused too.
#[test]
fn shared_directories_take_a_report_only_under_the_writers_own_name() {
    let dir = scratch("shared-dirs");
    let bin = compile_o2("waits_for_input.c", &[], &dir);
    let sticky = dir.join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    let s = sticky.display();
    as_nobody(&format!(
        "set -e; echo hers > {s}/theirs.json; ln -s /etc/passwd {s}/link.json"
    ));
    for name in ["theirs.json", "link.json"] {
        let p = sticky.join(name);
        let before = std::fs::symlink_metadata(&p).unwrap();
        let stderr = run_reporting(&bin, &p, |_| {});
        assert!(
            stderr.contains("other users may write, and not this user's own file"),
            "{name}: {stderr}"
        );
        let after = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(
            (before.ino(), before.uid()),
            (after.ino(), after.uid()),
            "{name}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(sticky.join("theirs.json")).unwrap(),
        "hers\n"
    );

    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let stderr = run_reporting(&bin, &open.join("r.json"), |_| {});
    assert!(
        stderr.contains("other users may write this directory (and it is not sticky)"),
        "{stderr}"
    );
    assert!(!open.join("r.json").exists());

    // rtprof run says so before the program runs.
    let o = Command::new(rtprof())
        .args(["run", "--json"])
        .arg(open.join("r.json"))
        .arg("--")
        .arg("/bin/true")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("other users may write this directory"),
        "{o:?}"
    );
}

/// `RTPROF_REPORT=/dev/null` as root leaves /dev/null a device (in a
/// private mount namespace whose /dev is a tmpfs with its own null); a
/// FIFO receives the report through it and stays a FIFO; rtprofd refuses
/// a presentation segment at a device and at a FIFO, leaving both.
#[test]
fn devices_and_fifos_are_written_in_place() {
    private_machine(&[]);
    let dir = scratch("devices");
    let bin = compile_o2("waits_for_input.c", &[], &dir);
    sh_ok(
        "set -e
         mount -t tmpfs -o mode=0755 tmpfs /dev
         mknod -m 666 /dev/null c 1 3
         mknod -m 666 /dev/zero c 1 5",
    );
    let null = Path::new("/dev/null");
    let stderr = run_reporting(&bin, null, |_| {});
    let m = std::fs::metadata(null).unwrap();
    assert!(m.file_type().is_char_device(), "{stderr}");
    assert_eq!(m.rdev(), libc::makedev(1, 3), "{stderr}");

    let fifo = dir.join("fifo.json");
    sh_ok(&format!("mkfifo {}", fifo.display()));
    let reader = {
        let f = fifo.clone();
        std::thread::spawn(move || std::fs::read(f).unwrap())
    };
    let stderr = run_reporting(&bin, &fifo, |_| {});
    let through: serde_json::Value =
        serde_json::from_slice(&reader.join().unwrap()).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(
        function_named(&through["processes"][0], "work")["calls"],
        1000
    );
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());

    for at in [PathBuf::from("/dev/zero"), fifo.clone()] {
        let o = Command::new(rtprof().with_file_name("rtprofd"))
            .arg("--present")
            .arg(&at)
            .arg("--socket")
            .arg(dir.join("sock"))
            .output()
            .unwrap();
        assert!(!o.status.success(), "{}", at.display());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("not a regular file"),
            "{o:?}"
        );
        let t = std::fs::metadata(&at).unwrap().file_type();
        assert!(t.is_char_device() || t.is_fifo(), "{}", at.display());
    }
}

/// rtprofd's segment in a sticky shared directory: a link another user
/// planted under the old temporary name (`present.new`) to a root-owned
/// victim is not followed; the published segment is root's, 0640, not
/// hers.
#[test]
fn rtprofd_publishes_its_own_segment_whatever_was_planted() {
    let dir = scratch("present");
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let victim = dir.join("victim");
    std::fs::write(&victim, "root's own\n").unwrap();
    let s = shared.display();
    as_nobody(&format!(
        "set -e; ln -s {} {s}/present.new; touch {s}/.present.rtprof-x; chmod 666 {s}/.present.rtprof-x",
        victim.display()
    ));
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--buffer-mib", "1"]).stderr(Stdio::null());
    let mut d = Rtprofd::start(cmd, &shared);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's own\n");
    let m = std::fs::symlink_metadata(&d.present).unwrap();
    assert!(m.is_file());
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o640));
    d.stop();
}

/// A sticky directory every user may write (`sticky`, 1777) holding `d`,
/// a link another user (nobody) planted to `private`, root's own
/// directory (0700) with root's file `important` in it.
struct PlantedDirectoryLink {
    sticky: PathBuf,
    private: PathBuf,
}

impl PlantedDirectoryLink {
    fn make(dir: &Path) -> PlantedDirectoryLink {
        let (sticky, private) = (dir.join("sticky"), dir.join("private"));
        std::fs::create_dir(&sticky).unwrap();
        chmod(&sticky, 0o1777);
        std::fs::create_dir(&private).unwrap();
        chmod(&private, 0o700);
        std::fs::create_dir(private.join("sub")).unwrap();
        std::fs::write(private.join("important"), "root's own\n").unwrap();
        let link = sticky.join("d");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        PlantedDirectoryLink { sticky, private }
    }

    /// `important` is as it was, and nothing else came into `private`.
    fn assert_untouched(&self, before: &std::fs::Metadata) {
        let important = self.private.join("important");
        assert_eq!(std::fs::read_to_string(&important).unwrap(), "root's own\n");
        let after = std::fs::metadata(&important).unwrap();
        assert_eq!((before.ino(), before.mode()), (after.ino(), after.mode()));
        let mut names: Vec<String> = std::fs::read_dir(&self.private)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["important", "sub"]);
        assert_eq!(
            std::fs::read_dir(self.private.join("sub")).unwrap().count(),
            0
        );
    }
}

/// Root's report through a directory link another user planted in a
/// sticky shared directory (as `ln -s /root-only-dir /tmp/d`), the link
/// the last directory or one further up: not followed, whatever
/// `fs.protected_symlinks` says; root's file in the directory it names is
/// not replaced, nothing is created there, and the refusal is said.
#[test]
fn a_report_is_not_written_through_a_directory_link_another_user_planted() {
    let dir = scratch("planted-dir-link");
    let bin = compile_o2("waits_for_input.c", &[], &dir);
    let p = PlantedDirectoryLink::make(&dir);
    let before = std::fs::metadata(p.private.join("important")).unwrap();
    for report in ["d/important", "d/new.json", "d/sub/new.json"] {
        let stderr = run_reporting(&bin, &p.sticky.join(report), |_| {});
        let said = format!(
            "{}: a link owned by user 65534 in a sticky directory other users may write",
            p.sticky.join("d").display()
        );
        // Said at start-up and again when the report is due.
        assert!(
            stderr.contains("RTPROF_REPORT: cannot write a report there"),
            "{stderr}"
        );
        assert!(stderr.contains(&said), "{report}: {stderr}");
        assert!(stderr.contains("cannot write report"), "{report}: {stderr}");
        p.assert_untouched(&before);
    }
}

/// The same for rtprofd's presentation segment: refused, with one message
/// naming the link, and nothing made in root's directory.
#[test]
fn rtprofd_publishes_nothing_through_a_directory_link_another_user_planted() {
    let dir = scratch("present-dir-link");
    let p = PlantedDirectoryLink::make(&dir);
    let before = std::fs::metadata(p.private.join("important")).unwrap();
    for present in ["d/important", "d/present", "d/sub/present"] {
        let child = Command::new(rtprof().with_file_name("rtprofd"))
            .args(["--buffer-mib", "1", "--present"])
            .arg(p.sticky.join(present))
            .arg("--socket")
            .arg(dir.join("sock"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Killed on drop should it run on (as it did, publishing there).
        let mut child = Killed(child);
        let status = poll(
            "rtprofd refuses the segment and ends",
            std::time::Duration::from_secs(30),
            || child.try_wait().unwrap(),
        );
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!status.success(), "{present}: {stderr}");
        let said = format!(
            "{}: a link owned by user 65534 in a sticky directory other users may write",
            p.sticky.join("d").display()
        );
        assert!(stderr.contains(&said), "{present}: {stderr}");
        p.assert_untouched(&before);
    }
}

/// Links another user planted under every temporary name an earlier agent
/// would have tried (`.r.json.rtprof-PID-0` to `-100`) stop nothing: the
/// report is root's, written whole, the links left as they were.
#[test]
fn links_at_predictable_temporary_names_do_not_stop_a_report() {
    let dir = scratch("predictable");
    let bin = compile_o2("waits_for_input.c", &[], &dir);
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let victim = dir.join("victim");
    std::fs::write(&victim, "root's own\n").unwrap();
    let report = shared.join("r.json");
    let stderr = run_reporting(&bin, &report, |pid| {
        as_nobody(&format!(
            "set -e; for n in $(seq 0 100); do ln -s {} {}/.r.json.rtprof-{pid}-$n; done",
            victim.display(),
            shared.display()
        ));
    });
    let m = std::fs::symlink_metadata(&report).unwrap();
    assert!(m.is_file(), "{stderr}");
    assert_eq!((m.uid(), mode(&report)), (0, 0o600), "{stderr}");
    assert_eq!(report_calls(&report), 1000);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's own\n");
    let links = std::fs::read_dir(&shared)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_symlink())
        .count();
    assert_eq!(links, 101);
}

/// A syslog of the test's own: a private mount namespace whose /dev is a
/// tmpfs (with null and zero) and whose /dev/log is this socket.
fn private_syslog() -> UnixDatagram {
    private_machine(&[]);
    sh_ok(
        "set -e
         mount -t tmpfs -o mode=0755 tmpfs /dev
         mknod -m 666 /dev/null c 1 3
         mknod -m 666 /dev/zero c 1 5",
    );
    let log = UnixDatagram::bind("/dev/log").unwrap();
    log.set_nonblocking(true).unwrap();
    log
}

/// What reached the syslog (all sent already: the senders have ended).
fn logged(log: &UnixDatagram) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = log.recv(&mut buf) {
        out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    out
}

/// A report due on a read-only file system (the check at start-up passes:
/// the directory is there and root's) from a program whose stderr is
/// closed, or a pipe nobody reads any more: the failure goes to syslog
/// (user facility, warning, as `rtprof[PID]`), and the program ends as it
/// would have (not killed by SIGPIPE). With stderr open, it is said there
/// and syslog is left alone.
#[test]
fn a_report_failure_at_exit_goes_to_syslog_when_stderr_cannot_take_it() {
    let log = private_syslog();
    let dir = scratch("syslog");
    let bin = compile_o2("waits_for_input.c", &[], &dir);
    let ro = dir.join("ro");
    std::fs::create_dir(&ro).unwrap();
    sh_ok(&format!(
        "mount -t tmpfs -o ro,mode=0755 tmpfs {}",
        ro.display()
    ));
    let report = ro.join("r.json");
    let said = format!("cannot write report {}", report.display());

    let mut pid = 0;
    let (status, stderr) = run_reporting_with(&bin, &report, "2>&-", |p, _| pid = p);
    assert!(status.success(), "{status:?}: {stderr}");
    let lines = logged(&log);
    assert!(
        lines.iter().any(|l| l.starts_with("<12>")
            && l.contains(&format!("rtprof[{pid}]: "))
            && l.contains(&said)
            && l.contains("Read-only file system")),
        "closed stderr: {lines:?}"
    );

    let (status, stderr) = run_reporting_with(&bin, &report, "", |p, child| {
        pid = p;
        drop(child.stderr.take());
    });
    assert!(status.success(), "{status:?}: {stderr}");
    let lines = logged(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("rtprof[{pid}]: ")) && l.contains(&said)),
        "stderr a pipe nobody reads: {lines:?}"
    );

    let stderr = run_reporting(&bin, &report, |_| {});
    assert!(stderr.contains(&said), "{stderr}");
    assert_eq!(logged(&log), Vec::<String>::new());
    assert!(!report.exists());
}
