//! The CLI's errors: the library's own, kept whole (with their paths and causes), and the
//! CLI's. Each has a stable `code`, which `--json` commands print with the message on stdout
//! (`{"error": {"code", "message"}}`) so that a harness need not parse English.
//!
//! What this module cannot do: type the messages of the command line itself (clap reports
//! those, exit status 2).

use aether_journal::session::SessionError;
use aether_journal_recorder::marks::MarkError;

/// An error that ends a command (exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The library could not open, read or change a session.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A mark could not be written.
    #[error(transparent)]
    Mark(#[from] MarkError),
    /// Anything else the CLI found wrong (its message says what).
    #[error("{0}")]
    Other(String),
}

impl From<String> for CliError {
    fn from(s: String) -> CliError {
        CliError::Other(s)
    }
}

impl From<&str> for CliError {
    fn from(s: &str) -> CliError {
        CliError::Other(s.to_string())
    }
}

impl CliError {
    /// A stable code for programs.
    pub fn code(&self) -> &'static str {
        match self {
            CliError::Session(e) => match e {
                SessionError::NotFound(_) => "session_not_found",
                SessionError::NotASession(_) => "not_a_session",
                SessionError::BadHeader { .. } => "bad_header",
                SessionError::UnknownVersion { .. } => "unknown_version",
                SessionError::NoSessions(_) => "no_sessions",
                SessionError::NotTrusted { .. } => "not_trusted",
                SessionError::NoSessionHere { .. } => "no_session_here",
                SessionError::Ambiguous { .. } => "ambiguous_session",
                SessionError::NoSuchMark { .. } => "no_such_mark",
                SessionError::Io { .. } => "io",
            },
            CliError::Mark(e) => match e {
                MarkError::Session(_) => "session",
                MarkError::BadName(_) => "bad_mark_name",
                MarkError::NameTaken { .. } => "mark_name_taken",
                MarkError::Inside { .. } => "inside_the_session",
                MarkError::Io { .. } => "io",
            },
            CliError::Other(_) => "error",
        }
    }

    /// The JSON form: `{"error": {"code", "message"}}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code(), "message": self.to_string()}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_s_errors_keep_their_kind_and_their_words() {
        let e = CliError::from(SessionError::NoSuchMark { name: "x".into(), known: vec!["turn-1".into()] });
        assert_eq!(e.code(), "no_such_mark");
        assert_eq!(e.to_json()["error"]["message"], "the session has no mark \"x\" (its marks: turn-1)");
        assert_eq!(CliError::from("plain").code(), "error");
    }
}
