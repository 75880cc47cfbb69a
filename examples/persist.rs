//! A Rust program whose file changes go through rustix's raw system calls instead of libc,
//! as many Rust tools' do: `tempfile`'s persist renames its temporary file over the target
//! with rustix. The test suite runs it under the supervisor, which must journal what the
//! shim cannot see. Run in a directory holding `target`, `doomed`, `from` and `mode`.
use std::io::Write;

fn main() -> std::io::Result<()> {
    let dir = std::env::current_dir()?;
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
