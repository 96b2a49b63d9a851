//! Whole-member fuzzing: a member of each protocol, mid-run, fed arbitrary bytes from a member of
//! its view. It must answer with a typed error or a valid step, never panic.
#![no_main]
use conclave_crypto::{Ristretto255, SigScheme};
use conclave_gka::script::parse;
use conclave_gka::testbed::Testbed;
use conclave_gka::ProtocolId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let p = [
        ProtocolId::Gdh,
        ProtocolId::Ckd,
        ProtocolId::Tgdh,
        ProtocolId::Str,
        ProtocolId::Bd,
    ][sel as usize % 5];
    let mut tb = Testbed::<Ristretto255>::new(p, SigScheme::Ed25519, 1);
    tb.measure_time = false;
    tb.run_script(&parse("init a b c\n+1 join d\n").unwrap())
        .unwrap();
    tb.apply(&parse("leave b").unwrap()[0].action).unwrap();
    let _ = tb.inject("a", "c", bytes);
    tb.run_until_quiet();
});
