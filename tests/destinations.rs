//! Files rtprof writes where others could interfere: a device or FIFO at
//! the destination is written in place, never replaced; names planted
//! beside a destination (links to a victim, another user's files) are
//! never followed nor taken over; a directory other users may write is
//! refused unless sticky and the destination is the writer's own; reports
//! are private (0600) whatever the umask. The agent's `RTPROF_REPORT`,
//! `rtprof run --json` and rtprofd's presentation segment alike.

use rtprof_e2e::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
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
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("umask 000; exec '{}'", bin.display()))
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
    between(pid);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn report_calls(report: &Path) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    function_named(&v["processes"][0], "work")["calls"]
        .as_u64()
        .unwrap()
}

/// Root writes its report in a sticky directory every user may write
/// (as /tmp): another user planted, under the temporary names the agent
/// has used and uses, links to a root-owned victim and files of her own.
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
