//! Shared helpers: run a script against a protocol and check the properties every run must have.

#![allow(dead_code)]

use conclave_crypto::{Ristretto255, SigScheme};
use conclave_gka::script::{parse, Action, Step};
use conclave_gka::testbed::{Testbed, ViewRecord};
use conclave_gka::ProtocolId;
use std::collections::{BTreeMap, BTreeSet};

pub const ALL: [ProtocolId; 5] = ProtocolId::ALL;

pub fn testbed(p: ProtocolId, seed: u64) -> Testbed<Ristretto255> {
    let mut tb = Testbed::<Ristretto255>::new(p, SigScheme::Ed25519, seed);
    tb.measure_time = false;
    tb
}

/// Runs `script` and checks: no protocol error, nobody stuck, every member of each completed view
/// holds the same key, keys (and raw secrets) are never reused across views, and the final
/// component views all completed.
pub fn run(p: ProtocolId, script: &str, seed: u64) -> Testbed<Ristretto255> {
    let steps = parse(script).expect("script parses");
    let mut tb = testbed(p, seed);
    if let Err(e) = tb.run_script(&steps) {
        panic!("{p:?} script failed: {e}\n{script}");
    }
    check(p, &tb, script);
    tb
}

pub fn check(p: ProtocolId, tb: &Testbed<Ristretto255>, what: &str) {
    assert!(
        tb.errors.is_empty(),
        "{p:?} {what}: protocol errors {:?}",
        tb.errors
    );
    assert!(
        tb.stuck().is_empty(),
        "{p:?} {what}: stuck members {:?}",
        tb.stuck()
    );
    let mut seen_keys = BTreeMap::new();
    let mut seen_secrets = BTreeMap::new();
    for r in &tb.records {
        let fps: BTreeSet<&String> = r.keys.values().collect();
        assert_eq!(
            fps.len(),
            1,
            "{p:?} {what}: view {} members disagree: {:?}",
            r.view,
            r.keys
        );
        let secrets: BTreeSet<_> = r.secret_fingerprints.values().collect();
        assert_eq!(
            secrets.len(),
            1,
            "{p:?} {what}: view {} raw secrets disagree",
            r.view
        );
        let fp = fps.into_iter().next().unwrap().clone();
        if let Some(v) = seen_keys.insert(fp, r.view) {
            panic!("{p:?} {what}: views {v} and {} share a key", r.view);
        }
        let s = *secrets.into_iter().next().unwrap();
        if let Some(v) = seen_secrets.insert(s, r.view) {
            panic!("{p:?} {what}: views {v} and {} share a raw secret", r.view);
        }
    }
    // Every current component view has completed.
    for (view, members) in tb.components() {
        let rec = tb.records.iter().find(|r| r.view == *view);
        let rec = rec.unwrap_or_else(|| {
            panic!("{p:?} {what}: final view {view} {members:?} never completed")
        });
        assert_eq!(&rec.members, members);
    }
    // Nobody ever holds the key of a view it is not a member of.
    for (m, k) in &tb.key_log {
        assert!(
            k.members.contains(m),
            "{p:?} {what}: {m} got the key of view {:?} {:?}",
            k.view_id,
            k.members
        );
    }
    // A key is held only by members of its view: no outsider's log shows that key.
    let by_fp: BTreeMap<String, &ViewRecord> = tb
        .records
        .iter()
        .map(|r| (r.keys.values().next().unwrap().clone(), r))
        .collect();
    for (m, k) in &tb.key_log {
        if let Some(r) = by_fp.get(&k.key.fingerprint().to_string()) {
            assert!(
                r.members.contains(m),
                "{p:?} {what}: outsider {m} holds the key of view {}",
                r.view
            );
        }
    }
}

pub fn last(tb: &Testbed<Ristretto255>) -> &ViewRecord {
    tb.records.last().expect("some view completed")
}

pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

pub fn init_script(n: usize) -> String {
    format!("init {}\n", names("m", n).join(" "))
}

pub fn steps(s: &str) -> Vec<Step> {
    parse(s).unwrap()
}

pub fn action(s: &str) -> Action {
    parse(s).unwrap().remove(0).action
}
