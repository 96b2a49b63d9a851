//! The checker passes every history of a correct model and catches each kind of fault planted in
//! one: a skipped message, a delivery in the wrong view, two agreed messages swapped at one
//! receiver, a view installed without one of its members.

mod common;
use conclave_history::{check, Config, Event, Record, Service, Violation};
use proptest::prelude::*;

fn props(v: &[Violation]) -> Vec<&'static str> {
    let mut p: Vec<_> = v.iter().map(|v| v.property).collect();
    p.dedup();
    p
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn correct_histories_pass(seed in any::<u64>(), n in 2usize..7, steps in 10usize..250, vs in any::<bool>()) {
        let h = common::history(seed, n, steps, vs);
        let v = check(&h, &Config::default());
        prop_assert!(v.is_empty(), "{}", v.iter().map(|v| v.to_string()).collect::<String>());
    }
}

fn deliver_of(r: &Record) -> Option<(&str, &str, bool, Service)> {
    match &r.ev {
        Event::Deliver {
            msg,
            transitional,
            service,
            ..
        } => Some((r.p.as_str(), msg.as_str(), *transitional, *service)),
        _ => None,
    }
}

/// Index of `p`'s next view record after `i`.
fn next_view(h: &[Record], i: usize, p: &str) -> Option<usize> {
    (i + 1..h.len()).find(|j| h[*j].p == p && matches!(h[*j].ev, Event::View { .. }))
}

fn trans_of(r: &Record) -> &[String] {
    match &r.ev {
        Event::View { transitional, .. } => transitional,
        _ => &[],
    }
}

/// Seeds whose history has a place for the fault, with the faulty history.
fn mutated(fault: impl Fn(&[Record]) -> Option<Vec<Record>>) -> Vec<(u64, Vec<Record>)> {
    (0..300u64)
        .filter_map(|seed| {
            let h = common::history(seed, 4, 120, seed % 2 == 0);
            fault(&h).map(|m| (seed, m))
        })
        .take(25)
        .collect()
}

fn assert_caught(cases: Vec<(u64, Vec<Record>)>, expect: &[&str], what: &str) {
    assert!(
        cases.len() >= 10,
        "too few histories with a place for {what}"
    );
    for (seed, h) in cases {
        let v = check(&h, &Config::default());
        assert!(
            v.iter().any(|v| expect.contains(&v.property)),
            "{what} in seed {seed} not caught as {expect:?}; found {:?}",
            props(&v)
        );
    }
}

#[test]
fn a_skipped_message_is_caught() {
    let cases = mutated(|h| {
        // A regular delivery whose receiver moves on with another process that delivered it.
        (0..h.len()).find_map(|i| {
            let (p, m, trans, _) = deliver_of(&h[i])?;
            if trans {
                return None;
            }
            let nv = next_view(h, i, p)?;
            let witness = trans_of(&h[nv]).iter().any(|q| {
                q != p
                    && h.iter()
                        .any(|r| r.p == *q && deliver_of(r).is_some_and(|d| d.1 == m))
            });
            witness.then(|| {
                let mut out = h.to_vec();
                out.remove(i);
                out
            })
        })
    });
    assert_caught(
        cases,
        &["V1", "O3", "O4", "I3", "O1", "O2"],
        "a skipped message",
    );
}

#[test]
fn a_delivery_in_the_wrong_view_is_caught() {
    let cases = mutated(|h| {
        (0..h.len()).find_map(|i| {
            let (p, _, trans, _) = deliver_of(&h[i])?;
            if trans {
                return None;
            }
            let nv = next_view(h, i, p)?;
            let Event::View { view: new_view, .. } = &h[nv].ev else {
                unreachable!()
            };
            let mut out = h.to_vec();
            let mut moved = out.remove(i);
            if let Event::Deliver { view, .. } = &mut moved.ev {
                *view = new_view.clone();
            }
            out.insert(nv, moved);
            Some(out)
        })
    });
    assert_caught(cases, &["D1", "D2"], "a delivery in the wrong view");
}

#[test]
fn two_agreed_messages_swapped_at_one_receiver_are_caught() {
    let cases = mutated(|h| {
        (0..h.len()).find_map(|i| {
            let (p, m1, t1, s1) = deliver_of(&h[i])?;
            if t1 || !s1.at_least_agreed() {
                return None;
            }
            // The same receiver's next agreed delivery in the same regular view.
            let j = (i + 1..h.len()).find(|j| {
                h[*j].p == p
                    && (matches!(h[*j].ev, Event::View { .. } | Event::TransSignal { .. })
                        || deliver_of(&h[*j]).is_some_and(|d| d.3.at_least_agreed()))
            })?;
            let (_, m2, t2, _) = deliver_of(&h[j])?;
            if t2 {
                return None;
            }
            // Someone else delivered both.
            let other = h
                .iter()
                .any(|r| r.p != p && deliver_of(r).is_some_and(|d| d.1 == m1))
                && h.iter()
                    .any(|r| r.p != p && deliver_of(r).is_some_and(|d| d.1 == m2));
            other.then(|| {
                let mut out = h.to_vec();
                let (ti, tj) = (out[i].t, out[j].t);
                out.swap(i, j);
                out[i].t = ti;
                out[j].t = tj;
                out
            })
        })
    });
    assert_caught(cases, &["O3"], "two swapped agreed messages");
}

#[test]
fn a_view_without_one_of_its_members_is_caught() {
    let cases = mutated(|h| {
        (0..h.len()).find_map(|i| {
            let Event::View { view, members, .. } = &h[i].ev else {
                return None;
            };
            if members.len() < 2 {
                return None;
            }
            let shared = h
                .iter()
                .enumerate()
                .any(|(j, r)| j != i && matches!(&r.ev, Event::View { view: v, .. } if v == view));
            let victim = members.iter().find(|m| **m != h[i].p)?.clone();
            shared.then(|| {
                let mut out = h.to_vec();
                if let Event::View { members, .. } = &mut out[i].ev {
                    members.retain(|m| *m != victim);
                }
                out
            })
        })
    });
    assert_caught(cases, &["M4"], "a view without a member");
}

#[test]
fn a_violation_names_its_property_and_shows_the_lines() {
    let mut h = common::history(3, 3, 60, false);
    let i = h.iter().position(|r| deliver_of(r).is_some()).unwrap();
    let dup = h[i].clone();
    h.insert(i + 1, dup);
    let v = check(&h, &Config::default());
    let i2 = v
        .iter()
        .find(|v| v.property == "I2")
        .expect("a duplicate delivery is I2");
    assert!(i2.excerpt.len() == 2 && i2.excerpt.iter().all(|l| l.contains("\"deliver\"")));
    assert!(i2.to_string().starts_with("I2: "));
}

fn line(t: u64, p: &str, ev: &str) -> String {
    format!(r#"{{"t":{t},"p":"{p}",{ev}}}"#)
}

/// Three members in one view; `body` follows.
fn three(body: &[String]) -> Vec<Record> {
    let mut l = Vec::new();
    for p in ["c1", "c2", "c3"] {
        l.push(line(1, p, r#""ev":"view","group":"g","view":[1,"c1"],"members":["c1","c2","c3"],"transitional":["PP"]"#.replace("PP", p).as_str()));
    }
    l.extend_from_slice(body);
    let text = l.join("\n");
    conclave_history::record::read(text.as_bytes()).unwrap()
}

fn send(t: u64, p: &str, m: &str, service: &str) -> String {
    line(
        t,
        p,
        &format!(
            r#""ev":"send","group":"g","msg":"{m}","service":"{service}","view":[1,"c1"],"payload":"{m}""#
        ),
    )
}
fn deliver(t: u64, p: &str, m: &str, from: &str, service: &str) -> String {
    line(
        t,
        p,
        &format!(
            r#""ev":"deliver","group":"g","msg":"{m}","sender":"{from}","service":"{service}","view":[1,"c1"],"transitional":false,"payload":"{m}""#
        ),
    )
}

#[test]
fn a_causal_order_violation_is_o2_and_a_fifo_one_is_o1() {
    // c2 delivers m1 from c1, then sends m2: m1 precedes m2. c3 delivers m2 first.
    let h = three(&[
        send(2, "c1", "m1", "causal"),
        deliver(3, "c1", "m1", "c1", "causal"),
        deliver(4, "c2", "m1", "c1", "causal"),
        send(5, "c2", "m2", "causal"),
        deliver(6, "c2", "m2", "c2", "causal"),
        deliver(7, "c1", "m2", "c2", "causal"),
        deliver(8, "c3", "m2", "c2", "causal"),
        deliver(9, "c3", "m1", "c1", "causal"),
    ]);
    let v = check(&h, &Config::default());
    assert!(props(&v).contains(&"O2"), "{:?}", props(&v));
    // c1 sends a then b, FIFO; c2 delivers b then a.
    let h = three(&[
        send(2, "c1", "a", "fifo"),
        send(3, "c1", "b", "fifo"),
        deliver(4, "c1", "a", "c1", "fifo"),
        deliver(5, "c1", "b", "c1", "fifo"),
        deliver(6, "c2", "b", "c1", "fifo"),
        deliver(7, "c2", "a", "c1", "fifo"),
    ]);
    let v = check(&h, &Config::default());
    assert!(props(&v).contains(&"O1"), "{:?}", props(&v));
    // And in the right order, neither.
    let h = three(&[
        send(2, "c1", "a", "fifo"),
        send(3, "c1", "b", "fifo"),
        deliver(4, "c1", "a", "c1", "fifo"),
        deliver(5, "c1", "b", "c1", "fifo"),
        deliver(6, "c2", "a", "c1", "fifo"),
        deliver(7, "c2", "b", "c1", "fifo"),
    ]);
    let v = check(&h, &Config::default());
    assert!(!props(&v).contains(&"O1"), "{:?}", props(&v));
}

#[test]
fn a_datagram_an_attacker_made_that_reached_a_core_is_caught() {
    let refused = three(&[line(
        2,
        "d1",
        r#""inc":1,"ev":"hostile","kind":"replay","taken":0"#,
    )]);
    assert!(check(&refused, &Config::default()).is_empty());
    let taken = three(&[line(
        2,
        "d1",
        r#""inc":1,"ev":"hostile","kind":"forged","taken":2"#,
    )]);
    assert_eq!(props(&check(&taken, &Config::default())), ["S-link"]);
}
