//! The history reader (`conclave check`'s input) never panics, and what it reads, written back,
//! reads as the same records.
#![no_main]
use conclave_history::record::{read, write};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = read(data) {
        let mut out = Vec::new();
        write(&records, &mut out).expect("writing to memory");
        assert_eq!(read(&out[..]).expect("a written history reads"), records);
    }
});
