//! Fuzzes the journal reader: any bytes at all must parse into records, problems and a torn
//! tail without panicking, and every problem must describe itself.
#![no_main]

use aether_journal::journal::parse_journal;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let j = parse_journal(data);
    for p in &j.problems {
        let _ = p.describe();
    }
    let _ = j.torn_tail_message();
    // Records that parse must serialise again.
    for r in &j.records {
        let _ = aether_journal::journal::encode_line(r);
    }
});
