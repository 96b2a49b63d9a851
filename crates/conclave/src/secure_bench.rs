//! `conclave bench secure`, experiment E2 (paper 000 §6, thesis 004 §4): the time from a
//! membership event (join, leave, partition, merge) to the new *secure* view at every member,
//! Time_max (the last member) and Time_avg, per key agreement protocol, over real daemons on
//! this machine. It adds to the daemons' own view change (`conclave bench membership`) the
//! key agreement's rounds and computation.

use crate::net_bench::Network;
use crate::secure_cmd::parse_protocol;
use crate::view_timing::{time_events, Members, Seen};
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
use std::time::Duration;

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

/// Secure members of one protocol, with identities the directory names.
pub(crate) struct Secure {
    protocol: ProtocolId,
    directory: Directory,
    identities: Vec<(String, Identity)>,
}

impl Secure {
    /// Identities for the `names` of the timed events.
    pub(crate) fn new(protocol: ProtocolId, names: &[String]) -> Result<Secure> {
        let mut directory = Directory::new();
        let mut identities = Vec::new();
        for n in names {
            let id = Identity::generate(SigScheme::Ed25519, &mut rand_core::OsRng)?;
            directory.insert(n.clone(), id.public());
            identities.push((n.clone(), id));
        }
        Ok(Secure {
            protocol,
            directory,
            identities,
        })
    }
}

impl Members for Secure {
    type Tx = SecureSender;
    type Rx = SecureReceiver;
    // The task that drives the group writes out what has been queued in batches of its own.
    const BATCH: u64 = 1;
    async fn add(
        &mut self,
        net: &Network,
        i: usize,
        name: &str,
    ) -> Result<(SecureSender, SecureReceiver)> {
        let id = self
            .identities
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| id.clone())
            .context("an identity for every member")?;
        let c = Client::connect(&net.address(i), name).await?;
        let (mut tx, rx) = SecureClient::new(c, id, self.directory.clone()).split();
        let cfg = SecureConfig {
            protocol: self.protocol,
            ..SecureConfig::default()
        };
        tx.join_secure(GROUP, cfg).await?;
        Ok((tx, rx))
    }

    async fn wait(r: &mut SecureReceiver, size: usize) -> Result<()> {
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

    async fn leave(tx: &mut SecureSender) -> Result<()> {
        Ok(tx.leave(GROUP).await?)
    }

    async fn close(tx: SecureSender) {
        let _ = tx.disconnect().await;
    }

    async fn next(rx: &mut SecureReceiver) -> Option<Seen> {
        Some(match rx.receive().await.ok()? {
            SecureEvent::Message { .. } => Seen::Message,
            SecureEvent::View(_) => Seen::View,
            _ => Seen::Other,
        })
    }

    async fn send(
        tx: &mut SecureSender,
        service: conclave_client::ServiceType,
        payload: &[u8],
    ) -> Result<()> {
        Ok(tx.queue(GROUP, service, payload).await?)
    }

    async fn flush(_: &mut SecureSender) {}
}

async fn secure_once(
    net: &Network,
    protocol: ProtocolId,
    k: usize,
    event: &str,
    repeat: usize,
) -> Result<serde_json::Value> {
    let tag = format!("s{protocol:?}{k}{event}").to_lowercase();
    // Every name the timed events give (`{tag}{rep}-{i}`, the joiner included).
    let names: Vec<String> = (0..repeat)
        .flat_map(|rep| {
            let tag = &tag;
            (0..=k).map(move |i| format!("{tag}{rep}-{i}"))
        })
        .collect();
    let mut m = Secure::new(protocol, &names)?;
    let mut row = time_events(net, &mut m, k, event, repeat, &tag).await?;
    row["bench"] = json!("secure");
    row["protocol"] = json!(format!("{protocol:?}"));
    row["members"] = json!(k);
    Ok(row)
}
