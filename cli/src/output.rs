//! Rendering journals and reports for people (and JSON for programs).
//!
//! Names are escaped for the terminal (control characters, bidi overrides and other invisible
//! characters become `\u{...}` escapes) because an agent chooses them; `--json` keeps them exact.

use std::fmt::Write as _;
use std::io::Write as _;

use aether_journal::BPath;
use aether_journal::journal::JournalContents;
use aether_journal::record::{Before, CaptureHow, ConnectResult, MetaBefore, MetaKind, Node, Op, Record, XattrBefore};
use aether_journal::review::{ProcessRun, Review};
use aether_journal::session::{Collected, Session, SessionInfo};
use aether_journal::undo::{JsonStream, Report, StepReport};

/// Writes `text` to stdout.
///
/// A reader that closed the pipe (`| head`) has all it wanted: that ends the program with
/// success. Any other failure to write ends it with [`aether_journal::exit_codes::ERROR`]: a
/// report cut short must not pass for a whole one.
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    written(out.write_all(text.as_bytes()).and_then(|_| out.flush()));
}

/// Whether `c` must not reach a terminal as it is: controls (C0, DEL, C1: escape sequences,
/// OSC 52 clipboard writes, OSC 8 links), the invisible and direction-changing format
/// characters (soft hyphen, zero-width and bidi marks and overrides, word joiners and
/// invisible operators, the BOM, interlinear annotations), and the tag block (U+E0000 to
/// U+E007F, invisible text that can smuggle instructions to a language model). The set fd
/// escapes, and the tags.
fn must_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0000}'..='\u{E007F}'
        )
}

/// Escapes text an agent may have chosen for a terminal (a `why` that embeds names, a line of
/// a diff: contents, like names, are the agent's).
pub fn escape_text(s: &str) -> String {
    escape(&BPath::from(s))
}

/// Escapes a name for display in a terminal.
pub fn escape(p: &(impl AsRef<[u8]> + ?Sized)) -> String {
    let mut out = String::new();
    for chunk in p.as_ref().utf8_chunks() {
        for c in chunk.valid().chars() {
            let invisible = must_escape(c);
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\\' => out.push_str("\\\\"),
                c if invisible => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

fn prog_name(r: &Record) -> String {
    let p = r.prog().as_bytes();
    let base = p.rsplit(|&c| c == b'/').next().unwrap_or(p);
    escape(&BPath::new(base.to_vec()))
}

fn describe_before(b: &Before) -> String {
    match b {
        Before::Absent => "did not exist".into(),
        Before::Exclusive => "did not exist (an exclusive create: the call fails if anything is there)".into(),
        Before::Irreversible { reason } => format!("IRREVERSIBLE: {}", escape_text(&reason.to_string())),
        Before::Born { created } => {
            format!("a file this session created (#{created}); not kept, undoing that removes it")
        }
        Before::Kept { by } => format!("its state before the session is kept by #{by}; not kept again"),
        Before::Contents(s) => match &s.node {
            Node::File { size, how, twin, .. } => format!(
                "{size}-byte file, mode {:o}, kept by {}",
                s.mode,
                match (how, twin) {
                    (CaptureHow::Link, Some(_)) => "moving it aside",
                    (CaptureHow::Link, None) => "link",
                    (CaptureHow::Copy, _) => "copy",
                    (CaptureHow::Reflink, _) => "clone",
                }
            ),
            Node::Packed { size, .. } => format!("{size}-byte file, mode {:o}, kept by copy (packed)", s.mode),
            Node::Prefix { len } => format!("{len}-byte file about to be appended to (length kept)"),
            Node::Symlink { target } => format!("symlink to {}", escape(target)),
            Node::Dir => format!("directory, mode {:o}", s.mode),
            Node::Special { kind, .. } => format!("{}, mode {:o}", kind.name(), s.mode),
        },
    }
}

fn describe_meta(m: &MetaBefore) -> String {
    match m.what {
        MetaKind::Mode => format!("mode was {:o}", m.mode),
        MetaKind::Owner => format!("owner was {}:{}", m.uid, m.gid),
        MetaKind::Times => format!("mtime was {}", m.mtime[0]),
        MetaKind::Xattr => match &m.xattr {
            Some(XattrBefore { name, value: Some(v) }) => format!("xattr {} was {} bytes", escape(name), v.0.len()),
            Some(XattrBefore { name, value: None }) => format!("xattr {} was not set", escape(name)),
            None => "xattr".into(),
        },
        MetaKind::Flags => format!("attributes (lsattr) were {:#x}", m.flags.unwrap_or(0)),
    }
}

/// One line describing a record (without its process).
pub fn describe_record(r: &Record) -> String {
    match &r.op {
        Op::Change { path, before } => format!("{}  [{}]", escape(path), describe_before(before)),
        Op::Rename(m) => {
            format!("{} -> {}  [destination {}]", escape(&m.from), escape(&m.to), describe_before(&m.to_before))
        }
        Op::Meta { path, before } => format!("{}  [{}]", escape(path), describe_meta(before)),
        Op::Unobserved { program, reason } => {
            format!("UNOBSERVED {}: {}", escape(program), escape_text(&reason.to_string()))
        }
        Op::Connect { peer, result } => match result {
            ConnectResult::Failed { errno } => format!("connect to {peer} failed (errno {errno})"),
            _ => format!("IRREVERSIBLE: connected to {peer}"),
        },
        Op::Send { peer } => format!("IRREVERSIBLE: sent data to {peer}"),
        Op::Signal { target, target_prog, signal, outside } => format!(
            "{}signal {signal} to {target}{}",
            if *outside { "IRREVERSIBLE: " } else { "" },
            target_prog.as_ref().map(|p| format!(" ({})", escape(&**p))).unwrap_or_default()
        ),
        Op::Exec(e) => format!(
            "exec {}{}: {}",
            escape(&e.program),
            e.child.map(|c| format!(" as pid {c}")).unwrap_or_default(),
            e.argv.iter().map(escape).collect::<Vec<_>>().join(" ")
        ),
        Op::Refused { what, errno } => format!("REFUSED (errno {errno}): {}", escape_text(what)),
        Op::TempName { template } => format!("temporary name from {}", escape(template)),
        Op::CallFailed { of_seq, errno } => format!("call of #{of_seq} failed (errno {errno})"),
        Op::DirTimes(d) => format!("{}  [directory times kept before its entries change]", escape(&d.path)),
        Op::Mark(m) => format!(
            "MARK {}{}",
            escape_text(&m.name),
            m.label.as_ref().map(|l| format!(": {}", escape_text(l))).unwrap_or_default()
        ),
    }
}

fn session_line(s: &Session) -> String {
    let h = s.header();
    let cmd: Vec<String> = h.root_command.iter().map(escape).collect();
    format!(
        "session {} ({}), started {}: {}\ncoverage: {}",
        h.id,
        s.dir().display(),
        h.created,
        cmd.join(" "),
        s.coverage().describe()
    )
}

/// The human form of `log`.
pub fn log_text(s: &Session, j: &JournalContents) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", session_line(s));
    for r in &j.records {
        let what = describe_record(r);
        let time = r.time.to_string();
        let time = time.get(11..19).unwrap_or(&time);
        let _ = writeln!(out, "#{:<5} {time} {:>7} {:<10} {:<10} {what}", r.seq, r.pid, prog_name(r), r.call());
    }
    for p in &j.problems {
        let _ = writeln!(out, "!! {}", p.describe());
    }
    for t in j.torn_messages() {
        let _ = writeln!(out, "note: {t}");
    }
    let _ = writeln!(out, "{} record(s)", j.records.len());
    out
}

/// `log --tree`: every process the journal knows of, under its parent, with what it ran and
/// what it changed underneath it.
pub fn log_tree(s: &Session, j: &JournalContents) -> String {
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Proc<'a> {
        ppid: u32,
        first_seq: u64,
        title: Option<String>,
        lines: Vec<String>,
        _records: Vec<&'a Record>,
    }
    let mut procs: BTreeMap<u32, Proc<'_>> = BTreeMap::new();
    // Marks are points of the session, not work of the process that made them: shown between
    // the process trees, in order.
    let (marks, records): (Vec<&Record>, Vec<&Record>) = j.records.iter().partition(|r| matches!(r.op, Op::Mark(_)));
    let mut touch = |pid: u32, ppid: u32, seq: u64| {
        let p = procs.entry(pid).or_insert_with(|| Proc { ppid, first_seq: seq, ..Default::default() });
        if p.ppid == 0 {
            p.ppid = ppid;
        }
        p.first_seq = p.first_seq.min(seq);
    };
    for r in &records {
        touch(r.pid, r.ppid, r.seq);
        if let Op::Exec(e) = &r.op
            && let Some(c) = e.child
        {
            touch(c, r.pid, r.seq);
        }
    }
    for r in &records {
        match &r.op {
            Op::Exec(e) => {
                let args: Vec<String> = e.argv.iter().map(escape).collect();
                match e.child {
                    Some(c) => {
                        let p = procs.get_mut(&c).expect("inserted above");
                        p.title.get_or_insert_with(|| format!("{} ({})", args.join(" "), escape(&e.program)));
                    }
                    None => {
                        let p = procs.get_mut(&r.pid).expect("inserted above");
                        p.lines.push(format!("#{} exec {}: {}", r.seq, escape(&e.program), args.join(" ")));
                    }
                }
            }
            _ => {
                let p = procs.get_mut(&r.pid).expect("inserted above");
                p.lines.push(format!("#{} {} {}", r.seq, r.call(), describe_record(r)));
            }
        }
        let p = procs.get_mut(&r.pid).expect("inserted above");
        p.title.get_or_insert_with(|| prog_name(r));
    }
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut roots = Vec::new();
    for (&pid, p) in &procs {
        if p.ppid != pid && procs.contains_key(&p.ppid) {
            children.entry(p.ppid).or_default().push(pid);
        } else {
            roots.push(pid);
        }
    }
    let by_seq = |v: &mut Vec<u32>| v.sort_by_key(|pid| procs[pid].first_seq);
    by_seq(&mut roots);
    for v in children.values_mut() {
        by_seq(v);
    }
    let mut out = String::new();
    let _ = writeln!(out, "{}", session_line(s));
    fn walk(
        out: &mut String,
        pid: u32,
        depth: usize,
        procs: &BTreeMap<u32, Proc<'_>>,
        children: &BTreeMap<u32, Vec<u32>>,
    ) {
        let pad = "  ".repeat(depth);
        let p = &procs[&pid];
        let _ = writeln!(out, "{pad}pid {pid}: {}", p.title.as_deref().unwrap_or("?"));
        for l in &p.lines {
            let _ = writeln!(out, "{pad}    {l}");
        }
        for &c in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            if c != pid {
                walk(out, c, depth + 1, procs, children);
            }
        }
    }
    let mut marks = marks.into_iter().peekable();
    for pid in roots {
        while let Some(m) = marks.next_if(|m| m.seq < procs[&pid].first_seq) {
            let _ = writeln!(out, "-- #{} {}", m.seq, describe_record(m));
        }
        walk(&mut out, pid, 0, &procs, &children);
    }
    for m in marks {
        let _ = writeln!(out, "-- #{} {}", m.seq, describe_record(m));
    }
    out
}

/// The JSON form of `log`.
pub fn log_json(s: &Session, j: &JournalContents) -> String {
    let records: Vec<serde_json::Value> = j
        .records
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["kind"] = v["op"]["kind"].clone();
            v
        })
        .collect();
    let problems: Vec<serde_json::Value> =
        j.problems.iter().map(|p| serde_json::json!({"seq": p.seq(), "message": p.describe()})).collect();
    let doc = serde_json::json!({
        "session": s.header(),
        "dir": s.dir().to_string_lossy(),
        "state": s.state().name(),
        "records": records,
        "problems": problems,
        "torn_tail": j.torn_tail,
        "torn_in_segments": j.torn_in_segments.iter().map(|(segment, offset)| serde_json::json!({"segment": segment, "offset": offset})).collect::<Vec<_>>(),
        "torn_uncounted": j.torn_uncounted.iter().map(|(segment, count)| serde_json::json!({"segment": segment, "count": count})).collect::<Vec<_>>(),
    });
    format!("{doc}\n")
}

/// A byte count for people.
pub fn size(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, scale) in UNITS {
        if n >= scale {
            return format!("{:.1} {unit}", n as f64 / scale as f64);
        }
    }
    format!("{n} B")
}

/// Pipes text through the user's pager (`$PAGER`, or `less -FRX`), or prints it when there is
/// none.
pub fn page(text: &str) {
    use std::process::{Command, Stdio};
    let pager = std::env::var("PAGER").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "less -FRX".into());
    match Command::new("sh").arg("-c").arg(&pager).stdin(Stdio::piped()).spawn() {
        Ok(mut child) => {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(text.as_bytes());
            }
            let _ = child.wait();
        }
        Err(_) => emit(text),
    }
}

/// `sessions` as a table.
pub fn sessions_text(infos: &[SessionInfo]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32} {:<7} {:<20} {:>7} {:>10} {:>5} {:>5}  COMMAND",
        "ID", "STATE", "STARTED", "RECORDS", "CAPTURED", "IRREV", "MARKS"
    );
    for i in infos {
        let cmd: Vec<String> = i.root_command.iter().map(escape).collect();
        let _ = writeln!(
            out,
            "{:<32} {:<7} {:<20} {:>7} {:>10} {:>5} {:>5}  {}",
            i.id,
            i.phase,
            i.created,
            i.records,
            size(i.bytes_captured),
            i.irreversible,
            i.marks.len(),
            cmd.join(" ")
        );
    }
    if infos.is_empty() {
        out.push_str("(no sessions)\n");
    }
    out
}

/// `gc`'s report.
pub fn gc_text(removed: &[Collected], dry_run: bool) -> String {
    let mut out = String::new();
    let verb = if dry_run { "would remove" } else { "removed" };
    for c in removed {
        let _ =
            writeln!(out, "{verb} {} ({}, {}): {}", c.session.id, c.session.phase, size(c.session.bytes_total), c.why);
        if let Some(e) = &c.error {
            let _ = writeln!(out, "  !! it could not be removed: {}", escape_text(e));
        }
    }
    // A dry run says what would go; a removal, only what went.
    let total: u64 = removed.iter().map(|c| if dry_run { c.session.bytes_total } else { c.freed }).sum();
    let _ = writeln!(
        out,
        "{} session(s), {}{}",
        removed.len(),
        size(total),
        if dry_run { " (dry run: nothing removed)" } else { " freed" }
    );
    out
}

struct Paint {
    on: bool,
}

impl Paint {
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.on { format!("\x1b[{code}m{s}\x1b[0m") } else { s.to_string() }
    }
    fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
    fn red(&self, s: &str) -> String {
        self.wrap("31", s)
    }
    fn green(&self, s: &str) -> String {
        self.wrap("32", s)
    }
    fn cyan(&self, s: &str) -> String {
        self.wrap("36", s)
    }
    fn yellow(&self, s: &str) -> String {
        self.wrap("33", s)
    }
}

/// The human form of `review`.
pub fn review_text(s: &Session, rv: &Review, stat_only: bool, colour: bool) -> String {
    let p = Paint { on: colour };
    let mut out = String::new();
    let st = rv.stat();
    let _ = writeln!(out, "{}", p.bold(&session_line(s)));
    let _ = writeln!(
        out,
        "{} modified, {} created, {} deleted, {} renamed, {} metadata changes, {} network effects, {} processes, {} irreversible steps",
        st.modified, st.created, st.deleted, st.renamed, st.metadata, st.network, st.processes, st.irreversible
    );
    let section = |out: &mut String, title: &str, n: usize| {
        if n > 0 {
            let _ = writeln!(out, "\n{}", p.bold(&format!("{title} ({n})")));
        }
    };
    section(&mut out, "Modified", rv.modified.len());
    for m in &rv.modified {
        let _ = writeln!(out, "  {} {}", p.yellow("M"), escape(&m.path));
        if let Some(note) = &m.note {
            let _ = writeln!(out, "    ({note})");
        }
        if let Some(b) = &m.binary {
            let before = match (b.before_size, &b.before_hash) {
                (Some(sz), Some(h)) => format!("{sz} bytes, blake3 {}", &h[..16]),
                _ => "unknown".into(),
            };
            let _ = writeln!(out, "    binary: {before} -> {} bytes, blake3 {}", b.after_size, &b.after_hash[..16]);
        }
        if let (Some(diff), false) = (&m.diff, stat_only) {
            for line in diff.lines() {
                let l = escape_text(line);
                let painted = if line.starts_with("+++") || line.starts_with("---") {
                    p.bold(&l)
                } else if line.starts_with('+') {
                    p.green(&l)
                } else if line.starts_with('-') {
                    p.red(&l)
                } else if line.starts_with("@@") {
                    p.cyan(&l)
                } else {
                    l
                };
                let _ = writeln!(out, "    {painted}");
            }
        }
    }
    section(&mut out, "Created", rv.created.len());
    for c in &rv.created {
        let sz = c.size.map(|s| format!(", {s} bytes")).unwrap_or_default();
        let _ = writeln!(out, "  {} {} ({}{sz})", p.green("+"), escape(&c.path), c.kind);
    }
    section(&mut out, "Deleted", rv.deleted.len());
    for d in &rv.deleted {
        let sz = d.size.map(|s| format!(", {s} bytes")).unwrap_or_default();
        let _ = writeln!(out, "  {} {} ({}{sz})", p.red("-"), escape(&d.path), d.kind);
    }
    section(&mut out, "Renamed", rv.renamed.len());
    for r in &rv.renamed {
        let repl = if r.replaced { " (replacing what was there)" } else { "" };
        let _ = writeln!(out, "  {} {} -> {}{repl}", p.cyan("R"), escape(&r.from), escape(&r.to));
    }
    section(&mut out, "Metadata", rv.metadata.len());
    for m in &rv.metadata {
        let _ = writeln!(out, "  ~ {}: {}", escape(&m.path), m.changes.join(", "));
    }
    section(&mut out, "Network", rv.network.len());
    for n in &rv.network {
        let res = n.result.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
        let _ = writeln!(out, "  {} {}{res} by {} [pid {}]", n.kind, n.endpoint, escape(&n.prog), n.pid);
    }
    section(&mut out, "Processes", rv.processes.len());
    if !stat_only {
        out.push_str(&process_tree(&rv.processes));
    }
    section(&mut out, "Irreversible and unobserved steps", rv.irreversible.len());
    for i in &rv.irreversible {
        // Seq 0 is no record's: a damage whose record is not known (lines gone).
        let seq = if i.seq == 0 { String::new() } else { format!("#{} ", i.seq) };
        let _ = writeln!(out, "  {} {seq}{}", p.red("!"), escape_text(&i.what));
    }
    out
}

fn process_tree(procs: &[ProcessRun]) -> String {
    use std::collections::BTreeMap;
    let by_pid: BTreeMap<u32, &ProcessRun> = procs.iter().map(|p| (p.pid, p)).collect();
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut roots = Vec::new();
    for p in procs {
        if p.ppid != p.pid && by_pid.contains_key(&p.ppid) {
            children.entry(p.ppid).or_default().push(p.pid);
        } else {
            roots.push(p.pid);
        }
    }
    fn walk(
        out: &mut String,
        pid: u32,
        depth: usize,
        by_pid: &BTreeMap<u32, &ProcessRun>,
        children: &BTreeMap<u32, Vec<u32>>,
    ) {
        let p = by_pid[&pid];
        let what = match p.execs.last() {
            Some(argv) => argv.iter().map(escape).collect::<Vec<_>>().join(" "),
            None => escape(&p.prog),
        };
        let changes = if p.changes > 0 { format!("  [{} change(s)]", p.changes) } else { String::new() };
        let _ = writeln!(out, "  {}pid {pid}: {what}{changes}", "  ".repeat(depth));
        for &c in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            walk(out, c, depth + 1, by_pid, children);
        }
    }
    let mut out = String::new();
    for r in roots {
        walk(&mut out, r, 0, &by_pid, &children);
    }
    out
}

/// The JSON form of `review` (paths exact: a string, or `{"b64": ...}`).
pub fn review_json(s: &Session, rv: &Review) -> String {
    let mut v = serde_json::to_value(rv).unwrap_or_default();
    v["session"] = serde_json::to_value(s.header()).unwrap_or_default();
    v["dir"] = s.dir().to_string_lossy().into_owned().into();
    v["state"] = s.state().name().into();
    v["summary"] = serde_json::to_value(rv.stat()).unwrap_or_default();
    format!("{v}\n")
}

/// Standard output, buffered, written as a long text is made (the report of a million steps
/// as one string was a tenth of the undo's memory); failures as for [`emit`].
pub struct Stdout(std::io::BufWriter<std::io::StdoutLock<'static>>);

impl Stdout {
    /// Standard output, locked.
    pub fn new() -> Self {
        Stdout(std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock()))
    }

    /// Flushes what is buffered.
    pub fn finish(mut self) {
        let flushed = self.0.flush();
        written(flushed);
    }
}

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(buf);
        if let Err(e) = &n {
            written(Err(std::io::Error::new(e.kind(), e.to_string())));
        }
        n
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl std::fmt::Write for Stdout {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let done = std::io::Write::write_all(&mut self.0, s.as_bytes());
        written(done);
        Ok(())
    }
}

/// What [`emit`] does with the result of a write.
fn written(result: std::io::Result<()>) {
    match result {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "aether-journal: error: cannot write the output: {e}");
            std::process::exit(i32::from(aether_journal::exit_codes::ERROR));
        }
    }
}

/// Prints an undo's report while the undo runs (see
/// [`aether_journal::undo::undo_session_streaming`]): each step that ended exactly as it ends,
/// then the others, the notes and the verdict.
pub struct ReportPrinter<'a> {
    session: &'a Session,
    selective: bool,
    dry_run: bool,
    json: Option<JsonStream>,
    started: bool,
}

impl<'a> ReportPrinter<'a> {
    /// A printer of the undo of `session` (as JSON when `json`).
    pub fn new(session: &'a Session, json: bool, dry_run: bool, selective: bool) -> Self {
        ReportPrinter { session, selective, dry_run, json: json.then(JsonStream::default), started: false }
    }

    /// Prints one step.
    pub fn step(&mut self, out: &mut Stdout, o: &StepReport) {
        match &mut self.json {
            // A failure to write has ended the program already (see `Stdout`).
            Some(json) => drop(json.step(out, o)),
            None => {
                if !self.started {
                    report_header(out, self.session, self.dry_run, self.selective);
                    self.started = true;
                }
                step_line(out, o);
            }
        }
    }

    /// Prints the rest of `r`.
    pub fn finish(self, out: &mut Stdout, r: &Report) {
        match self.json {
            Some(json) => {
                let _ = json.finish(out, r);
                let _ = std::fmt::Write::write_str(out, "\n");
            }
            None if r.already_undone => {
                let id = &self.session.header().id;
                let _ = std::fmt::Write::write_fmt(
                    out,
                    format_args!("session {id} was already undone; nothing was changed.\n"),
                );
            }
            None => {
                if !self.started {
                    report_header(out, self.session, self.dry_run, self.selective);
                }
                report_rest(out, r);
            }
        }
    }
}

/// What an undo report starts with.
fn report_header(out: &mut impl std::fmt::Write, s: &Session, dry_run: bool, selective: bool) {
    let verb = match (dry_run, selective) {
        (true, true) => "Dry run of a selective undo of",
        (true, false) => "Dry run of undo for",
        (false, true) => "Selective undo of",
        (false, false) => "Undo of",
    };
    let _ = writeln!(out, "{verb} session {} ({})", s.header().id, s.dir().display());
    let _ = writeln!(out, "coverage: {}", s.coverage().describe());
    if dry_run {
        let _ = writeln!(out, "each step as the undo would report it, acting on the tree as it is now:");
    }
}

/// The steps `r` kept, its notes, summary and verdict.
fn report_rest(out: &mut impl std::fmt::Write, r: &Report) {
    steps_text(out, r);
    let m = r.summary();
    let _ = writeln!(
        out,
        "{} restored, {} removed, {} recreated, {} unchanged, {} skipped, {} failed, {} conflict",
        m.restored, m.removed, m.recreated, m.unchanged, m.skipped, m.failed, m.conflict
    );
    if r.dry_run {
        let _ = writeln!(out, "Dry run: nothing was changed.");
    }
    if r.selected == Some(0) {
        let _ = writeln!(out, "The selection matched no record of this session: nothing was changed.");
        return;
    }
    if r.complete {
        let _ = writeln!(
            out,
            "{}",
            if r.dry_run {
                "An undo would be complete."
            } else {
                "Undo complete: every recorded step was undone exactly."
            }
        );
    } else {
        let bad = m.skipped + m.failed + m.conflict;
        let _ = writeln!(
            out,
            "Undo INCOMPLETE: {bad} step(s) {} not be undone exactly; each is listed above with its reason.",
            if r.dry_run { "would" } else { "could" }
        );
    }
}

/// The line of one step.
fn step_line(out: &mut impl std::fmt::Write, o: &StepReport) {
    let seq = o.seq.map(|s| format!("#{s}")).unwrap_or_else(|| "-".into());
    let path = o.path.as_ref().map(escape).unwrap_or_default();
    let _ = writeln!(out, "  {:<9} {seq:<6} {path}  ({})", o.outcome.name(), escape_text(&o.why));
}

/// One line per step of a report, then its notes.
fn steps_text(out: &mut impl std::fmt::Write, r: &Report) {
    for o in &r.outcomes {
        step_line(out, o);
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {}", escape_text(n));
    }
}

/// The human form of a redo's report (an undo of the last undo's own journal).
pub fn redo_text(s: &Session, r: &Report) -> String {
    let mut out = String::new();
    let what = if r.dry_run { "Dry run of a redo of" } else { "Redo of" };
    let _ = writeln!(out, "{what} session {} ({}): taking back its last undo", s.header().id, s.dir().display());
    steps_text(&mut out, r);
    let m = r.summary();
    let bad = m.skipped + m.failed + m.conflict;
    let verdict = match (r.complete, r.dry_run) {
        (true, true) => "A redo would be complete.".to_string(),
        (true, false) => "Redo complete: every path the undo changed is as it was before it.".to_string(),
        (false, dry) => format!(
            "Redo INCOMPLETE: {bad} step(s) {} not be taken back exactly; each is listed above with its reason.",
            if dry { "would" } else { "could" }
        ),
    };
    let _ = writeln!(out, "{verdict}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escaping_neutralises_osc_sequences_c1_controls_soft_hyphens_joiners_and_tags() {
        let nasty = "a\u{1b}]52;c;cHduZWQ=\u{7}b\u{1b}]8;;http://x\u{1b}\\c\u{9b}31m\u{ad}\u{2060}\u{2064}\u{fffb}\u{e0041}\u{e007f}d";
        let out = escape_text(nasty);
        assert!(out.chars().all(|c| !must_escape(c)), "{out:?}");
        assert_eq!(
            out,
            "a\\u{1b}]52;c;cHduZWQ=\\u{7}b\\u{1b}]8;;http://x\\u{1b}\\\\c\\u{9b}31m\\u{ad}\\u{2060}\\u{2064}\\u{fffb}\\u{e0041}\\u{e007f}d"
        );
        assert_eq!(escape_text("plain élan"), "plain élan", "ordinary text is left alone");
    }

    #[test]
    fn terminal_escaping_neutralises_controls_bidi_and_invalid_bytes() {
        let p = BPath::new(b"a\nb\x1b[31m\xe2\x80\xaeevil\xff".to_vec());
        assert_eq!(escape(&p), "a\\nb\\u{1b}[31m\\u{202e}evil\\xff");
        assert_eq!(escape(&BPath::from("plain name.txt")), "plain name.txt");
    }
}
