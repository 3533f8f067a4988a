//! `rtprof switch`: asks rtprofd to switch counting of a running process's
//! functions on or off; rtprofd relays it to the process's agent.

use crate::error::Error;
use rtprof_abi::protocol;
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
fn ask(a: &SwitchArgs) -> Result<String, Error> {
    let msg =
        protocol::switch_request(a.pid, a.state == "on", &a.pattern).ok_or(Error::BadPattern)?;
    let socket = a.socket.clone().unwrap_or_else(|| {
        std::env::var_os("RTPROF_DAEMON_SOCKET")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(protocol::DEFAULT_SOCKET), PathBuf::from)
    });
    let mut s = match UnixStream::connect(&socket) {
        Ok(s) => s,
        Err(source) => return Err(Error::Unreachable { socket, source }),
    };
    let timeout = Some(Duration::from_secs(5));
    s.set_read_timeout(timeout).map_err(Error::SocketTimeout)?;
    s.set_write_timeout(timeout).map_err(Error::SocketTimeout)?;
    s.write_all(&msg).map_err(Error::Send)?;
    let mut answer = String::new();
    s.take(4096)
        .read_to_string(&mut answer)
        .map_err(Error::NoAnswer)?;
    let line = answer.lines().next().unwrap_or("").to_string();
    if line.is_empty() {
        return Err(Error::EmptyAnswer);
    }
    Ok(line)
}
