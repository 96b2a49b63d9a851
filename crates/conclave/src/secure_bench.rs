//! `conclave bench secure`, experiment E2 (paper 000 §6, thesis 004 §4): the time from a
//! membership event (join, leave, partition, merge) to the new *secure* view at every member,
//! Time_max (the last member) and Time_avg, per key agreement protocol, over real daemons on
//! this machine. It adds to the daemons' own view change (`conclave bench membership`) the
//! key agreement's rounds and computation.

use crate::net_bench::{partition, statuses, EventPlan, Network};
use crate::secure_cmd::parse_protocol;
use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_bench::plot::{Chart, Series};
use conclave_client::secure::{
    SecureClient, SecureConfig, SecureEvent, SecureReceiver, SecureSender,
};
use conclave_client::Client;
use conclave_crypto::{Identity, SigScheme};
use conclave_gka::{Directory, ProtocolId};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const GROUP: &str = "secure-bench";

#[derive(Args)]
pub struct SecureArgs {
    /// Numbers of daemons to run.
    #[arg(long, value_delimiter = ',', default_value = "3")]
    daemons: Vec<usize>,
    /// Numbers of members (spread over the daemons).
    #[arg(long, value_delimiter = ',', default_value = "2,10,25,50")]
    clients: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "gdh,ckd,tgdh,str,bd")]
    protocols: Vec<String>,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "join,leave,partition,merge"
    )]
    events: Vec<String>,
    /// Repetitions of each event.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

pub fn run(args: SecureArgs) -> Result<()> {
    let protocols: Vec<ProtocolId> = args
        .protocols
        .iter()
        .map(|p| parse_protocol(p))
        .collect::<Result<_>>()?;
    for e in &args.events {
        if !["join", "leave", "partition", "merge"].contains(&e.as_str()) {
            bail!("unknown event {e:?} (join, leave, partition, merge)");
        }
    }
    if args.clients.iter().any(|k| *k < 2) {
        bail!("a group needs at least 2 members here");
    }
    std::fs::create_dir_all(&args.out)?;
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        for &d in &args.daemons {
            let net = Network::start(d).await?;
            for &p in &protocols {
                for &k in &args.clients {
                    for event in &args.events {
                        let row = match secure_once(&net, p, k, event, args.repeat).await {
                            Ok(row) => row,
                            Err(e) => json!({
                                "bench": "secure", "daemons": d, "protocol": format!("{p:?}"),
                                "members": k, "event": event, "error": format!("{e:#}"),
                            }),
                        };
                        println!("{row}");
                        let failed = row.get("error").is_some();
                        rows.push(row);
                        if failed {
                            // The network's state is unknown: start it again.
                            net.wait_ring(d).await?;
                        }
                    }
                }
            }
            net.stop().await?;
        }
        anyhow::Ok(rows)
    })?;
    for event in &args.events {
        let mut series = Vec::new();
        for &p in &protocols {
            for &d in &args.daemons {
                series.push(Series {
                    name: format!("{p:?}, {d} daemons"),
                    points: rows
                        .iter()
                        .filter(|r| {
                            r["event"] == event.as_str()
                                && r["daemons"] == d
                                && r["protocol"] == format!("{p:?}")
                        })
                        .filter_map(|r| Some((r["members"].as_f64()?, r["time_max_ms"].as_f64()?)))
                        .collect(),
                });
            }
        }
        let chart = Chart {
            title: format!(
                "Secure {event}: time to the new secure view at every member (Time_max)"
            ),
            x_label: "members".into(),
            y_label: "milliseconds".into(),
            log_y: true,
            series,
        };
        std::fs::write(args.out.join(format!("secure-{event}.svg")), chart.to_svg())?;
    }
    Ok(())
}

/// Fresh identities for `names`, and a directory naming them all.
fn identities(names: &[String]) -> Result<(Vec<Identity>, Directory)> {
    let mut dir = Directory::new();
    let mut ids = Vec::new();
    for n in names {
        let id = Identity::generate(SigScheme::Ed25519, &mut rand_core::OsRng)?;
        dir.insert(n.clone(), id.public());
        ids.push(id);
    }
    Ok((ids, dir))
}

async fn secure_member(
    net: &Network,
    i: usize,
    name: &str,
    id: Identity,
    dir: Directory,
    protocol: ProtocolId,
) -> Result<(SecureSender, SecureReceiver)> {
    let c = Client::connect(&net.address(i), name).await?;
    let (mut tx, rx) = SecureClient::new(c, id, dir).split();
    let cfg = SecureConfig {
        protocol,
        ..SecureConfig::default()
    };
    tx.join_secure(GROUP, cfg).await?;
    Ok((tx, rx))
}

async fn wait_secure_view(r: &mut SecureReceiver, size: usize) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let ev = tokio::time::timeout_at(deadline, r.receive())
            .await
            .with_context(|| format!("no secure view of {size} in 30 s (seen: {seen:?})"))??;
        match ev {
            SecureEvent::View(v) if v.members.len() == size => return Ok(()),
            SecureEvent::View(v) => seen.push(v.members.len()),
            SecureEvent::Refused { error, .. } => bail!("refused: {error}"),
            _ => {}
        }
    }
}

async fn secure_once(
    net: &Network,
    protocol: ProtocolId,
    k: usize,
    event: &str,
    repeat: usize,
) -> Result<serde_json::Value> {
    let n = net.daemons.len();
    let (mut maxes, mut avgs) = (Vec::new(), Vec::new());
    for rep in 0..repeat {
        let tag = format!("s{:?}{k}{event}{rep}-", protocol).to_lowercase();
        let names: Vec<String> = (0..=k).map(|i| format!("{tag}{i}")).collect();
        let (ids, dir) = identities(&names)?;
        let mut members = Vec::new();
        for i in 0..k {
            members.push(
                secure_member(net, i, &names[i], ids[i].clone(), dir.clone(), protocol).await?,
            );
        }
        for (i, (_, r)) in members.iter_mut().enumerate() {
            if let Err(e) = wait_secure_view(r, k).await {
                bail!("member {i} of {k}: {e:#} ({})", statuses(net).await);
            }
        }
        let (mut senders, mut receivers): (Vec<_>, Vec<_>) = members.into_iter().unzip();
        let EventPlan { sides, watch, size } = EventPlan::new(n, k, event);
        if event == "merge" {
            partition(net, true).await?;
            for (i, r) in receivers.iter_mut().enumerate() {
                if let Err(e) = wait_secure_view(r, sides[i]).await {
                    bail!("member {i}'s side of the partition: {e:#}");
                }
            }
        }
        let t0 = Instant::now();
        let mut extra = None;
        match event {
            "join" => {
                extra = Some(
                    secure_member(net, k, &names[k], ids[k].clone(), dir.clone(), protocol).await?,
                );
            }
            "leave" => {
                let mut s = senders.pop().context("a member")?;
                receivers.pop();
                s.leave(GROUP).await?;
                senders.push(s);
            }
            "partition" => partition(net, true).await?,
            _ => partition(net, false).await?,
        }
        let mut times = Vec::new();
        for (&i, &want) in watch.iter().zip(&size) {
            if let Err(e) = wait_secure_view(&mut receivers[i], want).await {
                bail!(
                    "{event} with {k} members: member {i}: {e:#} ({})",
                    statuses(net).await
                );
            }
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        maxes.push(times.iter().cloned().fold(0.0, f64::max));
        avgs.push(times.iter().sum::<f64>() / times.len() as f64);
        if event == "partition" {
            partition(net, false).await?;
            net.wait_ring(n).await?;
        }
        if let Some((s, _)) = extra {
            let _ = s.disconnect().await;
        }
        for s in senders {
            let _ = s.disconnect().await;
        }
        net.wait_ring(n).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let round = |x: f64| (x * 100.0).round() / 100.0;
    Ok(json!({
        "bench": "secure", "daemons": n, "protocol": format!("{protocol:?}"), "members": k,
        "event": event, "repeat": repeat,
        "time_max_ms": round(mean(&maxes)), "time_avg_ms": round(mean(&avgs)),
        "time_max_worst_ms": round(maxes.iter().cloned().fold(0.0, f64::max)),
    }))
}
