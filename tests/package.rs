//! The Debian package that packaging/build-deb.sh builds from the release
//! binaries: its files, their modes and owner, its control data; the
//! programs in it work from where it puts them; and, installed with dpkg
//! in a private mount namespace, `rtprof system enable` switches the
//! packaged agent on and removing the package switches it off again.

use rtprof_e2e::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ok(o: Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Builds the package into `dir`; its path.
fn build(dir: &Path) -> PathBuf {
    let out = Command::new(root().join("packaging/build-deb.sh"))
        .arg(profile_dir())
        .arg(dir)
        .output()
        .unwrap();
    PathBuf::from(ok(out, "build-deb.sh").trim())
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    ok(
        Command::new("dpkg-deb")
            .args(args)
            .arg(deb)
            .output()
            .unwrap(),
        "dpkg-deb",
    )
}

/// The unit the package must ship: the repository's, starting
/// /usr/bin/rtprofd.
fn expected_unit() -> String {
    let repo = std::fs::read_to_string(root().join("daemon/rtprofd.service")).unwrap();
    assert!(repo.contains("ExecStart=/usr/local/bin/rtprofd "));
    repo.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.replace("/usr/local/bin/rtprofd", "/usr/bin/rtprofd") + "\n")
        .collect()
}

#[test]
fn the_package_holds_the_agent_the_tools_and_the_unit() {
    let dir = scratch("package");
    let deb = build(&dir);
    let name = deb.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("rtprof_{}_", env!("CARGO_PKG_VERSION"))),
        "{name}"
    );

    // path -> (mode, owner)
    let listing = dpkg_deb(&["-c"], &deb);
    let files: HashMap<String, (String, String)> = listing
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (
                w[5].trim_start_matches('.').to_string(),
                (w[0].to_string(), w[1].to_string()),
            )
        })
        .collect();
    for (path, mode) in [
        ("/usr/bin/rtprof", "-rwxr-xr-x"),
        ("/usr/bin/rtprofd", "-rwxr-xr-x"),
        ("/usr/lib/rtprof/", "drwxr-xr-x"),
        ("/usr/lib/rtprof/librtprof.so", "-rw-r--r--"),
        ("/lib/systemd/system/rtprofd.service", "-rw-r--r--"),
        ("/etc/rtprof/", "drwxr-xr-x"),
        ("/etc/rtprof/rtprof.conf", "-rw-r--r--"),
        ("/usr/share/doc/rtprof/copyright", "-rw-r--r--"),
        ("/usr/share/doc/rtprof/README.md.gz", "-rw-r--r--"),
        ("/usr/share/doc/rtprof/docs/", "drwxr-xr-x"),
        ("/usr/share/doc/rtprof/docs/agent.md.gz", "-rw-r--r--"),
        ("/usr/share/doc/rtprof/docs/limits.md.gz", "-rw-r--r--"),
    ] {
        let (m, _) = files
            .get(path)
            .unwrap_or_else(|| panic!("{path} missing from the package:\n{listing}"));
        assert_eq!(m, mode, "{path}");
    }
    assert!(
        files.values().all(|(_, owner)| owner == "root/root"),
        "everything owned by root:\n{listing}"
    );

    let field = |f: &str| {
        dpkg_deb(&["-f"], &deb)
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{f}: ")).map(str::to_string))
    };
    assert_eq!(field("Package").as_deref(), Some("rtprof"));
    assert_eq!(field("Version").as_deref(), Some(env!("CARGO_PKG_VERSION")));
    assert!(field("Depends").unwrap().starts_with("libc6 (>= 2."));

    let ctrl = dir.join("control");
    ok(
        Command::new("dpkg-deb")
            .arg("-e")
            .arg(&deb)
            .arg(&ctrl)
            .output()
            .unwrap(),
        "dpkg-deb -e",
    );
    assert_eq!(
        std::fs::read_to_string(ctrl.join("conffiles")).unwrap(),
        "/etc/rtprof/rtprof.conf\n"
    );
    for script in ["postinst", "prerm", "postrm"] {
        let o = Command::new("sh")
            .arg("-n")
            .arg(ctrl.join(script))
            .output()
            .unwrap();
        ok(o, script);
    }

    let tree = dir.join("tree");
    ok(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(&tree)
            .output()
            .unwrap(),
        "dpkg-deb -x",
    );
    let unit = std::fs::read_to_string(tree.join("lib/systemd/system/rtprofd.service")).unwrap();
    let body: String = unit
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        body,
        expected_unit(),
        "the packaged unit is the repository's"
    );
    let copyright = std::fs::read_to_string(tree.join("usr/share/doc/rtprof/copyright")).unwrap();
    assert!(copyright.contains("inferno") && copyright.contains("CDDL-1.0"));

    // The packaged (stripped) tools work where the package puts them:
    // rtprof finds the agent in ../lib/rtprof.
    let bin = compile_o2("calls.c", &[], &dir);
    let json = dir.join("report.json");
    let o = Command::new(tree.join("usr/bin/rtprof"))
        .arg("run")
        .arg("--json")
        .arg(&json)
        .arg("--")
        .arg(&bin)
        .env_remove("RTPROF_AGENT")
        .output()
        .unwrap();
    // (The program's exit status is a checksum, not a verdict.)
    let printed = String::from_utf8_lossy(&o.stdout).into_owned();
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&json)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr))),
    )
    .unwrap();
    let p = process(&report, &bin);
    for (name, n) in expectations(printed.as_bytes()).counts {
        assert_eq!(
            function_named(p, &name)["calls"].as_u64(),
            Some(n),
            "{name}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// dpkg installs the package on a private copy of the machine (/etc, /usr
/// and /var) where systemd seems to run (/run/systemd/system exists;
/// systemctl is a stand-in that logs its arguments); `rtprof system
/// enable` switches on the agent the package put in place and enables the
/// packaged unit, and removing the package switches both off before the
/// agent's file goes: /etc/ld.so.preload is as before.
#[test]
fn removing_the_package_switches_the_machine_off() {
    private_machine(&["/usr", "/var"]);
    let dir = scratch("package-install");
    let deb = build(&dir);
    let preload = Path::new("/etc/ld.so.preload");
    std::fs::write(preload, "# nothing preloaded yet\n").unwrap();
    std::fs::create_dir_all("/run/systemd/system").unwrap();
    let fake = dir.join("bin");
    std::fs::create_dir(&fake).unwrap();
    let log = dir.join("systemctl.log");
    std::fs::write(
        fake.join("systemctl"),
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", log.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        fake.join("systemctl"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", fake.display());
    let run = |program: &str, args: &[&str]| {
        let o = Command::new(program)
            .args(args)
            .env("PATH", &path)
            .env_remove("RTPROF_AGENT")
            .output()
            .unwrap();
        ok(o, &format!("{program} {args:?}"))
    };
    let logged = || {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        t
    };

    run("dpkg", &["-i", deb.to_str().unwrap()]);
    assert!(Path::new("/etc/rtprof/rtprof.conf").exists());
    assert_eq!(
        logged(),
        "daemon-reload\ntry-restart rtprofd.service\n",
        "installing starts nothing new"
    );
    let said = run("/usr/bin/rtprof", &["system", "enable", "--no-warm"]);
    assert!(
        said.contains("agent: /usr/lib/rtprof/librtprof.so (already installed"),
        "the packaged agent is used in place: {said}"
    );
    assert!(
        said.contains("rtprofd: started and enabled (/lib/systemd/system/rtprofd.service)"),
        "{said}"
    );
    assert_eq!(logged(), "enable --now rtprofd.service\n");
    assert_eq!(
        std::fs::read(preload).unwrap(),
        b"# nothing preloaded yet\n/usr/lib/rtprof/librtprof.so\n"
    );
    let maps = run("/bin/cat", &["/proc/self/maps"]);
    assert!(maps.contains("/usr/lib/rtprof/librtprof.so"));

    let removed = run("dpkg", &["-r", "rtprof"]);
    assert_eq!(
        std::fs::read(preload).unwrap(),
        b"# nothing preloaded yet\n",
        "{removed}"
    );
    assert!(logged().starts_with("disable --now rtprofd.service\n"));
    assert!(!Path::new("/usr/lib/rtprof/librtprof.so").exists());
    assert!(
        Path::new("/etc/rtprof/rtprof.conf").exists(),
        "a conffile stays until purge"
    );
    run("dpkg", &["-P", "rtprof"]);
    assert!(!Path::new("/etc/rtprof").exists());
}
