//! `conclave bench secure`, experiment E2 (paper 000 §6, thesis 004 §4): the time from a
//! membership event (join, leave, partition, merge) to the new *secure* view at every member,
//! Time_max (the last member) and Time_avg, per key agreement protocol, over real daemons on
//! this machine. It adds to the daemons' own view change (`conclave bench membership`) the
//! key agreement's rounds and computation.
//!
//! With it, E3 (event `cluster`, paper 000 §6.1.5 Fig 13: the odd members cut off from the even
//! ones, merged, and cut off again) and E4 (`--wan`, paper 000 §6.2 Fig 15-16: thirteen daemons
//! at three sites whose round trips are emulated with the daemons' own delay injection).

use crate::net_bench::{Network, Plain};
use crate::secure_cmd::parse_protocol;
use crate::view_timing::{time_events, Members, Seen};
use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_bench::plot::{Chart, Series};
use conclave_client::secure::{
    KeySource, SecureClient, SecureConfig, SecureEvent, SecureReceiver, SecureSender,
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
    /// Events: join, leave, partition (the last daemon cut off), merge (it comes back), cluster
    /// (E3: odd and even members apart, together, apart again). Default: all but cluster; with
    /// --wan, join and leave (the paper's WAN runs).
    #[arg(long, value_delimiter = ',')]
    events: Vec<String>,
    /// E4: paper 000's WAN testbed instead of --daemons: 13 daemons, 11 at site JHU, one at UCI,
    /// one at ICU, round trips JHU-UCI 70 ms, UCI-ICU 300 ms, ICU-JHU 270 ms (each daemon delays
    /// its datagrams to another site by half the round trip), the ring's timers set for them.
    #[arg(long)]
    wan: bool,
    /// Also time the daemons' own view change for each event and size, with plain (EVS)
    /// members: rows and a plotted series named "membership", as the paper plots the insecure
    /// membership service beside the protocols (always on with --wan).
    #[arg(long)]
    membership: bool,
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
    let events: Vec<String> = match (&args.events[..], args.wan) {
        ([], false) => ["join", "leave", "partition", "merge"]
            .map(String::from)
            .to_vec(),
        ([], true) => ["join", "leave"].map(String::from).to_vec(),
        (e, _) => e.to_vec(),
    };
    for e in &events {
        if !EVENTS.contains(&e.as_str()) {
            bail!("unknown event {e:?} ({})", EVENTS.join(", "));
        }
    }
    let daemons = if args.wan {
        vec![WAN_DAEMONS]
    } else {
        args.daemons.clone()
    };
    if events.iter().any(|e| e == "cluster") && daemons.contains(&1) {
        bail!("the cluster event needs two daemons at least");
    }
    if args.clients.iter().any(|k| *k < 2) {
        bail!("a group needs at least 2 members here");
    }
    std::fs::create_dir_all(&args.out)?;
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        for &d in &daemons {
            let net = if args.wan {
                wan_network().await?
            } else {
                Network::start(d).await?
            };
            if args.membership || args.wan {
                for &k in &args.clients {
                    for event in &events {
                        let tag = format!("plain{k}{event}");
                        let mut row = match time_events(
                            &net,
                            &mut Plain,
                            k,
                            event,
                            args.repeat,
                            &tag,
                        )
                        .await
                        {
                            Ok(row) => row,
                            Err(e) => {
                                json!({"daemons": d, "event": event, "error": format!("{e:#}")})
                            }
                        };
                        row["bench"] = json!("secure");
                        row["protocol"] = json!(MEMBERSHIP);
                        row["members"] = json!(k);
                        if args.wan {
                            row["wan"] = json!(true);
                        }
                        println!("{row}");
                        let failed = row.get("error").is_some();
                        rows.push(row);
                        if failed {
                            net.wait_ring(d).await?;
                        }
                    }
                }
            }
            for &p in &protocols {
                for &k in &args.clients {
                    for event in &events {
                        let row = match secure_once(&net, p, k, event, args.repeat).await {
                            Ok(row) => row,
                            Err(e) => json!({
                                "bench": "secure", "daemons": d, "protocol": format!("{p:?}"),
                                "members": k, "event": event, "error": format!("{e:#}"),
                            }),
                        };
                        let mut row = row;
                        if args.wan {
                            row["wan"] = json!(true);
                        }
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
    let wan = if args.wan { "-wan" } else { "" };
    for event in &events {
        let mut series = Vec::new();
        // E3 plots both cuts: the second is where the clustering shows.
        let cuts: &[(&str, &str)] = if event == "cluster" {
            &[("time_max_ms", ", P1"), ("p2_time_max_ms", ", P2")]
        } else {
            &[("time_max_ms", "")]
        };
        let names = protocols.iter().map(|p| format!("{p:?}"));
        let names: Vec<String> = if args.membership || args.wan {
            std::iter::once(MEMBERSHIP.to_string())
                .chain(names)
                .collect()
        } else {
            names.collect()
        };
        for p in &names {
            for &d in &daemons {
                for (field, label) in cuts {
                    series.push(Series {
                        name: format!("{p}, {d} daemons{label}"),
                        points: rows
                            .iter()
                            .filter(|r| {
                                r["event"] == event.as_str()
                                    && r["daemons"] == d
                                    && r["protocol"] == p.as_str()
                            })
                            .filter_map(|r| Some((r["members"].as_f64()?, r[*field].as_f64()?)))
                            .collect(),
                    });
                }
            }
        }
        let chart = Chart {
            title: format!(
                "Secure {event}{}: time to the new secure view at every member (Time_max)",
                if args.wan {
                    " over the emulated WAN"
                } else {
                    ""
                }
            ),
            x_label: "members".into(),
            y_label: "milliseconds".into(),
            log_y: true,
            series,
        };
        std::fs::write(
            args.out.join(format!("secure-{event}{wan}.svg")),
            chart.to_svg(),
        )?;
    }
    Ok(())
}

/// The rows and series of the daemons' own view change.
const MEMBERSHIP: &str = "membership";

const EVENTS: [&str; 5] = ["join", "leave", "partition", "merge", "cluster"];

/// Paper 000 §6.2's testbed: 11 daemons at JHU, then one at UCI and one at ICU.
const WAN_DAEMONS: usize = 13;
/// One-way delays between the sites JHU, UCI and ICU (half the round trips the paper gives).
const WAN_ONE_WAY_MS: [[u64; 3]; 3] = [[0, 35, 135], [35, 0, 150], [135, 150, 0]];

fn wan_site(daemon: usize) -> usize {
    match daemon {
        0..=10 => 0,
        11 => 1,
        _ => 2,
    }
}

/// The WAN testbed: the daemons form their ring, then each delays what it sends to another
/// site. The ring's timers allow for the longest round trip (300 ms) and a token's round
/// through three sites; the defaults are a LAN's.
async fn wan_network() -> Result<Network> {
    let mut cfg = conclave_daemon::Config::local_on_free_ports(WAN_DAEMONS)?;
    let m = &mut cfg.core.membership;
    m.ordering.token_retransmit_ms = 400;
    m.token_loss_ms = 3_000;
    m.join_ms = 400;
    m.consensus_ms = 4_000;
    m.commit_ms = 4_000;
    m.merge_detect_ms = 1_000;
    let net = Network::start_with(cfg).await?;
    let names: Vec<String> = net.cfg.daemon.iter().map(|d| d.name.clone()).collect();
    for (i, d) in net.daemons.iter().enumerate() {
        for (j, peer) in names.iter().enumerate() {
            let ms = WAN_ONE_WAY_MS[wan_site(i)][wan_site(j)];
            if ms == 0 {
                continue;
            }
            let r = d
                .admin(conclave_daemon::AdminRequest::Delay {
                    ms,
                    jitter_ms: 0,
                    peer: Some(peer.clone()),
                })
                .await;
            if !r.ok {
                bail!("delay to {peer}: {}", r.error.unwrap_or_default());
            }
        }
    }
    net.wait_ring(WAN_DAEMONS).await?;
    Ok(net)
}

/// Secure members of one protocol, with identities the directory names.
pub(crate) struct Secure {
    protocol: ProtocolId,
    /// Where the groups' keys come from (the daemons: Integrated VS, `bench integrated`).
    pub(crate) keys: KeySource,
    /// With keys from the daemons: EVS groups the daemons reseal (Optimized EVS).
    pub(crate) evs: bool,
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
            keys: KeySource::Agreement,
            evs: false,
            directory,
            identities,
        })
    }

    /// A secure client of `name` over `client`.
    pub(crate) fn client(&self, client: Client, name: &str) -> Result<SecureClient> {
        let id = self
            .identities
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| id.clone())
            .context("an identity for every member")?;
        Ok(SecureClient::new(client, id, self.directory.clone()))
    }

    pub(crate) fn config(&self) -> SecureConfig {
        SecureConfig {
            keys: self.keys,
            protocol: self.protocol,
            evs: self.evs,
            ..SecureConfig::default()
        }
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
        let c = net.connect(i, name).await?;
        let (mut tx, rx) = self.client(c, name)?.split();
        let cfg = self.config();
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
        Some(match rx.receive().await {
            Ok(SecureEvent::Message { .. }) => Seen::Message,
            Ok(SecureEvent::View(_)) => Seen::View,
            Ok(_) => Seen::Other,
            // A queued message refused (the member then delivers fewer than were sent, which
            // the run reports); the session goes on.
            Err(e) if !e.is_final() => Seen::Other,
            Err(_) => return None,
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
    if event == "cluster" {
        // The daemons' own share (failure detection, membership, EVS views) of the same cuts,
        // with plain members: what is above it is the key agreement's (and the VS flush's).
        let plain = time_events(net, &mut Plain, k, event, repeat, &format!("{tag}p")).await?;
        row["membership_p1_ms"] = plain["time_max_ms"].clone();
        row["membership_p2_ms"] = plain["p2_time_max_ms"].clone();
    }
    row["bench"] = json!("secure");
    row["protocol"] = json!(format!("{protocol:?}"));
    row["members"] = json!(k);
    Ok(row)
}
