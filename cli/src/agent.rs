//! Finding the agent, librtprof.so, that `rtprof run` and `rtprof cache
//! warm` preload.

use crate::error::Error;
use std::path::PathBuf;

/// Where librtprof.so is: `--agent`, `$RTPROF_AGENT`, or installed next to
/// this binary (`./`, `../lib/`, `../lib/rtprof/`).
pub fn find(explicit: Option<PathBuf>) -> Result<PathBuf, Error> {
    let candidates: Vec<PathBuf> =
        if let Some(p) = explicit.or_else(|| std::env::var_os("RTPROF_AGENT").map(PathBuf::from)) {
            vec![p]
        } else {
            let exe = std::env::current_exe().map_err(Error::NoSelf)?;
            let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
            vec![
                dir.join("librtprof.so"),
                dir.join("../lib/librtprof.so"),
                dir.join("../lib/rtprof/librtprof.so"),
            ]
        };
    for c in &candidates {
        if c.is_file() {
            let abs = c.canonicalize().map_err(|source| Error::AgentPath {
                path: c.clone(),
                source,
            })?;
            // LD_PRELOAD splits on spaces and colons.
            if abs.to_string_lossy().contains([' ', ':']) {
                return Err(Error::AgentPathUnpreloadable(abs));
            }
            return Ok(abs);
        }
    }
    Err(Error::NoAgent {
        looked_at: candidates,
    })
}
