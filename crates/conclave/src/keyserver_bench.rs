//! `conclave bench keyserver`: experiment E5 over real daemons (docs/keygraph.md). The daemons
//! run in this process; a key server (`KeyServerNode`, as `conclave keyserver` runs it) and `n`
//! members of a key-graph group connect to them as clients, each member a `SecureClient` in the
//! key-graph mode. Measured: the time from one member's leave to the new key at every member
//! (Time_max, Time_avg), and from a batch of joins and leaves to the key that follows it at every
//! member; the server's computation and bytes for each rekey.

use crate::net_bench::Network;
use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_client::secure::{KeySource, SecureClient, SecureConfig, SecureEvent, SecureSender};
use conclave_client::ClientError;
use conclave_crypto::Identity;
use conclave_gka::Directory;
use conclave_secure::{KeyServerConfig, KeyServerEvent, KeyServerNode, KeyServerOutput};
use serde_json::json;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const GROUP: &str = "feed";

#[derive(Args)]
pub struct KeyserverArgs {
    /// Daemons to run.
    #[arg(long, default_value_t = 5)]
    daemons: usize,
    /// Group sizes (members besides the server, spread over the daemons).
    #[arg(long, value_delimiter = ',', default_value = "100,500")]
    members: Vec<usize>,
    /// Changes in the batch: half joins, half leaves, all at once (the server rekeys each view
    /// the daemons deliver; concurrent changes come in few views).
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Leaves timed per size (the median is reported, with the spread).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

/// A member's secure view as it saw it: which member, how many holders, when.
struct Keyed {
    member: usize,
    holders: usize,
    at: Instant,
}

/// What the server did in one call of its node, and how long the call took.
struct Served {
    events: Vec<KeyServerEvent>,
    busy: Duration,
}

pub fn run(args: KeyserverArgs) -> Result<()> {
    if args.daemons == 0 || args.members.iter().any(|n| *n < 2) {
        bail!("one daemon and two members at least");
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        for &n in &args.members {
            let row = match one_size(&args, n).await {
                Ok(row) => row,
                Err(e) => json!({"bench": "keyserver", "members": n, "error": format!("{e:#}")}),
            };
            println!("{row}");
        }
        Ok(())
    })
}

/// The daemons with room for `clients` clients.
async fn network(daemons: usize, clients: usize) -> Result<Network> {
    let mut cfg = conclave_daemon::Config::local_on_free_ports(daemons)?;
    let per = clients / daemons + 8;
    cfg.core.max_clients = cfg.core.max_clients.max(per);
    Network::start_with(cfg).await
}

async fn one_size(args: &KeyserverArgs, n: usize) -> Result<serde_json::Value> {
    let extra = args.batch / 2;
    let total = n + extra;
    let net = network(args.daemons, total + 1).await?;
    let mut rng = rand_core::OsRng;
    let mut directory = Directory::new();
    let server_id = Identity::generate(conclave_crypto::SigScheme::Ed25519, &mut rng)?;
    directory.insert("ks".into(), server_id.public());
    let ids: Vec<Identity> = (0..total)
        .map(|_| Identity::generate(conclave_crypto::SigScheme::Ed25519, &mut rng))
        .collect::<Result<_, _>>()?;
    for (i, id) in ids.iter().enumerate() {
        directory.insert(format!("m{i}"), id.public());
    }
    let directory = Arc::new(RwLock::new(directory));
    let (served_tx, mut served) = mpsc::unbounded_channel();
    let server = {
        let client = net.connect(0, "ks").await?;
        let mut cfg = KeyServerConfig::new(GROUP, client.name());
        cfg.batch_ms = 0;
        let node = KeyServerNode::new(
            cfg,
            server_id,
            directory.clone(),
            Box::new(rand_core::OsRng),
        )?;
        let (tx, rx) = client.split();
        tokio::spawn(serve(node, tx, rx, served_tx))
    };
    let server_name = format!("ks#{}", net.cfg.daemon[0].name);
    let (keyed_tx, mut keyed) = mpsc::unbounded_channel();
    let plain: Directory = directory.read().expect("not poisoned").clone();
    let mut senders: Vec<Option<SecureSender>> = Vec::new();
    let t_form = Instant::now();
    for (i, id) in ids.iter().enumerate().take(n) {
        senders.push(Some(
            member(&net, i, id, &plain, &server_name, keyed_tx.clone()).await?,
        ));
    }
    // Everyone keyed with the whole group (and the server).
    wait_all(
        &mut keyed,
        n,
        n + 1,
        Duration::from_secs(60 + n as u64 / 10),
    )
    .await?;
    let formed_s = t_form.elapsed().as_secs_f64();
    drain(&mut served);

    // One leave at a time: to the new key at every remaining member.
    let mut leaves = Vec::new();
    let mut size = n;
    for _ in 0..args.repeat.min(n - 2) {
        let who = size - 1;
        let t0 = Instant::now();
        if let Some(mut s) = senders[who].take() {
            s.leave(GROUP).await?;
            s.disconnect().await.ok();
        }
        size -= 1;
        let (max, avg) = time_to(&mut keyed, size, size + 1, t0).await?;
        let rekey = rekeys(&mut served);
        leaves.push((max, avg, rekey));
    }
    leaves.sort_by(|a, b| a.0.total_cmp(&b.0));
    let median = &leaves[leaves.len() / 2];

    // A batch: `extra` joins and as many leaves at once, folded by the server's batch interval.
    let t0 = Instant::now();
    let mut gone = 0;
    for s in senders.iter_mut().rev().flatten().take(extra) {
        s.leave(GROUP).await?;
        gone += 1;
    }
    for (i, id) in ids.iter().enumerate().skip(n).take(extra) {
        senders.push(Some(
            member(&net, i, id, &plain, &server_name, keyed_tx.clone()).await?,
        ));
    }
    let after = size - gone + extra;
    let (batch_max, batch_avg) = time_to(&mut keyed, after, after + 1, t0).await?;
    let batch_rekeys = rekeys(&mut served);
    server.abort();
    drop(senders);
    net.stop().await.ok();
    Ok(json!({
        "bench": "keyserver", "daemons": args.daemons, "members": n, "formed_s": formed_s,
        "leave": {"time_max_ms": median.0, "time_avg_ms": median.1,
                  "all_max_ms": leaves.iter().map(|l| l.0).collect::<Vec<_>>(),
                  "server": median.2},
        "batch": {"joins": extra, "leaves": gone, "time_max_ms": batch_max,
                  "time_avg_ms": batch_avg, "server": batch_rekeys},
    }))
}

/// Member `i` connects, joins the key-graph group, and reports each secure view it gets.
async fn member(
    net: &Network,
    i: usize,
    id: &Identity,
    directory: &Directory,
    server: &str,
    keyed: mpsc::UnboundedSender<Keyed>,
) -> Result<SecureSender> {
    let c = net.connect(i, &format!("m{i}")).await?;
    let (mut tx, mut rx) = SecureClient::new(c, id.clone(), directory.clone()).split();
    tx.join_secure(
        GROUP,
        SecureConfig {
            keys: KeySource::KeyGraph,
            key_server: Some(server.to_owned()),
            ..SecureConfig::default()
        },
    )
    .await?;
    tokio::spawn(async move {
        while let Ok(ev) = rx.receive().await {
            if let SecureEvent::View(v) = ev {
                let holders = v.members.len();
                if keyed
                    .send(Keyed {
                        member: i,
                        holders,
                        at: Instant::now(),
                    })
                    .is_err()
                {
                    return;
                }
            }
        }
    });
    Ok(tx)
}

/// Waits until `count` distinct members have a secure view of `holders` holders.
async fn wait_all(
    keyed: &mut mpsc::UnboundedReceiver<Keyed>,
    count: usize,
    holders: usize,
    limit: Duration,
) -> Result<Vec<Instant>> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut seen = std::collections::BTreeMap::new();
    while seen.len() < count {
        let k = tokio::time::timeout_at(deadline, keyed.recv())
            .await
            .with_context(|| {
                format!(
                    "{} of {count} members keyed with {holders} holders",
                    seen.len()
                )
            })?
            .context("the members' reports ended")?;
        if k.holders == holders {
            seen.entry(k.member).or_insert(k.at);
        }
    }
    Ok(seen.into_values().collect())
}

/// Time_max and Time_avg (ms) from `t0` to `count` members keyed with `holders` holders.
async fn time_to(
    keyed: &mut mpsc::UnboundedReceiver<Keyed>,
    count: usize,
    holders: usize,
    t0: Instant,
) -> Result<(f64, f64)> {
    let at = wait_all(keyed, count, holders, Duration::from_secs(60)).await?;
    let ms: Vec<f64> = at
        .iter()
        .map(|t| t.saturating_duration_since(t0).as_secs_f64() * 1e3)
        .collect();
    let max = ms.iter().cloned().fold(0.0, f64::max);
    Ok((max, ms.iter().sum::<f64>() / ms.len() as f64))
}

fn drain(served: &mut mpsc::UnboundedReceiver<Served>) {
    while served.try_recv().is_ok() {}
}

/// The rekeys the server made since the last call: their stats and the server's time in the
/// calls that made them.
fn rekeys(served: &mut mpsc::UnboundedReceiver<Served>) -> serde_json::Value {
    let mut out = Vec::new();
    while let Ok(s) = served.try_recv() {
        for e in s.events {
            if let KeyServerEvent::Rekeyed(r) = e {
                out.push(
                    json!({"epoch": r.epoch, "joins": r.joins, "leaves": r.leaves,
                                "messages": r.messages, "bytes_sent": r.bytes_sent,
                                "members": r.members,
                                "server_ms": s.busy.as_secs_f64() * 1e3}),
                );
            }
        }
    }
    json!(out)
}

/// The key server's shell in this process (as `conclave keyserver`, its state not written).
async fn serve(
    mut node: KeyServerNode,
    mut tx: conclave_client::Sender,
    mut rx: conclave_client::Receiver,
    served: mpsc::UnboundedSender<Served>,
) -> Result<()> {
    let start = Instant::now();
    let mut busy = Duration::ZERO;
    loop {
        let t = Instant::now();
        node.tick(start.elapsed().as_millis() as u64);
        busy += t.elapsed();
        while let Some(o) = node.poll_output() {
            if let KeyServerOutput::Command(c) = o {
                match crate::keyserver_cmd::carry(&mut tx, c).await {
                    Ok(()) | Err(ClientError::Refused { .. }) => {}
                    Err(e) => bail!("the key server's session ended: {e}"),
                }
            }
        }
        let events: Vec<KeyServerEvent> = std::iter::from_fn(|| node.poll_event()).collect();
        if !events.is_empty() {
            let _ = served.send(Served {
                events,
                busy: std::mem::take(&mut busy),
            });
        }
        let now = start.elapsed().as_millis() as u64;
        let wait = node
            .next_deadline()
            .map(|at| Duration::from_millis(at.saturating_sub(now)))
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            ev = rx.receive() => {
                let ev = ev?;
                let t = Instant::now();
                node.handle_event(ev, start.elapsed().as_millis() as u64);
                busy += t.elapsed();
            }
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
