//! Where the agent's plan cache lives, for the agent and `rtprof cache`.

use std::path::{Path, PathBuf};

/// The machine-wide cache: written by root only, readable by all.
pub const SYSTEM_DIR: &str = "/var/cache/rtprof";
/// Entries end with this; temporary files start with a dot.
pub const ENTRY_SUFFIX: &str = ".rtc";

/// The user's cache directory: `$XDG_CACHE_HOME/rtprof`, else
/// `$HOME/.cache/rtprof` (relative values are ignored, as XDG says).
pub fn user_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| Path::new(v).is_absolute())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| Path::new(v).is_absolute())
                .map(|h| Path::new(&h).join(".cache"))
        })?;
    Some(base.join("rtprof"))
}
