//! `--modules`, checked before the program runs.

use crate::error::Error;

/// Checks `--modules` as the agent reads `RTPROF_MODULES`
/// (agent/src/config.rs): comma-separated globs matched against a module's
/// file name, with `*` and `?` the only wildcards; `all` (or `*`) for every
/// module, `main` for the executable.
pub fn check(spec: &str) -> Result<(), Error> {
    let globs: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .collect();
    if globs.is_empty() {
        return Err(Error::NoGlob);
    }
    for g in globs {
        let glob = g.to_string();
        if g.contains('/') {
            return Err(Error::GlobIsPath { glob });
        }
        if let Some(wildcard) = g
            .chars()
            .find(|c| matches!(c, '[' | ']' | '{' | '}' | '\\'))
        {
            return Err(Error::GlobWildcard { glob, wildcard });
        }
        if g.contains(char::is_whitespace) {
            return Err(Error::GlobSpaces { glob });
        }
        if g.contains(char::is_control) {
            return Err(Error::GlobControl { glob });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mistake_is_named_with_its_glob() {
        assert!(check("main, libpython*,lib?.so").is_ok());
        assert!(matches!(check(" , "), Err(Error::NoGlob)));
        assert!(
            matches!(check("main,/usr/lib/libz*"), Err(Error::GlobIsPath { glob }) if glob == "/usr/lib/libz*")
        );
        assert!(matches!(
            check("lib[ab].so"),
            Err(Error::GlobWildcard { wildcard: '[', .. })
        ));
        assert!(matches!(check("libc libm"), Err(Error::GlobSpaces { .. })));
        assert!(matches!(check("lib\u{7}"), Err(Error::GlobControl { .. })));
    }
}
