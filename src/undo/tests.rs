//! Unit tests of undo, on journals made by the capture code itself.

use super::*;
use crate::capture::tests::TestCounters;
use crate::capture::{Capturer, Intent};
use crate::config::Budget;
use crate::journal::JournalContents;
use crate::record::{DirTimesOp, Reason, RenameOp, Version};
use crate::select::{Selection, select};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

struct Fixture {
    _t: tempfile::TempDir,
    work: PathBuf,
    blobs: PathBuf,
    counters: TestCounters,
    records: Vec<Record>,
    /// Small copies go into a pack, as the supervisor's do.
    packing: bool,
    pack: std::cell::RefCell<Option<crate::pack::Pack>>,
}

/// Packs as a supervisor worker does.
impl crate::capture::Packer for Fixture {
    fn append(&self, blobs: std::os::fd::BorrowedFd<'_>, bytes: &[u8]) -> std::io::Result<(String, u64)> {
        let mut slot = self.pack.borrow_mut();
        let pack = match &mut *slot {
            Some(pack) if pack.has_room(bytes.len() as u64) => pack,
            slot => slot.insert(crate::pack::Pack::create(
                &crate::capture::Direct,
                blobs,
                crate::capture::Counters::next_id(&self.counters),
                false,
            )?),
        };
        let at = pack.append(bytes, false)?;
        Ok((pack.name.clone(), at))
    }
}

use std::path::PathBuf;

impl Fixture {
    fn new() -> Fixture {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        fs::create_dir(root.join("blobs")).unwrap();
        fs::create_dir(root.join("work")).unwrap();
        Fixture {
            work: root.join("work"),
            blobs: root.join("blobs"),
            _t: t,
            counters: TestCounters::default(),
            records: vec![],
            packing: false,
            pack: Default::default(),
        }
    }
    fn packing() -> Fixture {
        Fixture { packing: true, ..Fixture::new() }
    }
    fn p(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }
    fn bp(&self, name: &str) -> BPath {
        BPath::from(self.p(name).as_path())
    }
    /// Captures `name` (in the work directory) as the shim would before a call with `intent`.
    fn capture(&self, name: &[u8], intent: Intent) -> Before {
        let blobs = fs::File::open(&self.blobs).unwrap();
        let work = fs::File::open(&self.work).unwrap();
        let cap = Capturer {
            blobs: blobs.as_fd(),
            budget: Budget::default(),
            counters: &self.counters,
            sync: false,
            index: None,
            calls: &crate::capture::Direct,
            pack: self.packing.then_some(self as &dyn crate::capture::Packer),
        };
        cap.capture(work.as_fd(), name, intent)
    }
    /// Captures `name` as the shim would before a call with `intent`, and journals it.
    fn change(&mut self, name: &str, intent: Intent) {
        let before = self.capture(name.as_bytes(), intent);
        let path = self.bp(name);
        self.push(Op::Change { path, before });
    }
    fn push(&mut self, op: Op) {
        let seq = self.records.len() as u64 + 1;
        self.records.push(Record {
            v: Version,
            seq,
            time: Default::default(),
            pid: 1,
            ppid: 0,
            origin: crate::record::Origin::new(BPath::from("/bin/test"), "test".into()),
            op,
        });
    }
    /// Undoes only the records `only`, unsealed, with nothing undone before.
    fn undo_only(&self, only: &BTreeSet<u64>) -> Report {
        let j = JournalContents { records: self.records.clone(), ..Default::default() };
        let (opts, none) = (UndoOptions::default(), SeqSet::default());
        let plan = Plan {
            journal: &j,
            blobs_dir: &self.blobs,
            opts: &opts,
            seal: None,
            already: &none,
            undo_times: &Default::default(),
            only: Some(only),
            earlier_undo: false,
        };
        run_plan(&plan, &mut |_, _| {}).unwrap()
    }
    fn undo(&self) -> Report {
        let j = JournalContents { records: self.records.clone(), ..Default::default() };
        undo_records(&j, &self.blobs, &UndoOptions::default()).unwrap()
    }
    /// Seals the session as `run` does when its command ends, then undoes all of it (or
    /// with `dry_run`, plans it).
    fn undo_sealed(&self, dry_run: bool) -> Report {
        let j = JournalContents { records: self.records.clone(), ..Default::default() };
        let seal = crate::seal::take_seal(&j, &self.blobs, || {});
        let (opts, none) = (UndoOptions { dry_run, ..Default::default() }, SeqSet::default());
        let plan = Plan {
            journal: &j,
            blobs_dir: &self.blobs,
            opts: &opts,
            seal: Some(&seal),
            already: &none,
            undo_times: &Default::default(),
            only: None,
            earlier_undo: false,
        };
        run_plan(&plan, &mut |_, _| {}).unwrap()
    }
    /// Every blob file in the store (inside its shard directory).
    fn blob_files(&self) -> Vec<PathBuf> {
        let mut out = vec![];
        for shard in fs::read_dir(&self.blobs).unwrap() {
            for b in fs::read_dir(shard.unwrap().path()).unwrap() {
                out.push(b.unwrap().path());
            }
        }
        out
    }
    fn outcomes(r: &Report) -> Vec<Outcome> {
        r.outcomes.iter().map(|o| o.outcome).collect()
    }
}

#[test]
fn an_overwritten_file_is_restored_in_place_with_its_mode() {
    let mut f = Fixture::new();
    fs::write(f.p("a"), b"old").unwrap();
    fs::set_permissions(f.p("a"), fs::Permissions::from_mode(0o640)).unwrap();
    f.change("a", Intent::Overwrite);
    fs::write(f.p("a"), b"new and longer").unwrap();
    fs::set_permissions(f.p("a"), fs::Permissions::from_mode(0o777)).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Restored]);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"old");
    assert_eq!(fs::metadata(f.p("a")).unwrap().permissions().mode() & 0o7777, 0o640);
}

#[test]
fn a_created_file_is_removed_and_a_never_created_one_is_unchanged() {
    let mut f = Fixture::new();
    f.change("new", Intent::Overwrite);
    f.change("never", Intent::Overwrite);
    fs::write(f.p("new"), b"x").unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged, Outcome::Removed]);
    assert_eq!((code(&r, 0).as_str(), code(&r, 1).as_str()), ("already_as_before", "undone"));
    assert!(r.files_exact());
    assert!(!f.p("new").exists());
}

#[test]
fn a_deleted_file_is_recreated_as_the_same_inode() {
    let mut f = Fixture::new();
    fs::write(f.p("a"), b"keep me").unwrap();
    let ino = fs::metadata(f.p("a")).unwrap().ino();
    f.change("a", Intent::Destroy);
    fs::remove_file(f.p("a")).unwrap();
    let r = f.undo();
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Recreated]);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"keep me");
    assert_eq!(fs::metadata(f.p("a")).unwrap().ino(), ino);
    assert_eq!(f.blob_files().len(), 0, "the blob was moved back, not copied");
    // A second run finds it in place.
    let r2 = f.undo();
    assert_eq!(Fixture::outcomes(&r2), vec![Outcome::Unchanged]);
}

use std::os::unix::fs::MetadataExt;

#[test]
fn a_removed_directory_tree_comes_back_in_order() {
    let mut f = Fixture::new();
    fs::create_dir(f.p("d")).unwrap();
    fs::set_permissions(f.p("d"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::write(f.p("d/x"), b"1").unwrap();
    std::os::unix::fs::symlink("x", f.p("d/l")).unwrap();
    // rm -rf order: children, then the directory.
    f.change("d/x", Intent::Destroy);
    fs::remove_file(f.p("d/x")).unwrap();
    f.change("d/l", Intent::Destroy);
    fs::remove_file(f.p("d/l")).unwrap();
    f.change("d", Intent::Destroy);
    fs::remove_dir(f.p("d")).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Recreated; 3]);
    assert_eq!(fs::metadata(f.p("d")).unwrap().permissions().mode() & 0o7777, 0o751);
    assert_eq!(fs::read(f.p("d/x")).unwrap(), b"1");
    assert_eq!(fs::read_link(f.p("d/l")).unwrap(), PathBuf::from("x"));
}

#[test]
fn a_rename_over_a_file_is_moved_back_and_the_target_restored() {
    let mut f = Fixture::new();
    fs::write(f.p("tmp"), b"new").unwrap();
    fs::write(f.p("dst"), b"old").unwrap();
    let to_before = f.capture(b"dst", Intent::Destroy);
    let moved = Some(ident_of(&rustix::fs::stat(f.p("tmp")).unwrap()));
    let (from, to) = (f.bp("tmp"), f.bp("dst"));
    f.push(Op::Rename(Box::new(RenameOp { from, to, flags: 0, moved, to_before })));
    fs::rename(f.p("tmp"), f.p("dst")).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Restored, Outcome::Recreated]);
    assert_eq!(fs::read(f.p("tmp")).unwrap(), b"new");
    assert_eq!(fs::read(f.p("dst")).unwrap(), b"old");
}

#[test]
fn a_rename_that_failed_leaves_both_names_alone() {
    let mut f = Fixture::new();
    fs::write(f.p("a"), b"a").unwrap();
    fs::write(f.p("b"), b"b").unwrap();
    let (from, to) = (f.bp("a"), f.bp("b"));
    // e.g. renameat2(RENAME_NOREPLACE) that failed with EEXIST
    f.push(Op::Rename(Box::new(RenameOp { from, to, flags: 1, moved: None, to_before: Before::Absent })));
    let r = f.undo();
    assert!(r.complete);
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged]);
    assert_eq!(fs::read(f.p("b")).unwrap(), b"b");
}

#[test]
fn an_irreversible_step_is_skipped_with_its_reason_and_makes_the_undo_incomplete() {
    let mut f = Fixture::new();
    let path = f.bp("big");
    f.push(Op::Change { path, before: Before::irreversible(Reason::OverFileBudget { size: 9, limit: 1 }) });
    let r = f.undo();
    assert!(!r.complete);
    assert_eq!(r.outcomes[0].outcome, Outcome::Skipped);
    assert!(r.outcomes[0].why.contains("budget"), "{}", r.outcomes[0].why);
    assert_eq!(code(&r, 0), "not_kept");
    assert!(!r.files_exact());
}

#[test]
fn a_tampered_blob_is_never_written_back() {
    let mut f = Fixture::new();
    fs::write(f.p("a"), b"original").unwrap();
    f.change("a", Intent::Overwrite);
    fs::write(f.p("a"), b"changed").unwrap();
    let blob = f.blob_files().remove(0);
    fs::write(&blob, b"evil!!!!").unwrap();
    let r = f.undo();
    assert!(!r.complete);
    assert_eq!(r.outcomes[0].outcome, Outcome::Failed);
    assert!(r.outcomes[0].why.contains("tampered"), "{}", r.outcomes[0].why);
    assert_eq!(code(&r, 0), "blob_damaged");
    assert_eq!(fs::read(f.p("a")).unwrap(), b"changed");
}

#[test]
fn a_missing_blob_fails_that_step_and_the_others_are_still_undone() {
    let mut f = Fixture::new();
    fs::write(f.p("a"), b"1").unwrap();
    f.change("a", Intent::Overwrite);
    f.change("b", Intent::Overwrite);
    fs::write(f.p("a"), b"2").unwrap();
    fs::write(f.p("b"), b"2").unwrap();
    for b in f.blob_files() {
        fs::remove_file(b).unwrap();
    }
    let r = f.undo();
    assert!(!r.complete);
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Removed, Outcome::Failed]);
    assert!(r.outcomes[1].why.contains("missing"));
    assert_eq!(code(&r, 1), "blob_missing");
    assert!(!f.p("b").exists());
}

#[test]
fn a_rewrite_of_a_file_the_session_created_is_undone_only_with_its_creation() {
    let mut f = Fixture::new();
    // #1 creates `out`, #2 rewrites it without a capture (born), #3 rewrites it again.
    f.push(Op::Change { path: f.bp("out"), before: Before::Absent });
    f.push(Op::Change { path: f.bp("out"), before: Before::Born { created: 1 } });
    f.push(Op::Change { path: f.bp("out"), before: Before::Born { created: 1 } });
    fs::write(f.p("out"), b"third").unwrap();
    let j = JournalContents { records: f.records.clone(), ..Default::default() };
    let opts = UndoOptions::default();
    let plan = |only: &BTreeSet<u64>, already: &SeqSet| {
        let plan = Plan {
            journal: &j,
            blobs_dir: &f.blobs,
            opts: &opts,
            seal: None,
            already,
            undo_times: &Default::default(),
            only: Some(only),
            earlier_undo: false,
        };
        run_plan(&plan, &mut |_, _| {}).unwrap()
    };
    // The newest record alone: what `out` held before it was not kept.
    let r = plan(&select(&j, &Selection::Last(1)), &SeqSet::default());
    assert!(!r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Skipped]);
    assert!(r.outcomes[0].why.contains("not kept") && r.outcomes[0].why.contains("record 1"), "{r:?}");
    assert_eq!(fs::read(f.p("out")).unwrap(), b"third", "nothing was made up");
    // The rewrites, after an earlier undo already reversed the creation: nothing left to do.
    fs::remove_file(f.p("out")).unwrap();
    let r = plan(&BTreeSet::from([2, 3]), &[1].into_iter().collect());
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged, Outcome::Unchanged]);
    fs::write(f.p("out"), b"third").unwrap();
    // The whole session: the rewrites need nothing, the creation removes the file.
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged, Outcome::Unchanged, Outcome::Removed]);
    assert!(!f.p("out").exists());
}

#[test]
fn a_rewrite_kept_by_an_earlier_copy_is_undone_only_with_that_copy() {
    let mut f = Fixture::new();
    fs::write(f.p("db"), b"before the session").unwrap();
    f.change("db", Intent::Overwrite); // #1: the copy
    fs::write(f.p("db"), b"first rewrite").unwrap();
    f.push(Op::Change { path: f.bp("db"), before: Before::Kept { by: 1 } }); // #2
    fs::write(f.p("db"), b"second rewrite").unwrap();
    let r = f.undo_only(&BTreeSet::from([2]));
    assert!(!r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Skipped]);
    assert!(r.outcomes[0].why.contains("record 1"), "{r:?}");
    assert_eq!(fs::read(f.p("db")).unwrap(), b"second rewrite", "nothing was made up");
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged, Outcome::Restored]);
    assert_eq!(fs::read(f.p("db")).unwrap(), b"before the session");
}

#[test]
fn an_exclusive_create_removes_only_what_was_born_after_its_record() {
    use std::time::{Duration, SystemTime};
    let stamp = crate::record::Stamp::of;
    let mut f = Fixture::new();
    fs::write(f.p("old"), b"there before the session").unwrap();
    // A process killed between its exclusive open's EEXIST and the call_failed record:
    // the record stands alone, and the file at its path is older than it.
    f.push(Op::Change { path: f.bp("old"), before: Before::Exclusive });
    f.records.last_mut().unwrap().time = stamp(SystemTime::now() + Duration::from_secs(60));
    // An exclusive open that did create its file: born after the record.
    f.push(Op::Change { path: f.bp("new"), before: Before::Exclusive });
    f.records.last_mut().unwrap().time = stamp(SystemTime::now());
    fs::write(f.p("new"), b"made in the session").unwrap();
    let r = f.undo();
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Removed, Outcome::Conflict], "{r:?}");
    assert!(!r.complete, "a step left in place is never a complete undo");
    assert!(r.outcomes[1].why.contains("born at"), "{r:?}");
    assert!(!f.p("new").exists());
    assert_eq!(fs::read(f.p("old")).unwrap(), b"there before the session", "nothing that was there is removed");
}

#[test]
fn a_symlink_planted_above_a_path_is_a_conflict_and_is_not_followed() {
    let mut f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    fs::create_dir(f.p("d")).unwrap();
    fs::write(f.p("d/a"), b"1").unwrap();
    f.change("d/a", Intent::Overwrite);
    // After the session, someone swaps d for a symlink pointing elsewhere.
    fs::remove_file(f.p("d/a")).unwrap();
    fs::remove_dir(f.p("d")).unwrap();
    std::os::unix::fs::symlink(outside.path(), f.p("d")).unwrap();
    let r = f.undo();
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Conflict]);
    assert!(fs::read_dir(outside.path()).unwrap().next().is_none(), "nothing was written through the symlink");
}

#[test]
fn a_temporary_name_whose_record_never_came_makes_the_undo_incomplete_and_names_what_is_there() {
    let mut f = Fixture::new();
    // Completed: the intent, then the created name (removed by undo).
    f.push(Op::TempName { template: f.bp("tmpXXXXXX") });
    f.push(Op::Change { path: f.bp("tmpAb12Cd"), before: Before::Absent });
    fs::write(f.p("tmpAb12Cd"), b"").unwrap();
    // Failed: the intent, then its call_failed.
    f.push(Op::TempName { template: f.bp("tmpXXXXXX") });
    f.push(Op::CallFailed { of_seq: 3, errno: 17 }); // EEXIST
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert!(!f.p("tmpAb12Cd").exists());
    // Interrupted: the process died between the call and the record naming its file.
    f.push(Op::TempName { template: f.bp("tmpXXXXXX") });
    fs::write(f.p("tmpZz99Yy"), b"").unwrap();
    fs::write(f.p("other-name"), b"").unwrap();
    let r = f.undo();
    assert!(!r.complete);
    let step = r.outcomes.iter().find(|o| o.seq == Some(5)).expect("the interrupted intent is reported");
    assert_eq!(step.outcome, Outcome::Skipped);
    assert!(step.why.contains("tmpZz99Yy") && !step.why.contains("other-name"), "{}", step.why);
    assert!(f.p("tmpZz99Yy").exists(), "a name undo cannot prove the session made is never removed");
}

#[test]
fn only_a_later_record_of_the_same_process_completes_a_temporary_name() {
    let template = BPath::from("/d/tmpXXXXXX");
    let rec = |seq: u64, pid: u32, op: Op| Record {
        v: Version,
        seq,
        time: Default::default(),
        pid,
        ppid: 0,
        origin: crate::record::Origin::new(BPath::from("/bin/test"), "mkstemp".into()),
        op,
    };
    let absent = |p: &str| Op::Change { path: BPath::from(p), before: Before::Absent };
    let j = |records: Vec<Record>| JournalContents { records, ..Default::default() };
    let t = || Op::TempName { template: template.clone() };
    // Another process's file, a name in another directory, a name of another length.
    let interrupted = j(vec![
        rec(1, 10, t()),
        rec(2, 11, absent("/d/tmpabcdef")),
        rec(3, 10, absent("/e/tmpabcdef")),
        rec(4, 10, absent("/d/tmpabcdefg")),
    ])
    .interrupted_temp_names();
    assert_eq!(interrupted, HashSet::from([1]));
    // Two intents of one process, one completion: one stays open.
    let interrupted =
        j(vec![rec(1, 10, t()), rec(2, 10, t()), rec(3, 10, absent("/d/tmpabcdef"))]).interrupted_temp_names();
    assert_eq!(interrupted.len(), 1);
    assert!(j(vec![rec(1, 10, t()), rec(2, 10, absent("/d/tmpQ1w2E3"))]).interrupted_temp_names().is_empty());
}

#[test]
fn an_append_is_undone_by_truncating_to_the_prior_length() {
    let mut f = Fixture::new();
    fs::write(f.p("log"), b"line1\n").unwrap();
    f.change("log", Intent::Append);
    fs::OpenOptions::new().append(true).open(f.p("log")).unwrap().write_all(b"line2\n").unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(fs::read(f.p("log")).unwrap(), b"line1\n");
    assert_eq!(f.counters.bytes_kept(), 0);
}

use crate::capture::Counters;
use std::io::Write;

#[test]
fn a_created_directory_with_foreign_entries_is_reported_not_deleted() {
    let mut f = Fixture::new();
    f.change("d", Intent::Overwrite);
    fs::create_dir(f.p("d")).unwrap();
    fs::write(f.p("d/user-file"), b"not journaled").unwrap();
    let r = f.undo();
    assert!(!r.complete);
    assert_eq!(r.outcomes[0].outcome, Outcome::Failed);
    assert!(r.outcomes[0].why.contains("user-file"), "{}", r.outcomes[0].why);
    assert!(f.p("d/user-file").exists());
}

#[test]
fn non_utf8_names_are_restored_exactly() {
    let mut f = Fixture::new();
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9\nname");
    fs::write(f.work.join(name), b"x").unwrap();
    let before = f.capture(name.as_bytes(), Intent::Destroy);
    let path = BPath::from(f.work.join(name).as_path());
    f.push(Op::Change { path, before });
    fs::remove_file(f.work.join(name)).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(fs::read(f.work.join(name)).unwrap(), b"x");
    let json = r.to_json();
    assert!(json["outcomes"][0]["path_b64"].is_string(), "{json}");
}

#[test]
fn an_unobserved_process_is_skipped_unless_its_call_failed() {
    use crate::record::UnobservedReason;
    let mut f = Fixture::new();
    let reason = UnobservedReason::CredentialsChanged { uid: 65534, store_owner: 0 };
    f.push(Op::Unobserved { program: BPath::from("/usr/bin/setpriv"), reason: Box::new(reason.clone()) });
    let r = f.undo();
    assert!(!r.complete);
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Skipped]);
    assert!(r.outcomes[0].why.contains("uid 65534"), "{}", r.outcomes[0].why);
    f.push(Op::CallFailed { of_seq: 1, errno: 1 });
    let r = f.undo();
    assert!(r.complete, "the switch failed, so nothing ran unobserved: {r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Unchanged]);
}

fn meta(f: &mut Fixture, name: &str, what: crate::record::MetaKind, xattr: Option<&str>) {
    let path = f.bp(name);
    let st = rustix::fs::lstat(f.p(name)).unwrap();
    let xattr = xattr.map(|n| crate::record::XattrBefore {
        name: BPath::from(n),
        value: crate::capture::xattr_value(path.as_bytes(), n.as_bytes()).unwrap().map(crate::record::Bytes),
    });
    f.push(Op::Meta { path, before: crate::capture::meta_before(&st, what, xattr).into() });
}

#[test]
fn mode_times_and_xattr_changes_are_set_back_and_only_those() {
    use crate::record::MetaKind;
    let mut f = Fixture::new();
    fs::write(f.p("a"), b"x").unwrap();
    fs::set_permissions(f.p("a"), fs::Permissions::from_mode(0o640)).unwrap();
    rustix::fs::setxattr(f.p("a").as_path(), "user.keep", b"v1", rustix::fs::XattrFlags::empty()).unwrap();
    let mtime = fs::metadata(f.p("a")).unwrap().modified().unwrap();
    meta(&mut f, "a", MetaKind::Mode, None);
    fs::set_permissions(f.p("a"), fs::Permissions::from_mode(0o777)).unwrap();
    meta(&mut f, "a", MetaKind::Times, None);
    fs::File::options().write(true).open(f.p("a")).unwrap().set_modified(std::time::UNIX_EPOCH).unwrap();
    meta(&mut f, "a", MetaKind::Xattr, Some("user.keep"));
    rustix::fs::setxattr(f.p("a").as_path(), "user.keep", b"v2", rustix::fs::XattrFlags::empty()).unwrap();
    meta(&mut f, "a", MetaKind::Xattr, Some("user.new"));
    rustix::fs::setxattr(f.p("a").as_path(), "user.new", b"n", rustix::fs::XattrFlags::empty()).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Restored; 4]);
    assert_eq!(fs::metadata(f.p("a")).unwrap().permissions().mode() & 0o7777, 0o640);
    assert_eq!(fs::metadata(f.p("a")).unwrap().modified().unwrap(), mtime);
    assert_eq!(crate::capture::xattr_value(f.bp("a").as_bytes(), b"user.keep").unwrap().unwrap(), b"v1");
    assert_eq!(crate::capture::xattr_value(f.bp("a").as_bytes(), b"user.new").unwrap(), None);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"x", "contents untouched by metadata undo");
}

#[test]
fn a_directory_created_and_removed_within_the_session_leaves_no_failed_metadata() {
    let mut f = Fixture::new();
    // mkdir d; mkdir d/sub; rm -rf d: the undo recreates both, then removes both.
    f.change("d", Intent::Overwrite);
    fs::create_dir(f.p("d")).unwrap();
    f.change("d/sub", Intent::Overwrite);
    fs::create_dir(f.p("d/sub")).unwrap();
    fs::set_permissions(f.p("d/sub"), fs::Permissions::from_mode(0o750)).unwrap();
    f.change("d/sub", Intent::Destroy);
    fs::remove_dir(f.p("d/sub")).unwrap();
    f.change("d", Intent::Destroy);
    fs::remove_dir(f.p("d")).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(Fixture::outcomes(&r), vec![Outcome::Recreated, Outcome::Recreated, Outcome::Removed, Outcome::Removed]);
    assert!(!f.p("d").exists());
}

#[test]
fn a_directory_moved_back_takes_its_pending_mode_with_it() {
    let mut f = Fixture::new();
    fs::create_dir(f.p("d")).unwrap();
    fs::set_permissions(f.p("d"), fs::Permissions::from_mode(0o751)).unwrap();
    // mv d e; chmod 700 e
    let moved = Some(ident_of(&rustix::fs::stat(f.p("d")).unwrap()));
    f.push(Op::Rename(Box::new(RenameOp {
        from: f.bp("d"),
        to: f.bp("e"),
        flags: 0,
        moved,
        to_before: Before::Absent,
    })));
    fs::rename(f.p("d"), f.p("e")).unwrap();
    let before = crate::capture::meta_before(&rustix::fs::lstat(f.p("e")).unwrap(), MetaKind::Mode, None);
    f.push(Op::Meta { path: f.bp("e"), before: before.into() });
    fs::set_permissions(f.p("e"), fs::Permissions::from_mode(0o700)).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert!(!f.p("e").exists());
    assert_eq!(fs::metadata(f.p("d")).unwrap().permissions().mode() & 0o7777, 0o751);
}

#[test]
fn a_recreated_directory_gets_its_mode_and_times_only_after_its_entries() {
    let mut f = Fixture::new();
    fs::create_dir(f.p("ro")).unwrap();
    fs::write(f.p("ro/inner"), b"1").unwrap();
    rustix::fs::setxattr(f.p("ro").as_path(), "user.dir", b"d", rustix::fs::XattrFlags::empty()).unwrap();
    f.change("ro/inner", Intent::Destroy);
    fs::remove_file(f.p("ro/inner")).unwrap();
    fs::set_permissions(f.p("ro"), fs::Permissions::from_mode(0o555)).unwrap();
    // What the rmdir capture sees, and what must be reinstated once `inner` is back.
    let mtime = fs::metadata(f.p("ro")).unwrap().modified().unwrap();
    f.change("ro", Intent::Destroy);
    fs::remove_dir(f.p("ro")).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    let md = fs::metadata(f.p("ro")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o555);
    assert_eq!(md.modified().unwrap(), mtime, "directory mtime set after its entries were put back");
    assert_eq!(fs::read(f.p("ro/inner")).unwrap(), b"1");
    assert_eq!(crate::capture::xattr_value(f.bp("ro").as_bytes(), b"user.dir").unwrap().unwrap(), b"d");
}

#[test]
fn a_failed_step_superseded_by_an_exact_older_restore_is_forgiven() {
    let mut f = Fixture::new();
    fs::write(f.p("log"), b"orig").unwrap();
    f.change("log", Intent::Overwrite); // a full, hashed copy of "orig"
    fs::write(f.p("log"), b"rewritten").unwrap();
    f.change("log", Intent::Append); // only the length: 9
    // The file then vanishes in a way the journal does not explain step by step (a race).
    fs::remove_file(f.p("log")).unwrap();
    let r = f.undo();
    assert!(r.complete, "{r:?}");
    assert_eq!(fs::read(f.p("log")).unwrap(), b"orig");
    assert_eq!(r.outcomes[0].outcome, Outcome::Unchanged);
    assert!(r.outcomes[0].why.contains("could not be replayed") && r.outcomes[0].why.contains("verified"), "{r:?}");
}

#[test]
fn a_failed_step_is_not_forgiven_when_the_prior_state_cannot_be_verified() {
    let mut f = Fixture::new();
    fs::write(f.p("log"), b"orig").unwrap();
    f.change("log", Intent::Append); // only the length is known: nothing to verify against
    fs::write(f.p("log"), b"o").unwrap(); // bytes from before the session are gone
    let r = f.undo();
    assert!(!r.complete);
    assert_eq!(r.outcomes[0].outcome, Outcome::Failed);
}

#[test]
fn a_dry_run_changes_nothing() {
    let mut f = Fixture::new();
    fs::write(f.p("a"), b"old").unwrap();
    f.change("a", Intent::Overwrite);
    fs::write(f.p("a"), b"new").unwrap();
    let j = JournalContents { records: f.records.clone(), ..Default::default() };
    let r = undo_records(&j, &f.blobs, &UndoOptions { dry_run: true, ..Default::default() }).unwrap();
    assert!(r.dry_run && r.complete);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"new");
}

/// The `code` of step `i`'s cause, as the JSON contract writes it.
fn code(r: &Report, i: usize) -> String {
    let v = serde_json::to_value(&r.outcomes[i].cause).unwrap();
    v["code"].as_str().unwrap().to_string()
}

fn peer() -> crate::record::Endpoint {
    crate::record::Endpoint { family: "inet".into(), address: BPath::from("192.0.2.1"), port: Some(443) }
}

#[test]
fn a_connection_a_datagram_and_an_outside_signal_leave_the_files_exact_but_the_undo_incomplete() {
    let mut f = Fixture::new();
    f.push(Op::Connect { peer: Box::new(peer()), result: ConnectResult::Ok });
    f.push(Op::Send { peer: Box::new(peer()) });
    f.push(Op::Signal { target: 4242, target_prog: None, signal: 9, outside: true });
    let r = f.undo();
    assert!(!r.complete);
    assert!(r.files_exact(), "nothing but effects outside the file system");
    let codes: Vec<String> = (0..3).map(|i| code(&r, i)).collect();
    assert_eq!(codes, ["signal", "datagram", "network"]);
    let json = r.to_json();
    assert_eq!(json["files_exact"], true);
    assert_eq!(json["irreversible"].as_array().unwrap().len(), 3);
    assert_eq!(json["outcomes"][0]["cause"], serde_json::json!({"code": "signal", "target": 4242, "signal": 9}));
}

#[test]
fn a_failed_connection_and_a_refused_call_changed_nothing() {
    let mut f = Fixture::new();
    f.push(Op::Connect { peer: Box::new(peer()), result: ConnectResult::Failed { errno: 111 } });
    f.push(Op::Refused { what: "x".into(), errno: 13 });
    let r = f.undo();
    assert!(r.complete && r.files_exact());
    assert_eq!((code(&r, 0).as_str(), code(&r, 1).as_str()), ("call_changed_nothing", "call_changed_nothing"));
}

#[test]
fn an_unobserved_program_is_named_with_its_typed_reason_and_the_files_are_not_exact() {
    let mut f = Fixture::new();
    f.push(Op::Unobserved {
        program: BPath::from("/bin/static"),
        reason: Box::new(crate::record::UnobservedReason::StaticExecutable),
    });
    let r = f.undo();
    assert!(!r.files_exact());
    let v = serde_json::to_value(&r.outcomes[0].cause).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"code": "unobserved", "program": "/bin/static", "reason": {"code": "static_executable"}})
    );
}

#[test]
fn a_symlink_planted_above_a_path_has_the_cause_symlink_in_path_naming_the_directory() {
    let mut f = Fixture::new();
    fs::create_dir(f.p("d")).unwrap();
    f.change("d/new", Intent::Overwrite);
    fs::write(f.p("d/new"), b"x").unwrap();
    fs::rename(f.p("d"), f.p("real")).unwrap();
    std::os::unix::fs::symlink("real", f.p("d")).unwrap();
    let r = f.undo();
    assert_eq!(r.outcomes[0].outcome, Outcome::Conflict);
    let v = serde_json::to_value(&r.outcomes[0].cause).unwrap();
    assert_eq!(v["code"], "symlink_in_path");
    assert_eq!(v["dir"], f.p("d").to_str().unwrap());
}

#[test]
fn a_directory_that_holds_entries_the_journal_did_not_create_has_the_cause_not_empty() {
    let mut f = Fixture::new();
    f.change("d", Intent::Overwrite);
    fs::create_dir(f.p("d")).unwrap();
    fs::write(f.p("d/stranger"), b"x").unwrap();
    assert_eq!(code(&f.undo(), 0), "not_empty");
}

#[test]
fn a_path_whose_directory_is_gone_has_the_cause_directory_gone() {
    let mut f = Fixture::new();
    fs::create_dir(f.p("d")).unwrap();
    fs::write(f.p("d/a"), b"old").unwrap();
    f.change("d/a", Intent::Overwrite);
    fs::remove_dir_all(f.p("d")).unwrap();
    let r = f.undo();
    let v = serde_json::to_value(&r.outcomes[0].cause).unwrap();
    assert_eq!(v, serde_json::json!({"code": "directory_gone", "dir": f.p("d").to_str().unwrap()}));
}

#[test]
fn an_append_whose_earlier_bytes_are_gone_has_the_cause_prior_bytes_gone() {
    let mut f = Fixture::new();
    fs::write(f.p("log"), b"0123456789").unwrap();
    f.change("log", Intent::Append);
    fs::write(f.p("log"), b"01").unwrap();
    assert_eq!(code(&f.undo(), 0), "prior_bytes_gone");
}

#[test]
fn a_rewrite_covered_by_its_creation_has_the_cause_covered_by_and_without_it_needs_record() {
    let mut f = Fixture::new();
    f.change("made", Intent::Overwrite);
    fs::write(f.p("made"), b"x").unwrap();
    let path = f.bp("made");
    f.push(Op::Change { path, before: Before::Born { created: 1 } });
    let r = f.undo();
    assert_eq!(
        serde_json::to_value(&r.outcomes[0].cause).unwrap(),
        serde_json::json!({"code": "covered_by", "seq": 1})
    );
    let r = f.undo_only(&std::collections::BTreeSet::from([2]));
    assert_eq!(
        serde_json::to_value(&r.outcomes[0].cause).unwrap(),
        serde_json::json!({"code": "needs_record", "seq": 1})
    );
}

#[test]
fn a_record_an_earlier_undo_reversed_has_the_cause_already_undone() {
    let mut f = Fixture::new();
    f.change("new", Intent::Overwrite);
    let j = JournalContents { records: f.records.clone(), ..Default::default() };
    let already: SeqSet = [1].into_iter().collect();
    let opts = UndoOptions::default();
    let plan = Plan {
        journal: &j,
        blobs_dir: &f.blobs,
        opts: &opts,
        seal: None,
        already: &already,
        undo_times: &Default::default(),
        only: None,
        earlier_undo: false,
    };
    let r = run_plan(&plan, &mut |_, _| {}).unwrap();
    assert_eq!(code(&r, 0), "already_undone");
}

#[test]
fn an_interrupted_temporary_name_has_the_cause_interrupted_temp_name() {
    let mut f = Fixture::new();
    let template = f.bp("tmpXXXXXX");
    f.push(Op::TempName { template });
    assert_eq!(code(&f.undo(), 0), "interrupted_temp_name");
}

#[test]
fn a_system_call_that_fails_during_a_restore_names_its_errno() {
    let (outcome, _, cause) = super::fs::failed_errno(rustix::io::Errno::ACCESS, "cannot create it");
    assert_eq!(outcome, Outcome::Failed);
    assert_eq!(serde_json::to_value(&cause).unwrap(), serde_json::json!({"code": "errno", "errno": 13}));
    assert!(cause.concerns_files());
}

#[test]
fn appenders_whose_captures_took_their_ids_out_of_order_are_undone_exactly() {
    // Three processes append to one log. C captures 9 bytes; A captures 12 after C's append;
    // B captured 9 before C appended, but took its id after A: ids C < A < B. Undoing B cuts
    // the log to 9 bytes, so A's 12 are gone, yet C, older, puts back the same 9: complete.
    let mut f = Fixture::new();
    fs::write(f.p("log"), b"123456789").unwrap();
    let b_capture = f.capture(b"log", Intent::Append);
    f.change("log", Intent::Append); // C: 9
    fs::write(f.p("log"), b"123456789ccc").unwrap();
    f.change("log", Intent::Append); // A: 12
    let path = f.bp("log");
    f.push(Op::Change { path, before: b_capture }); // B: 9, newest id
    fs::write(f.p("log"), b"123456789cccaaabbb").unwrap();
    let r = f.undo();
    assert!(r.complete, "{:?}", r.outcomes);
    assert_eq!(fs::read(f.p("log")).unwrap(), b"123456789");
    assert_eq!(code(&r, 1), "covered_by", "{:?}", r.outcomes);
}

#[test]
fn a_directory_s_times_come_back_even_when_an_older_unselected_record_only_touched_an_entry_s_metadata() {
    // Turn 1 set the times of d/x (a utime, which leaves d's own times alone); turn 2 made a
    // file in d, after d's times were journaled. Undoing turn 2 alone puts d's times back:
    // the utime is no change of d's entries. (Seen with git: a freshened object, and a new
    // one in the same objects/ directory a few turns later.)
    let mut f = Fixture::new();
    fs::create_dir(f.p("d")).unwrap();
    fs::write(f.p("d/x"), b"x").unwrap();
    let st = rustix::fs::lstat(f.p("d/x")).unwrap();
    f.push(Op::Meta { path: f.bp("d/x"), before: crate::capture::meta_before(&st, MetaKind::Times, None).into() }); // #1
    let d = rustix::fs::lstat(f.p("d")).unwrap();
    let mtime = [d.st_mtime, d.st_mtime_nsec as i64];
    f.push(Op::DirTimes(Box::new(DirTimesOp {
        path: f.bp("d"),
        ident: crate::capture::ident_of(&d),
        atime: [d.st_atime, d.st_atime_nsec as i64],
        mtime,
    }))); // #2
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(f.p("d/new"), b"n").unwrap();
    f.push(Op::Change { path: f.bp("d/new"), before: Before::Absent }); // #3
    let r = f.undo_only(&BTreeSet::from([2, 3]));
    assert!(r.complete, "{:?}", r.outcomes);
    let now = rustix::fs::lstat(f.p("d")).unwrap();
    assert_eq!([now.st_mtime, now.st_mtime_nsec as i64], mtime, "{:?}", r.outcomes);
}

/// Two processes rename a file of their own onto one name at once: A captures `dst` and takes
/// its id, B takes a later id and renames first, then A's rename replaces B's file. Records
/// in id order, A < B, though the kernel ran B before A.
fn racing_renames_onto_one_name(f: &mut Fixture, b_made_by_session: bool) {
    fs::write(f.p("dst"), b"original").unwrap();
    let a_before = f.capture(b"dst", Intent::Destroy);
    if b_made_by_session {
        f.change("tmpB", Intent::Overwrite);
    }
    fs::write(f.p("tmpB"), b"from B").unwrap();
    f.change("tmpA", Intent::Overwrite);
    fs::write(f.p("tmpA"), b"from A").unwrap();
    let ident = |f: &Fixture, n: &str| Some(ident_of(&rustix::fs::stat(f.p(n)).unwrap()));
    let (moved_a, moved_b) = (ident(f, "tmpA"), ident(f, "tmpB"));
    let (from, to) = (f.bp("tmpA"), f.bp("dst"));
    f.push(Op::Rename(Box::new(RenameOp { from, to, flags: 0, moved: moved_a, to_before: a_before })));
    let b_before = f.capture(b"dst", Intent::Destroy);
    let (from, to) = (f.bp("tmpB"), f.bp("dst"));
    f.push(Op::Rename(Box::new(RenameOp { from, to, flags: 0, moved: moved_b, to_before: b_before })));
    fs::rename(f.p("tmpB"), f.p("dst")).unwrap();
    fs::rename(f.p("tmpA"), f.p("dst")).unwrap();
}

#[test]
fn renames_onto_one_name_that_the_kernel_ran_out_of_record_order_are_undone_exactly() {
    let mut f = Fixture::new();
    racing_renames_onto_one_name(&mut f, true);
    let plan = f.undo_sealed(true);
    let r = f.undo_sealed(false);
    let codes = |r: &Report| (0..r.outcomes.len()).map(|i| code(r, i)).collect::<Vec<_>>();
    assert_eq!(codes(&plan), codes(&r), "the dry run predicts the undo");
    assert!(r.complete, "{:?}", r.outcomes);
    assert_eq!(fs::read(f.p("dst")).unwrap(), b"original");
    assert!(!f.p("tmpA").exists() && !f.p("tmpB").exists());
    assert_eq!(code(&r, 0), "covered_by", "{:?}", r.outcomes);
}

#[test]
fn a_rename_whose_file_another_rename_destroyed_is_a_conflict_when_the_session_did_not_make_it() {
    // B's file existed before the session: the kernel's later rename by A destroyed it, and
    // nothing kept it, so it cannot come back.
    let mut f = Fixture::new();
    racing_renames_onto_one_name(&mut f, false);
    let r = f.undo_sealed(false);
    assert!(!r.complete, "{:?}", r.outcomes);
    assert_eq!(code(&r, 0), "replaced", "{:?}", r.outcomes);
    assert_eq!(fs::read(f.p("dst")).unwrap(), b"original", "A's record still puts back what dst held");
}

#[test]
fn renames_onto_one_name_that_both_captured_it_before_either_ran_are_undone_exactly() {
    // A and B each capture dst (the original) and take their ids, A first; then B's rename
    // and A's run in id order. Undoing A puts the original back; B then finds at dst what it
    // held before B's rename, which must not be moved onto B's temporary name.
    let mut f = Fixture::new();
    fs::write(f.p("dst"), b"original").unwrap();
    // Each made with O_CREAT|O_EXCL (storm.c's temporary names), journaled without looking.
    for tmp in ["tmpA", "tmpB"] {
        let path = f.bp(tmp);
        f.push(Op::Change { path, before: Before::Exclusive });
        fs::write(f.p(tmp), tmp.as_bytes()).unwrap();
    }
    let ident = |f: &Fixture, n: &str| Some(ident_of(&rustix::fs::stat(f.p(n)).unwrap()));
    let (a_before, b_before) = (f.capture(b"dst", Intent::Destroy), f.capture(b"dst", Intent::Destroy));
    let (moved_a, moved_b) = (ident(&f, "tmpA"), ident(&f, "tmpB"));
    let (from, to) = (f.bp("tmpB"), f.bp("dst"));
    f.push(Op::Rename(Box::new(RenameOp { from, to, flags: 0, moved: moved_b, to_before: b_before })));
    let (from, to) = (f.bp("tmpA"), f.bp("dst"));
    f.push(Op::Rename(Box::new(RenameOp { from, to, flags: 0, moved: moved_a, to_before: a_before })));
    fs::rename(f.p("tmpB"), f.p("dst")).unwrap();
    fs::rename(f.p("tmpA"), f.p("dst")).unwrap();
    let r = f.undo_sealed(false);
    assert!(r.complete, "{:?}", r.outcomes);
    assert_eq!(fs::read(f.p("dst")).unwrap(), b"original");
    assert!(!f.p("tmpA").exists() && !f.p("tmpB").exists(), "{:?}", r.outcomes);
    let b = r.outcomes.iter().position(|o| o.seq == Some(3)).unwrap();
    assert_eq!(code(&r, b), "already_as_before", "B's rename is not moved back: {:?}", r.outcomes);
}

#[test]
fn a_dry_run_knows_the_bytes_a_copy_then_a_truncation_leave_from_a_blob_or_a_pack() {
    // Newest first, the undo copies a capture back into f (13 bytes) and then truncates it to
    // an append's prior length (11): the oldest capture is then already what f holds, which
    // the dry run must see as the undo does, whether the copy is a blob or in a pack.
    for mut f in [Fixture::new(), Fixture::packing()] {
        fs::write(f.p("f"), b"0123456789\n").unwrap();
        f.change("f", Intent::Overwrite);
        fs::write(f.p("f"), b"0123456789\n").unwrap();
        f.change("f", Intent::Append);
        fs::write(f.p("f"), b"0123456789\nXY").unwrap();
        f.change("f", Intent::Overwrite);
        fs::write(f.p("f"), b"new").unwrap();
        let packed = matches!(node_of(&f, 2), crate::record::Node::Packed { size: 13, .. });
        assert_eq!(packed, f.packing);
        let plan = f.undo_sealed(true);
        let r = f.undo_sealed(false);
        // The same outcomes, causes and reasons: the oldest step finds f already as it was.
        let steps = |r: &Report| r.outcomes.iter().map(|o| (o.outcome, code_of(o), o.why.clone())).collect::<Vec<_>>();
        assert_eq!(steps(&plan), steps(&r), "the dry run predicts the undo (packed: {packed})");
        assert!(r.outcomes[2].why.starts_with("its contents were already as before"), "{:?}", r.outcomes);
        assert_eq!(fs::read(f.p("f")).unwrap(), b"0123456789\n");
    }
}

fn code_of(o: &StepReport) -> String {
    serde_json::to_value(&o.cause).unwrap()["code"].as_str().unwrap().to_string()
}

/// The node a journaled change kept, by its position.
fn node_of(f: &Fixture, i: usize) -> &crate::record::Node {
    match &f.records[i].op {
        Op::Change { before: Before::Contents(s), .. } => &s.node,
        other => panic!("not a kept change: {other:?}"),
    }
}

#[test]
fn small_copies_go_into_one_pack_and_are_put_back_from_it_exactly() {
    use crate::record::Node;
    let mut f = Fixture::packing();
    let big = vec![7u8; crate::pack::PACK_MAX as usize + 1];
    fs::write(f.p("a"), b"small a").unwrap();
    fs::write(f.p("b"), &big).unwrap();
    fs::write(f.p("c"), b"small c\n").unwrap();
    fs::set_permissions(f.p("c"), fs::Permissions::from_mode(0o600)).unwrap();
    for name in ["a", "b", "c"] {
        f.change(name, Intent::Truncate);
        fs::write(f.p(name), b"rewritten").unwrap();
    }
    let (Node::Packed { pack: pa, at: 0, size: 7, .. }, Node::Packed { pack: pc, at: 7, size: 8, .. }) =
        (node_of(&f, 0), node_of(&f, 2))
    else {
        panic!("a and c packed one after the other: {:?}", f.records)
    };
    assert_eq!(pa, pc, "one pack");
    assert!(matches!(node_of(&f, 1), Node::File { .. }), "a file over the limit gets a blob of its own");
    assert_eq!(f.blob_files().len(), 2, "the pack and b's blob");
    let plan = f.undo_sealed(true);
    let r = f.undo_sealed(false);
    let steps = |r: &Report| r.outcomes.iter().map(|o| (o.outcome, code_of(o), o.why.clone())).collect::<Vec<_>>();
    assert_eq!(steps(&plan), steps(&r), "the dry run predicts the undo");
    assert!(r.complete, "{:?}", r.outcomes);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"small a");
    assert_eq!(fs::read(f.p("b")).unwrap(), big);
    assert_eq!(fs::read(f.p("c")).unwrap(), b"small c\n");
    assert_eq!(fs::metadata(f.p("c")).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn packed_bytes_that_no_longer_match_their_hash_are_never_written_back() {
    let mut f = Fixture::packing();
    fs::write(f.p("a"), b"original a").unwrap();
    fs::write(f.p("c"), b"original c").unwrap();
    f.change("a", Intent::Overwrite);
    f.change("c", Intent::Overwrite);
    fs::write(f.p("a"), b"changed").unwrap();
    fs::write(f.p("c"), b"changed").unwrap();
    // a's bytes in the pack overwritten (the pack's length unchanged), c's left alone.
    let pack = f.blob_files().remove(0);
    let p = fs::OpenOptions::new().write(true).open(&pack).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&p, b"EVIL", 0).unwrap();
    let r = f.undo();
    assert!(!r.complete);
    let of = |name: &str| {
        r.outcomes
            .iter()
            .position(|o| o.path.as_ref().is_some_and(|p| p.as_bytes().ends_with(name.as_bytes())))
            .unwrap()
    };
    assert_eq!(r.outcomes[of("/a")].outcome, Outcome::Failed);
    assert_eq!(code(&r, of("/a")), "blob_damaged");
    assert_eq!(fs::read(f.p("a")).unwrap(), b"changed", "no unverified byte written back");
    assert_eq!(r.outcomes[of("/c")].outcome, Outcome::Restored);
    assert_eq!(fs::read(f.p("c")).unwrap(), b"original c");
    // The pack gone: each step that needs it says so.
    fs::write(f.p("c"), b"changed").unwrap();
    fs::remove_file(&pack).unwrap();
    let r = f.undo();
    assert_eq!(code(&r, of("/c")), "blob_missing", "{:?}", r.outcomes);
}

#[test]
fn removals_go_on_beside_the_steps_a_full_queue_waits_for_its_oldest_batch_only_and_every_step_is_printed_once() {
    // Two queues' worth of creations in one directory: the undo waits for every queued
    // removal only at its end (waiting for all of a full queue left the removal thread idle
    // while the queue was filled again), and the steps it prints as they end are each
    // printed once, the failed one never as removed.
    let mut f = Fixture::new();
    let n = super::remover::MAX_QUEUED * 2 + 500;
    for i in 0..n {
        let name = format!("f{i}");
        fs::write(f.p(&name), b"").unwrap();
        f.push(Op::Change { path: f.bp(&name), before: Before::Absent });
    }
    // A step whose removal fails: a non-empty directory stands at its name (it is then taken
    // in order, not queued).
    fs::remove_file(f.p("f5")).unwrap();
    fs::create_dir(f.p("f5")).unwrap();
    fs::write(f.p("f5/inside"), b"").unwrap();
    let j = JournalContents { records: f.records.clone(), ..Default::default() };
    let (opts, none) = (UndoOptions::default(), SeqSet::default());
    let plan = Plan {
        journal: &j,
        blobs_dir: &f.blobs,
        opts: &opts,
        seal: None,
        already: &none,
        undo_times: &Default::default(),
        only: None,
        earlier_undo: false,
    };
    super::remover::WAITED_FOR_ALL.with(|w| w.set(0));
    let mut printed: Vec<StepReport> = Vec::new();
    let r = super::execute::run_plan_streaming(&plan, &mut |_, _| {}, Some(&mut |s| printed.push(s))).unwrap();
    // (A directory is removed in order: f5's step waits for every removal before it.)
    let waited = super::remover::WAITED_FOR_ALL.with(|w| w.get());
    assert_eq!(waited, 2, "only f5's step and the end wait for every removal queued");
    printed.extend(r.outcomes.iter().cloned());
    assert_eq!(printed.len(), n, "each step once");
    let mut seqs: Vec<u64> = printed.iter().filter_map(|o| o.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), n);
    let f5: Vec<Outcome> = printed.iter().filter(|o| o.path.as_ref() == Some(&f.bp("f5"))).map(|o| o.outcome).collect();
    assert_eq!(f5, [Outcome::Failed]);
    assert!(!r.complete);
    let left: Vec<_> = fs::read_dir(&f.work).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["f5"]);
}
