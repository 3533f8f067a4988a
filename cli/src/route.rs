//! `rtprof route`: asks rtprofd to send the calls of a running process's
//! function to an implementation the program offered (or back to its own
//! code), and prints the outcome once the process's agent has answered.

use rtprof_abi::protocol;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct RouteArgs {
    /// The process (rtprofd must follow it).
    pid: u32,
    /// The function, by its symbol name.
    function: String,
    /// The implementation the program offered for it, or `original`.
    implementation: String,
    /// rtprofd's socket (default: $RTPROF_DAEMON_SOCKET, else
    /// /run/rtprof/rtprofd.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
}

pub fn run(a: RouteArgs) -> ExitCode {
    let socket = a.socket.unwrap_or_else(protocol::default_socket);
    match protocol::route(&socket, a.pid, &a.function, &a.implementation) {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("rtprof route: {why}");
            ExitCode::FAILURE
        }
    }
}
