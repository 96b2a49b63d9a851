//! Replays one event's critical path over and over, each member on it alone (what `bench gka`
//! times once per row), so that a profiler attached to the process sees only the replays:
//!
//! ```sh
//! cargo run --release -p conclave-bench --example replay_event -- tgdh join 1024 10
//! perf record --call-graph dwarf -p PID   # PID and "replaying" are printed once the group is formed
//! ```
//!
//! Arguments: protocol (gdh, ckd, tgdh, str, bd), event (join, leave, merge, partition), group
//! size, seconds of replays. It prints the replays' median and fastest time. Each replay's copy of
//! the members' state is made outside the timed part but inside the loop, so a profile shows it
//! too (`KeyAgreement::own_copy`); filter on `Input::apply` to leave it out.

#[global_allocator]
static ALLOC: conclave_bench::alloc::Counting = conclave_bench::alloc::Counting;

use conclave_crypto::{Ristretto255, SigScheme};
use conclave_gka::script::parse;
use conclave_gka::testbed::Testbed;
use conclave_gka::ProtocolId;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: replay_event PROTOCOL EVENT N SECONDS";
    let [protocol, event, n, secs] = &args[..] else {
        return Err(usage.into());
    };
    let p = ProtocolId::ALL
        .into_iter()
        .find(|p| format!("{p:?}").eq_ignore_ascii_case(protocol))
        .ok_or(usage)?;
    let n: usize = n.parse().map_err(|_| usage)?;
    let secs: f64 = secs.parse().map_err(|_| usage)?;
    if n < 4 {
        return Err("the group needs at least 4 members".into());
    }
    let names: Vec<String> = (0..n).map(|i| format!("m{i:04}")).collect();
    let second_half = names[n - n / 2..].join(" ");
    let script = match event.as_str() {
        "join" => "join x".to_owned(),
        "leave" => format!("leave {}", names[n / 2]),
        "merge" | "partition" => format!("{event} {second_half}"),
        _ => return Err(usage.into()),
    };
    let run = |tb: &mut Testbed<Ristretto255>, s: &str| {
        tb.run_script(&parse(s).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())
    };
    let mut tb = Testbed::<Ristretto255>::new(p, SigScheme::Ed25519, 5);
    // Forming the group is no part of what is replayed: its members share their verifications
    // and both cores, as in `bench gka`.
    tb.share_verifications(true);
    tb.parallel = true;
    run(&mut tb, &format!("init {}", names.join(" ")))?;
    if event == "merge" {
        run(&mut tb, &format!("partition {second_half}"))?;
    }
    let before = tb.records.len();
    tb.record();
    run(&mut tb, &script)?;
    let view = tb.records[before..]
        .iter()
        .rev()
        .find(|r| r.members.iter().any(|m| m == "m0000"))
        .ok_or("the event's view did not complete")?
        .view;
    eprintln!("replaying, pid {}", std::process::id());
    let start = std::time::Instant::now();
    let mut times = Vec::new();
    while times.is_empty() || start.elapsed().as_secs_f64() < secs {
        times.push(tb.replay_alone(view).ok_or("nothing to replay")?);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{} replays of {protocol} {event} at n = {n}: median {:.1} us, fastest {:.1} us",
        times.len(),
        times[times.len() / 2],
        times[0]
    );
    Ok(())
}
