//! Settings shared by the shim and the CLI: environment variable names, capture budgets and
//! the policy, parsed once.
//!
//! What this module cannot do: notice a variable changed after the shim read it. The shim reads
//! the environment once per process image (in its constructor), because programs like `env -i`
//! clear the environment before the calls we need to journal.

use std::fmt;

/// Names the session directory; set by `aether-journal run`, or exported by the first hooked
/// process when it creates a session itself.
pub const ENV_DIR: &str = "AETHER_JOURNAL_DIR";
/// `off` disables the shim entirely.
pub const ENV_SWITCH: &str = "AETHER_JOURNAL";
/// The id of the session [`ENV_DIR`] names, set beside it by whoever made the session: a
/// process that finds no session there, or another one, knows the store vanished.
pub const ENV_SESSION_ID: &str = "AETHER_JOURNAL_SESSION_ID";
/// Set (to `1`) with `AETHER_JOURNAL=off` by `aether-journal` when it re-executes itself
/// without the shim inside a session: that exec is a nested session (or tool), not a program
/// whose caller switched journaling off.
pub const ENV_NESTED: &str = "AETHER_JOURNAL_NESTED";
/// Per-file capture budget (bytes, with optional K/M/G/T suffix). Default 1G.
pub const ENV_MAX_FILE: &str = "AETHER_JOURNAL_MAX_FILE";
/// Per-session capture budget. Default 16G.
pub const ENV_MAX_TOTAL: &str = "AETHER_JOURNAL_MAX_TOTAL";
/// `record` (default) or `strict`.
pub const ENV_POLICY: &str = "AETHER_JOURNAL_POLICY";
/// `1` makes every record and blob durable before the call proceeds.
pub const ENV_SYNC: &str = "AETHER_JOURNAL_SYNC";
/// `deny`: under the strict policy, refuse every network connect, loopback included.
pub const ENV_NETWORK: &str = "AETHER_JOURNAL_NETWORK";
/// Path of the shim library, for `aether-journal run`.
pub const ENV_SHIM: &str = "AETHER_JOURNAL_SHIM";
/// Test suite only: the shim panics inside its own work for a path ending with this value.
pub const ENV_TEST_FAULT: &str = "AETHER_JOURNAL_TEST_FAULT";
/// The supervisor's marker for the session (16 hex digits), set by `run` when a supervisor
/// watches the session: the shim makes the system calls it has journaled carrying it, and the
/// supervisor's filter lets those through without a round trip.
pub const ENV_MARK: &str = "AETHER_JOURNAL_MARK";

/// Default per-file budget: 1 GiB.
pub const DEFAULT_MAX_FILE: u64 = 1 << 30;
/// Default per-session budget: 16 GiB.
pub const DEFAULT_MAX_TOTAL: u64 = 16 << 30;

/// A size that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSize(pub String);

impl fmt::Display for BadSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid size {:?}: expected a number of bytes with an optional K, M, G or T suffix", self.0)
    }
}

impl std::error::Error for BadSize {}

/// Parses `123`, `64K`, `1M`, `1G`, `2T` (binary multiples; an optional trailing `B` or `iB`).
pub fn parse_size(text: &str) -> Result<u64, BadSize> {
    let t = text.trim();
    let bad = || BadSize(text.to_string());
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(bad());
    }
    let n: u64 = t[..digits].parse().map_err(|_| bad())?;
    let unit = t[digits..].trim().to_ascii_uppercase();
    let unit = unit.strip_suffix("IB").or_else(|| unit.strip_suffix('B')).unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// What to do with a call whose effect cannot be journaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Let it run and journal an irreversible record saying why (the default).
    Record,
    /// Refuse it: the call fails with EACCES (EPERM for exec) and the refusal is journaled.
    Strict,
}

/// Capture limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Largest single file whose prior contents are kept.
    pub max_file: u64,
    /// Most bytes one session keeps in all.
    pub max_total: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { max_file: DEFAULT_MAX_FILE, max_total: DEFAULT_MAX_TOTAL }
    }
}

/// Settings read from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Capture limits.
    pub budget: Budget,
    /// Policy for calls that cannot be journaled.
    pub policy: Policy,
    /// Whether to fsync before each call proceeds.
    pub sync: bool,
    /// Under the strict policy, refuse loopback connects too.
    pub network_deny: bool,
}

impl Settings {
    /// Reads settings through `get` (the environment, or a test map). Unparseable values fall
    /// back to the defaults and are reported in the returned warnings, never silently.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Settings, Vec<String>) {
        let mut warnings = Vec::new();
        let mut size = |name: &str, default: u64| match get(name) {
            None => default,
            Some(v) => parse_size(&v).unwrap_or_else(|e| {
                warnings.push(format!("{name}: {e}; using the default of {default} bytes"));
                default
            }),
        };
        let budget = Budget {
            max_file: size(ENV_MAX_FILE, DEFAULT_MAX_FILE),
            max_total: size(ENV_MAX_TOTAL, DEFAULT_MAX_TOTAL),
        };
        let policy = match get(ENV_POLICY).as_deref() {
            Some("strict") => Policy::Strict,
            Some("record") | Some("") | None => Policy::Record,
            Some(other) => {
                warnings.push(format!("{ENV_POLICY}: unknown policy {other:?}; using \"record\""));
                Policy::Record
            }
        };
        let sync = matches!(get(ENV_SYNC).as_deref(), Some("1") | Some("true") | Some("yes"));
        let network_deny = match get(ENV_NETWORK).as_deref() {
            Some("deny") => true,
            Some("allow-loopback") | Some("") | None => false,
            Some(other) => {
                warnings.push(format!("{ENV_NETWORK}: unknown value {other:?}; expected \"deny\""));
                false
            }
        };
        (Settings { budget, policy, sync, network_deny }, warnings)
    }

    /// Reads settings from the process environment.
    pub fn from_env() -> (Settings, Vec<String>) {
        Self::from_lookup(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_binary_suffixes() {
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
    }

    #[test]
    fn a_bad_size_is_an_error_not_a_zero() {
        for bad in ["", "G", "1X", "-5", "99999999999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bad_budget_falls_back_to_the_default_with_a_warning() {
        let (s, w) = Settings::from_lookup(|k| (k == ENV_MAX_FILE).then(|| "lots".to_string()));
        assert_eq!(s.budget.max_file, DEFAULT_MAX_FILE);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains(ENV_MAX_FILE));
    }

    #[test]
    fn strict_policy_and_sync_are_read() {
        let (s, w) = Settings::from_lookup(|k| match k {
            ENV_POLICY => Some("strict".into()),
            ENV_SYNC => Some("1".into()),
            _ => None,
        });
        assert!(w.is_empty());
        assert_eq!(s.policy, Policy::Strict);
        assert!(s.sync);
    }
}
