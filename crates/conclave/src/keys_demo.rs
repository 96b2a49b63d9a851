//! `conclave demo --keys`: the key agreement story in one process. A group forms, a member joins,
//! one leaves, the network partitions and heals; at each step every member's key fingerprint is
//! shown, so one can see that members agree and that every view gets a fresh key.

use crate::gka_cmd::ProtocolArg;
use anyhow::Result;
use clap::Args;
use conclave_crypto::{Ristretto255, SigScheme};
use conclave_gka::script::parse;
use conclave_gka::testbed::Testbed;
use conclave_gka::ProtocolId;
use std::collections::BTreeSet;

#[derive(Args)]
pub struct KeyDemoArgs {
    /// The key agreement protocol.
    #[arg(long, value_enum, default_value = "tgdh")]
    protocol: ProtocolArg,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

const STORY: &[(&str, &str)] = &[
    (
        "init alice bob carol dave",
        "alice, bob, carol and dave form the group",
    ),
    ("join erin", "erin joins"),
    (
        "leave bob",
        "bob leaves: he must not read anything from now on",
    ),
    (
        "partition carol dave",
        "the network splits: carol and dave are cut off, each side goes on",
    ),
    ("merge carol dave", "the network heals: the two sides merge"),
    (
        "join frank\n+1 leave alice",
        "frank joins, and alice leaves before that join's key agreement is over (a cascaded \
         event: the join's run is abandoned and the newest view gets the key)",
    ),
];

pub fn run(args: KeyDemoArgs) -> Result<()> {
    let p: ProtocolId = args.protocol.into();
    println!("Conclave demo: group key agreement with {p:?} over ristretto255 and Ed25519\n");
    let mut tb = Testbed::<Ristretto255>::new(p, SigScheme::Ed25519, args.seed);
    tb.measure_time = false;
    let mut shown = 0;
    let mut keys_seen = BTreeSet::new();
    for (line, what) in STORY {
        println!("> {what}");
        tb.run_script(&parse(line)?)?;
        for r in &tb.records[shown..] {
            let fps: BTreeSet<&String> = r.keys.values().collect();
            let agree = if fps.len() == 1 {
                "all agree"
            } else {
                "DISAGREE"
            };
            let fresh = fps.iter().all(|f| keys_seen.insert((*f).clone()));
            println!(
                "  view {:>2} {:<9} {} members, {} messages, {} rounds: {agree}, {}",
                r.view,
                r.event,
                r.members.len(),
                r.messages,
                r.rounds,
                if fresh { "new key" } else { "KEY REUSED" }
            );
            for (m, fp) in &r.keys {
                println!("      {m:<6} key {fp}");
            }
        }
        shown = tb.records.len();
    }
    // Members that left never hold a later key.
    for gone in ["bob", "alice"] {
        let last = tb
            .key_log
            .iter()
            .filter(|(m, _)| m == gone)
            .map(|(_, k)| k.view_id)
            .max()
            // The testbed's view numbers are the indexes on its one ring.
            .map(|id| id.index);
        println!(
            "  {gone} left; the last key {gone} ever held is view {}'s",
            last.unwrap_or(0)
        );
    }
    let stuck = tb.stuck();
    println!(
        "\nEvery view got a fresh key that exactly its members hold; stuck members: {}",
        if stuck.is_empty() {
            "none".into()
        } else {
            stuck.join(", ")
        }
    );
    if !tb.errors.is_empty() || !stuck.is_empty() {
        anyhow::bail!("the demo went wrong: {:?}", tb.errors);
    }
    Ok(())
}
