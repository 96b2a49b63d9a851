//! `conclave bench sealed`, experiment E7 (paper 002 §VI-B, Figs 8 and 9; thesis 004 Fig 6):
//! agreed messages per second delivered at every member against message size, with 1 and 5
//! senders, for each way of protecting the data, over real daemons on this machine:
//!
//! - `none`: links off, data in the clear;
//! - `integrity`: links authenticated (every datagram between daemons carries a tag);
//! - `links`: links sealed (encrypted between daemons; clear at the daemons and on the client hop);
//! - `layered`: links off, every message sealed by its sender's secure layer under the key the
//!   members agreed (TGDH) and opened by every member;
//! - `integrated`: the same with the key the daemons hand (Integrated VS);
//! - `optimized-evs`: the same in EVS groups, whose late messages the daemons reseal;
//! - `three-step`: Three-Step Client-Server: TLS between each client and its daemon, links sealed
//!   between daemons, nothing sealed by the clients.
//!
//! The client-side variants run with links off, so that each row shows one protection's cost.
//! Variants alternate within each round (`--rounds`), each with daemons of its own, so that they
//! are compared in the same minutes.

use crate::net_bench::{parse_link_mode, throughput_once, Load, Network};
use anyhow::{bail, Result};
use clap::Args;
use conclave_bench::plot::{Chart, Series};
use conclave_client::secure::KeySource;
use conclave_client::ServiceType;
use conclave_daemon::Config;
use conclave_gka::ProtocolId;
use serde_json::json;
use std::path::PathBuf;

const VARIANTS: [&str; 7] = [
    "none",
    "integrity",
    "links",
    "layered",
    "integrated",
    "optimized-evs",
    "three-step",
];

#[derive(Args)]
pub struct SealedArgs {
    #[arg(long, default_value_t = 3)]
    daemons: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,5")]
    senders: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "100,1024,8192,65536")]
    sizes: Vec<usize>,
    /// Variants: none, integrity, links, layered, integrated, optimized-evs, three-step.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,integrity,links,layered,integrated,optimized-evs,three-step"
    )]
    variants: Vec<String>,
    /// How long each run sends, in seconds.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Times the whole set of variants is run, alternating.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// Link mode; where the members' keys come from and whether their groups are EVS (no sealing by
/// the members: `None`); TLS between client and daemon.
type Variant = (&'static str, Option<(KeySource, bool)>, bool);

/// A variant's link mode, client-side sealing (where the keys come from, and whether the groups
/// are EVS groups the daemons reseal), and whether clients talk TLS to their daemons.
fn variant(name: &str) -> Result<Variant> {
    Ok(match name {
        "none" => ("off", None, false),
        "integrity" => ("authenticated", None, false),
        "links" => ("sealed", None, false),
        "layered" => ("off", Some((KeySource::Agreement, false)), false),
        "integrated" => ("off", Some((KeySource::Daemons, false)), false),
        "optimized-evs" => ("off", Some((KeySource::Daemons, true)), false),
        "three-step" => ("sealed", None, true),
        other => bail!("unknown variant {other:?} ({})", VARIANTS.join(", ")),
    })
}

pub fn run(args: SealedArgs) -> Result<()> {
    for v in &args.variants {
        variant(v)?;
    }
    std::fs::create_dir_all(&args.out)?;
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        let mut run = 0;
        for round in 0..args.rounds.max(1) {
            for v in &args.variants {
                let (links, keys, tls) = variant(v)?;
                let mut cfg = Config::local_on_free_ports(args.daemons)?;
                cfg.links.mode = parse_link_mode(links)?;
                if tls {
                    for i in 0..cfg.daemon.len() {
                        cfg.daemon[i].tls = Some(cfg.free_tcp_port()?);
                    }
                }
                let net = Network::start_with(cfg).await?;
                for &senders in &args.senders {
                    for &size in &args.sizes {
                        run += 1;
                        let load = Load {
                            receivers: args.daemons.max(senders),
                            senders,
                            size,
                            service: ServiceType::Agreed,
                            seconds: args.seconds,
                        };
                        let secure = keys.map(|(k, evs)| (ProtocolId::Tgdh, k, evs));
                        let tag = format!("e7{run}-");
                        let mut row = match throughput_once(&net, &load, &tag, secure).await {
                            Ok(row) => row,
                            Err(e) => json!({
                                "senders": senders, "size": size, "error": format!("{e:#}"),
                            }),
                        };
                        row["bench"] = json!("sealed");
                        row["variant"] = json!(v);
                        row["links"] = json!(links);
                        row["tls"] = json!(tls);
                        row["round"] = json!(round);
                        println!("{row}");
                        rows.push(row);
                    }
                }
                net.stop().await?;
            }
        }
        anyhow::Ok(rows)
    })?;
    let mut series = Vec::new();
    for v in &args.variants {
        for &senders in &args.senders {
            let points = rows
                .iter()
                .filter(|r| r["variant"] == v.as_str() && r["senders"] == senders)
                .filter_map(|r| Some((r["size"].as_f64()?, r["msgs_per_s_min"].as_f64()?)))
                .collect::<Vec<_>>();
            if !points.is_empty() {
                series.push(Series {
                    name: format!("{v}, {senders} sender(s)"),
                    points,
                });
            }
        }
    }
    let chart = Chart {
        title: format!(
            "Agreed messages per second at the slowest member, by protection ({} daemons)",
            args.daemons
        ),
        x_label: "message size (bytes)".into(),
        y_label: "messages per second".into(),
        log_y: true,
        series,
    };
    std::fs::write(args.out.join("sealed.svg"), chart.to_svg())?;
    Ok(())
}
