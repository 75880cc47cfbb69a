//! A Rust program whose file changes go through rustix's raw system calls instead of libc,
//! as many Rust tools' do: `tempfile`'s persist renames its temporary file over the target
//! with rustix. The test suite runs it under the supervisor, which must journal what the
//! shim cannot see. Run in a directory holding `target`, `doomed`, `from` and `mode`; with
//! `lock`, in one holding a directory `cache`.
use std::io::Write;

fn main() -> std::io::Result<()> {
    let dir = std::env::current_dir()?;
    if std::env::args().nth(1).as_deref() == Some("lock") {
        // uv's cache lock: a new name made by persist in a directory that existed before, then
        // opened again and written.
        let mut tmp = tempfile::NamedTempFile::new_in(dir.join("cache"))?;
        tmp.write_all(b"lock\n")?;
        tmp.persist(dir.join("cache/.lock")).map_err(|e| e.error)?;
        let mut again = std::fs::OpenOptions::new().append(true).open(dir.join("cache/.lock"))?;
        again.write_all(b"held\n")?;
        println!("done");
        return Ok(());
    }
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
    tmp.write_all(b"persisted over the old one\n")?;
    tmp.persist(dir.join("target")).map_err(|e| e.error)?;
    rustix::fs::unlink("doomed")?;
    rustix::fs::rename("from", "to")?;
    rustix::fs::mkdir("made", rustix::fs::Mode::from_raw_mode(0o755))?;
    rustix::fs::chmod("mode", rustix::fs::Mode::from_raw_mode(0o600))?;
    let fd = rustix::fs::open(
        "made/raw",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CREATE | rustix::fs::OFlags::EXCL,
        rustix::fs::Mode::from_raw_mode(0o644),
    )?;
    rustix::io::write(&fd, b"written with rustix\n")?;
    println!("done");
    Ok(())
}
