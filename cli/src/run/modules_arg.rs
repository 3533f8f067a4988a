//! `--modules`, checked before the program runs.

use rtprof_shared::report::escape_text;

/// Checks `--modules` as the agent reads `RTPROF_MODULES`
/// (agent/src/config.rs): comma-separated globs matched against a module's
/// file name, with `*` and `?` the only wildcards; `all` (or `*`) for every
/// module, `main` for the executable.
pub fn check(spec: &str) -> Result<(), String> {
    let globs: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .collect();
    if globs.is_empty() {
        return Err("no glob given (e.g. 'libpython*', or 'all')".into());
    }
    for g in globs {
        let shown = escape_text(g);
        if g.contains('/') {
            let name = g.rsplit('/').next().unwrap_or("");
            return Err(format!(
                "'{shown}': globs match a module's file name, not its path (try '{}')",
                escape_text(name)
            ));
        }
        if let Some(c) = g
            .chars()
            .find(|c| matches!(c, '[' | ']' | '{' | '}' | '\\'))
        {
            return Err(format!(
                "'{shown}': only * and ? are wildcards, '{c}' would be matched as it is"
            ));
        }
        if g.contains(char::is_whitespace) {
            return Err(format!("'{shown}': separate globs with commas, not spaces"));
        }
        if g.contains(char::is_control) {
            return Err(format!("'{shown}': contains a control character"));
        }
    }
    Ok(())
}
