//! Finding the agent, librtprof.so, that `rtprof run` and `rtprof cache
//! warm` preload.

use std::path::PathBuf;

/// Where librtprof.so is: `--agent`, `$RTPROF_AGENT`, or installed next to
/// this binary (`./`, `../lib/`, `../lib/rtprof/`).
pub fn find(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> =
        if let Some(p) = explicit.or_else(|| std::env::var_os("RTPROF_AGENT").map(PathBuf::from)) {
            vec![p]
        } else {
            let exe =
                std::env::current_exe().map_err(|e| format!("cannot locate rtprof itself: {e}"))?;
            let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
            vec![
                dir.join("librtprof.so"),
                dir.join("../lib/librtprof.so"),
                dir.join("../lib/rtprof/librtprof.so"),
            ]
        };
    for c in &candidates {
        if c.is_file() {
            let abs = c
                .canonicalize()
                .map_err(|e| format!("{}: {e}", c.display()))?;
            let s = abs.to_string_lossy();
            // LD_PRELOAD splits on spaces and colons.
            if s.contains([' ', ':']) {
                return Err(format!(
                    "{s}: agent path contains a space or colon, which LD_PRELOAD cannot carry"
                ));
            }
            return Ok(abs);
        }
    }
    Err(format!(
        "cannot find librtprof.so (looked at {}); set RTPROF_AGENT or pass --agent",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
