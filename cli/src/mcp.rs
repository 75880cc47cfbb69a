//! `aether-journal mcp`: a stdio MCP server for harnesses without hooks, with four tools:
//! `mark` (name this point of the session), `status` (the session, its marks and coverage),
//! `review` (the net effect since a mark, as `review --json`) and `rewind` (undo to a mark: a
//! dry run unless `dry_run` is false, as `undo --to --json`).
//!
//! The session is the one the server runs in (`AETHER_JOURNAL_DIR`), the one a tool call
//! names (`journal`), or the newest started in the server's directory or above.
//!
//! What this module cannot do: rewind a session from inside it. A server that runs in the
//! session it would rewind (a harness under `aether-journal run` that started it) cannot write
//! the store, like every process of the session; `rewind` then says so, and the user rewinds
//! from outside.

use std::path::PathBuf;

use aether_journal::select::Selection;
use aether_journal::session::Session;
use aether_journal::undo::{UndoOptions, undo_session};
use aether_journal_recorder::marks::{MarkRequest, mark};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};

/// Arguments of `mark`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct MarkArgs {
    /// The mark's name (default: the next turn-N).
    pub name: Option<String>,
    /// Free text shown beside it.
    pub label: Option<String>,
    /// The session directory (default: this server's session).
    pub journal: Option<String>,
}

/// Arguments of `status`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct StatusArgs {
    /// The session directory (default: this server's session).
    pub journal: Option<String>,
}

/// Arguments of `review`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct ReviewArgs {
    /// Only what was done after this mark (default: the whole session).
    pub since: Option<String>,
    /// Only what was done up to this mark.
    pub until: Option<String>,
    /// The session directory (default: this server's session).
    pub journal: Option<String>,
}

/// Arguments of `rewind`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct RewindArgs {
    /// The mark to rewind to: everything after it is undone.
    pub to: String,
    /// Only say what would be done (the default); false to rewind.
    pub dry_run: Option<bool>,
    /// The session directory (default: this server's session).
    pub journal: Option<String>,
}

/// The server.
#[derive(Debug, Clone)]
pub struct Server {
    tool_router: ToolRouter<Self>,
}

fn session_of(journal: Option<String>) -> Result<Session, String> {
    let dir =
        journal.map(PathBuf::from).or_else(|| std::env::var_os(aether_journal::config::ENV_DIR).map(PathBuf::from));
    crate::open_session(dir).map_err(|e| e.to_string())
}

#[tool_router]
impl Server {
    fn new() -> Server {
        Server { tool_router: Self::tool_router() }
    }

    #[tool(
        description = "Name this point of the session (the start of a turn), so that it can be reviewed from or rewound to later. Returns the mark as JSON."
    )]
    fn mark(&self, Parameters(a): Parameters<MarkArgs>) -> Result<String, String> {
        let s = session_of(a.journal)?;
        let m = mark(&s, &MarkRequest { name: a.name, label: a.label, key: None }).map_err(|e| e.to_string())?;
        let m = m.mark();
        Ok(serde_json::json!({"name": m.name, "seq": m.seq, "label": m.label}).to_string())
    }

    #[tool(
        description = "The session: its id, state, records, irreversible steps, marks, and what its journaling could see (coverage). JSON."
    )]
    fn status(&self, Parameters(a): Parameters<StatusArgs>) -> Result<String, String> {
        let s = session_of(a.journal)?;
        let mut v = serde_json::to_value(s.info()).map_err(|e| e.to_string())?;
        v["coverage"] = serde_json::to_value(s.coverage()).map_err(|e| e.to_string())?;
        Ok(v.to_string())
    }

    #[tool(
        description = "What the session did since a mark (or in all): modified files with diffs, created, deleted, renamed, metadata, network, processes, irreversible steps. JSON."
    )]
    fn review(&self, Parameters(a): Parameters<ReviewArgs>) -> Result<String, String> {
        let s = session_of(a.journal)?;
        let seq = |m: &Option<String>| -> Result<Option<u64>, String> {
            m.as_deref().map(|m| s.mark_named(m).map(|m| m.seq).map_err(|e| e.to_string())).transpose()
        };
        let span = aether_journal::review::Span { after: seq(&a.since)?.unwrap_or(0), until: seq(&a.until)? };
        // As undo reads them: what it would not act on is shown as damaged, not as a change.
        let (j, _) = s.read_checked().map_err(|e| e.to_string())?;
        let rv = aether_journal::review::review_span(&j, &s.blobs_dir(), &[], span, || {});
        Ok(crate::output::review_json(&s, &rv))
    }

    #[tool(
        description = "Rewind the files to a mark: undo everything after it, with every step reported and anything changed since (the user's own edits) left alone. A dry run unless dry_run is false. JSON report; complete is false when anything was not put back exactly."
    )]
    fn rewind(&self, Parameters(a): Parameters<RewindArgs>) -> Result<String, String> {
        let s = session_of(a.journal)?;
        let m = s.mark_named(&a.to).map_err(|e| e.to_string())?;
        let opts = UndoOptions {
            dry_run: a.dry_run.unwrap_or(true),
            select: Some(Selection::After(m.seq)),
            ..Default::default()
        };
        let report = undo_session(&s, &opts).map_err(|e| e.to_string())?;
        Ok(report.to_json().to_string())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("aether-journal", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Mark each turn (mark), look at what changed since one (review), and rewind the files to one (rewind, a dry run unless dry_run is false). Every path a rewind cannot put back exactly is named in its report.",
            )
    }
}

/// Serves MCP on stdin and stdout until the client goes away.
pub fn serve() -> Result<u8, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let service = Server::new().serve(rmcp::transport::stdio()).await.map_err(|e| e.to_string())?;
        service.waiting().await.map_err(|e| e.to_string())?;
        Ok(0)
    })
}
