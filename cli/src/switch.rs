//! `rtprof switch`: asks rtprofd to switch counting of a running process's
//! functions on or off; rtprofd relays it to the process's agent.

use rtprof_shared::protocol;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct SwitchArgs {
    /// The process (rtprofd must follow it).
    pid: u32,
    /// Name glob of the functions, e.g. 'lua_*' or 'luaV_execute'.
    pattern: String,
    /// Count them (`on`) or not (`off`).
    #[arg(value_parser = ["on", "off"])]
    state: String,
    /// rtprofd's socket (default: $RTPROF_DAEMON_SOCKET, else
    /// /run/rtprof/rtprofd.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
}

pub fn run(a: SwitchArgs) -> ExitCode {
    match ask(&a) {
        Ok(line) if line.starts_with("ok: ") => {
            println!("{}", &line[4..]);
            ExitCode::SUCCESS
        }
        Ok(line) => {
            eprintln!(
                "rtprof switch: {}",
                line.strip_prefix("error: ").unwrap_or(&line)
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("rtprof switch: {e}");
            ExitCode::from(2)
        }
    }
}

/// Sends the request and reads rtprofd's one-line answer.
fn ask(a: &SwitchArgs) -> Result<String, String> {
    let msg = protocol::switch_request(a.pid, a.state == "on", &a.pattern).ok_or_else(|| {
        format!(
            "the pattern must be 1 to {} bytes without NUL",
            protocol::MAX_PATTERN
        )
    })?;
    let socket = a.socket.clone().unwrap_or_else(|| {
        std::env::var_os("RTPROF_DAEMON_SOCKET")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(protocol::DEFAULT_SOCKET), PathBuf::from)
    });
    let mut s = UnixStream::connect(&socket)
        .map_err(|e| format!("cannot reach rtprofd at {}: {e}", socket.display()))?;
    let timeout = Some(Duration::from_secs(5));
    s.set_read_timeout(timeout).map_err(|e| e.to_string())?;
    s.set_write_timeout(timeout).map_err(|e| e.to_string())?;
    s.write_all(&msg).map_err(|e| format!("cannot send: {e}"))?;
    let mut answer = String::new();
    s.take(4096)
        .read_to_string(&mut answer)
        .map_err(|e| format!("no answer from rtprofd: {e}"))?;
    let line = answer.lines().next().unwrap_or("").to_string();
    if line.is_empty() {
        return Err("rtprofd closed the connection without an answer (an older rtprofd?)".into());
    }
    Ok(line)
}
