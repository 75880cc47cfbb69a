//! The exit statuses of `aether-journal`, for harnesses and scripts that act on them. A
//! command passed through `run` exits with its own status instead (128 + N when killed by
//! signal N), or 126 / 127 when it could not be started.
//!
//! What this module cannot do: tell two failures of the same code apart; the JSON report
//! (`undo --json`) says which step failed and why.

/// Success: for `undo`, every selected step was undone exactly (or a dry run says it would be).
pub const SUCCESS: u8 = 0;
/// An error: the session could not be read or written, an argument names nothing usable, a
/// write to standard output failed (except a closed pipe, which counts as success).
pub const ERROR: u8 = 1;
/// A usage error: unknown option, missing argument.
pub const USAGE: u8 = 2;
/// An undo (or dry run) that could not undo everything exactly, conflicts included; also a
/// `gc` or `sessions` that met a session it could not handle.
pub const INCOMPLETE: u8 = 3;
/// A selective undo (`--last`, `--pid`, `PATH`) whose selection matched no record of the
/// session: nothing was changed.
pub const NOTHING_SELECTED: u8 = 4;

/// Every code with its meaning, as `--help` and the man page print them.
pub const ALL: [(u8, &str); 5] = [
    (SUCCESS, "success (for undo: every selected step was undone exactly)"),
    (ERROR, "an error (including a failed write to standard output; a closed pipe is not one)"),
    (USAGE, "a usage error"),
    (
        INCOMPLETE,
        "an undo or dry run that could not undo everything exactly; a gc or sessions that met a session it could not handle",
    ),
    (NOTHING_SELECTED, "a selective undo whose selection matched no record: nothing was changed"),
];

/// [`ALL`] as a block of text for `--help`.
pub fn help_text() -> String {
    let mut s = String::from("Exit status:\n");
    for (code, what) in ALL {
        s.push_str(&format!("  {code}  {what}\n"));
    }
    s.push_str(
        "  run passes its command's status through (128+N when killed by signal N; 126, 127 when it could not start).",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_code_is_distinct_and_listed_in_the_help() {
        let mut codes: Vec<u8> = ALL.iter().map(|(c, _)| *c).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ALL.len());
        for (code, what) in ALL {
            assert!(help_text().contains(&format!("  {code}  {what}")));
        }
    }
}
