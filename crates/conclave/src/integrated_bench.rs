//! `conclave bench integrated`, experiment E6 (paper 002 §VI-A, Figs 5 and 7): what it costs to
//! give every member of every group a fresh key, in the layered architecture (each group's
//! members agree it with TGDH) against the integrated one (Integrated VS: the daemons agree one
//! key among themselves and derive every group's from it), over real daemons on this machine.
//!
//! - Many groups (Fig 7): `k` groups of one member per daemon (13 daemons: groups of 13, as in the
//!   paper); the daemons are split in half, then healed; timed from the cut (or the heal) until
//!   every member holds a key of its side's new view for every one of its groups.
//! - One group (Fig 5): the time from a join and from a leave to the new secure view at every
//!   member, against the group's size, both architectures.
//!
//! Members are clients of this process, each in up to [`GROUPS_PER_CLIENT`] groups; the daemons
//! allow that many groups per client (the deployed default is 16).

use crate::net_bench::{split, statuses, Network};
use crate::secure_bench::Secure;
use crate::view_timing::time_events;
use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_bench::plot::{Chart, Series};
use conclave_client::secure::{KeySource, SecureEvent, SecureReceiver, SecureSender};
use conclave_daemon::Config;
use conclave_gka::ProtocolId;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Groups one bench client is in: a daemon holds at most 16,384 memberships of its clients.
const GROUPS_PER_CLIENT: usize = 500;

#[derive(Args)]
pub struct IntegratedArgs {
    /// Daemons; every group has one member on each (the paper: 13).
    #[arg(long, default_value_t = 13)]
    daemons: usize,
    /// Numbers of groups to rekey after a partition and a merge, with keys from the daemons.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
    groups: Vec<usize>,
    /// Numbers of groups for the layered architecture (every group's members run TGDH: its cost
    /// grows with the groups, so fewer by default); `--layered-groups` alone skips it.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,10,100")]
    layered_groups: Vec<usize>,
    /// Group sizes for the join and leave of one group (Fig 5); `--members` alone skips it.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "2,10,25,50")]
    members: Vec<usize>,
    /// The daemons' token loss and commit timeouts (milliseconds; deployed: 200). All the
    /// daemons here share this machine's processors, and a configuration change makes each
    /// exchange and apply every membership of every group: with thousands of groups the
    /// thirteen together take longer than 200 ms, the ring is taken for broken before it
    /// settles, and it never does. The times reported start from the daemons' views, so the
    /// failure detector's share is not in them.
    #[arg(long, default_value_t = 2000)]
    token_loss_ms: u64,
    /// Repetitions of each event.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// What paper 002 §VI-A states in its text (its figures did not survive): milliseconds on its
/// 13 Pentium III machines on a LAN, TGDH for the layered architecture.
fn paper() -> serde_json::Value {
    json!({
        "bench": "integrated", "paper": "002 §VI-A",
        "merge_100_members_ms": {"layered": 220, "integrated": 90},
        "partition_100_members_ms": {"layered": 680, "integrated": 60},
        "rekey_200_groups_of_13_layered_ms": "> 4000 (extrapolated from Fig 7)",
    })
}

fn architecture(keys: KeySource) -> &'static str {
    match keys {
        KeySource::Agreement => "layered",
        KeySource::Daemons => "integrated",
        KeySource::KeyGraph => "key-graph",
    }
}

pub fn run(args: IntegratedArgs) -> Result<()> {
    if args.daemons < 2 {
        bail!("a partition needs two daemons at least");
    }
    if args.members.iter().any(|k| *k < 2) {
        bail!("a group needs at least 2 members here");
    }
    if args
        .groups
        .iter()
        .chain(&args.layered_groups)
        .any(|k| *k == 0)
    {
        bail!("0 groups is nothing to time");
    }
    std::fs::create_dir_all(&args.out)?;
    println!("{}", paper());
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let mut cfg = Config::local_on_free_ports(args.daemons)?;
        cfg.core.max_groups_per_client = GROUPS_PER_CLIENT;
        cfg.core.membership.token_loss_ms = args.token_loss_ms;
        cfg.core.membership.commit_ms = args.token_loss_ms;
        let net = Network::start_with(cfg).await?;
        let mut rows = Vec::new();
        let runs = [
            (KeySource::Agreement, &args.layered_groups),
            (KeySource::Daemons, &args.groups),
        ];
        for (keys, sizes) in runs {
            for &k in sizes.iter() {
                let tag = format!("e6{}{k}", &architecture(keys)[..1]);
                let got = many_groups(&net, keys, k, args.repeat, &tag).await;
                for row in rows_of(got, keys, k, args.daemons) {
                    println!("{row}");
                    rows.push(row);
                }
                // A failed run leaves the network in an unknown state.
                split(&net, None).await?;
                net.wait_ring(args.daemons).await?;
            }
        }
        for &k in &args.members {
            for keys in [KeySource::Agreement, KeySource::Daemons] {
                for event in ["join", "leave"] {
                    let tag = format!("e6{}{k}{event}", &architecture(keys)[..1]);
                    let names: Vec<String> = (0..args.repeat)
                        .flat_map(|rep| {
                            let tag = &tag;
                            (0..=k).map(move |i| format!("{tag}{rep}-{i}"))
                        })
                        .collect();
                    let mut m = Secure::new(ProtocolId::Tgdh, &names)?;
                    m.keys = keys;
                    let mut row = match time_events(&net, &mut m, k, event, args.repeat, &tag).await
                    {
                        Ok(row) => row,
                        Err(e) => json!({"event": event, "error": format!("{e:#}")}),
                    };
                    row["bench"] = json!("integrated");
                    row["experiment"] = json!("join_leave");
                    row["architecture"] = json!(architecture(keys));
                    row["members"] = json!(k);
                    row["groups"] = json!(1);
                    println!("{row}");
                    rows.push(row);
                }
            }
        }
        net.stop().await?;
        anyhow::Ok(rows)
    })?;
    plots(&args, &rows)
}

fn rows_of(
    got: Result<Vec<Timed>>,
    keys: KeySource,
    k: usize,
    daemons: usize,
) -> Vec<serde_json::Value> {
    let base = json!({
        "bench": "integrated", "experiment": "groups", "architecture": architecture(keys),
        "groups": k, "daemons": daemons, "members": daemons,
    });
    let with = |mut v: serde_json::Value, more: serde_json::Value| {
        for (key, val) in more.as_object().into_iter().flatten() {
            v[key] = val.clone();
        }
        v
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let rounded = |v: &[f64]| v.iter().map(|x| round(*x)).collect::<Vec<_>>();
    match got {
        Err(e) => vec![with(base, json!({"error": format!("{e:#}")}))],
        Ok(events) => events
            .into_iter()
            .map(|t| {
                with(
                    base.clone(),
                    json!({
                        "event": t.event, "repeat": t.max.len(),
                        "time_max_ms": round(mean(&t.max)), "time_avg_ms": round(mean(&t.avg)),
                        "membership_ms": round(mean(&t.views)),
                        "rekey_ms": round(mean(&t.rekey)),
                        "rekey_runs_ms": rounded(&t.rekey),
                    }),
                )
            })
            .collect(),
    }
}

/// What a member's task is told: the view size each of its groups is to reach, for run `epoch`.
struct Expect {
    size: usize,
    epoch: u64,
}

/// A member's report: it holds a key of a view of the expected size in every one of its groups.
type Reached = Result<(usize, u64, Instant)>;

/// Follows one member's secure views: tells when every one of its groups (named `prefix` and
/// their numbers, `first` on, `groups` of them) has a key of a view of the expected size. The
/// groups are found by number, not by name in a map: this task stands for the application and
/// shares the processors with the daemons and the members, so what it costs would be counted
/// in the keys' time.
async fn follow(
    me: usize,
    mut rx: SecureReceiver,
    (prefix, first, groups): (String, usize, usize),
    mut expect: mpsc::UnboundedReceiver<Expect>,
    report: mpsc::UnboundedSender<Reached>,
) {
    // 0: no view yet. The target is no size until the first expectation comes, so that a view
    // before it counts for nothing.
    let mut sizes: Vec<usize> = vec![0; groups];
    let (mut target, mut epoch, mut told) = (usize::MAX, 0, true);
    // Groups whose last view has the target size: counted as views come, so that a member in
    // hundreds of groups does not look at all of them at every view.
    let mut at_target = 0;
    loop {
        tokio::select! {
            e = expect.recv() => {
                let Some(e) = e else { return };
                (target, epoch, told) = (e.size, e.epoch, false);
                at_target = sizes.iter().filter(|s| **s == target).count();
            }
            ev = rx.receive() => match ev {
                Ok(SecureEvent::View(v)) => {
                    let size = v.members.len();
                    let slot = v
                        .group
                        .strip_prefix(prefix.as_str())
                        .and_then(|n| n.parse::<usize>().ok())
                        .and_then(|n| sizes.get_mut(n.wrapping_sub(first)));
                    let Some(slot) = slot else {
                        let _ = report.send(Err(anyhow::anyhow!("a view of {}", v.group)));
                        return;
                    };
                    if std::mem::replace(slot, size) == target {
                        at_target -= 1;
                    }
                    if size == target {
                        at_target += 1;
                    }
                }
                Ok(SecureEvent::Refused { group, error, .. }) => {
                    let _ = report.send(Err(anyhow::anyhow!("{group}: refused {error}")));
                    return;
                }
                Ok(_) => {}
                Err(e) if !e.is_final() => {}
                Err(e) => {
                    let _ = report.send(Err(e.into()));
                    return;
                }
            },
        }
        if !told && at_target == groups {
            told = true;
            let _ = report.send(Ok((me, epoch, Instant::now())));
        }
    }
}

/// Follows the views of a plain member of a group of its own on one daemon: tells when the
/// daemons' new configuration reached it (a daemon installs every group's view on it at once).
async fn watch(
    me: usize,
    mut rx: conclave_client::Receiver,
    mut expect: mpsc::UnboundedReceiver<Expect>,
    report: mpsc::UnboundedSender<Reached>,
) {
    let (mut target, mut epoch, mut told) = (0, 0, true);
    // The last view's size: a view may come before the expectation it meets (both are ready
    // at once, and `select!` takes either), as in `follow`.
    let mut size = 0;
    loop {
        tokio::select! {
            e = expect.recv() => {
                let Some(e) = e else { return };
                (target, epoch, told) = (e.size, e.epoch, false);
            }
            ev = rx.receive() => match ev {
                Ok(conclave_client::ClientEvent::View { members, .. }) => size = members.len(),
                Ok(_) => {}
                Err(e) => {
                    let _ = report.send(Err(e.into()));
                    return;
                }
            },
        }
        if !told && size == target {
            told = true;
            let _ = report.send(Ok((me, epoch, Instant::now())));
        }
    }
}

/// `k` groups of one member per daemon, keyed by `keys`; the daemons cut in half and healed
/// `repeat` times. For each event, each run's time until the last member holds every new key
/// (Time_max) and the members' mean (Time_avg), in milliseconds.
async fn many_groups(
    net: &Network,
    keys: KeySource,
    k: usize,
    repeat: usize,
    tag: &str,
) -> Result<Vec<Timed>> {
    let n = net.daemons.len();
    let per_daemon = k.div_ceil(GROUPS_PER_CLIENT);
    let names: Vec<String> = (0..n * per_daemon).map(|c| format!("{tag}-{c}")).collect();
    let mut m = Secure::new(ProtocolId::Tgdh, &names)?;
    m.keys = keys;
    let (report, mut reached) = mpsc::unbounded_channel();
    // Members join while every daemon is alone: each join then involves one daemon and one
    // member, where on the ring every join of a group of 13 is a flush among all its members;
    // the heal brings every group together in one exchange of the daemons' states.
    let alone = net
        .cfg
        .daemon
        .iter()
        .map(|d| vec![d.name.clone()])
        .collect();
    split(net, Some(alone)).await?;
    net.wait_ring(1).await?;
    // A plain member per daemon in a group of its own: when each daemon installed the new
    // configuration's group views (what the keys' time is measured from).
    let (seen, mut views) = mpsc::unbounded_channel();
    let mut watchers = Vec::new();
    for daemon in 0..n {
        let client = net.connect(daemon, &format!("{tag}-w{daemon}")).await?;
        let (mut tx, rx) = client.split();
        let (expect, expected) = mpsc::unbounded_channel();
        expect.send(Expect { size: 1, epoch: 0 })?;
        tokio::spawn(watch(daemon, rx, expected, seen.clone()));
        tx.join(&format!("{tag}watch"), false).await?;
        watchers.push((tx, expect, daemon));
    }
    let mut members: Vec<(SecureSender, mpsc::UnboundedSender<Expect>, usize)> = Vec::new();
    // The group views each daemon hands its clients at a configuration change: one per local
    // membership, the plain member's included.
    let mut views_per_daemon = vec![1u64; n];
    for (c, name) in names.iter().enumerate() {
        let (daemon, slot) = (c % n, c / n);
        let groups: Vec<usize> =
            (slot * GROUPS_PER_CLIENT..((slot + 1) * GROUPS_PER_CLIENT).min(k)).collect();
        let client = net.connect(daemon, name).await?;
        let (mut tx, rx) = m.client(client, name)?.split();
        let (expect, expected) = mpsc::unbounded_channel();
        expect.send(Expect { size: 1, epoch: 0 })?;
        views_per_daemon[daemon] += groups.len() as u64;
        let prefix = format!("{tag}g");
        let first = groups.first().copied().unwrap_or(0);
        tokio::spawn(follow(
            c,
            rx,
            (prefix, first, groups.len()),
            expected,
            report.clone(),
        ));
        for g in &groups {
            tx.join_secure(&format!("{tag}g{g}"), m.config()).await?;
        }
        members.push((tx, expect, daemon));
    }
    let setup = Duration::from_secs(60) + Duration::from_millis(20 * k as u64);
    wait_all(net, &mut reached, members.len(), 0, setup).await?;
    wait_all(net, &mut views, watchers.len(), 0, setup).await?;
    for (_, expect, _) in &members {
        expect.send(Expect { size: n, epoch: 1 })?;
    }
    for (_, expect, _) in &watchers {
        expect.send(Expect { size: n, epoch: 1 })?;
    }
    split(net, None).await?;
    wait_all(net, &mut reached, members.len(), 1, setup)
        .await
        .context("the groups coming together")?;
    wait_all(net, &mut views, watchers.len(), 1, setup).await?;
    let half: Vec<String> = net.cfg.daemon[..n / 2]
        .iter()
        .map(|d| d.name.clone())
        .collect();
    let rest: Vec<String> = net.cfg.daemon[n / 2..]
        .iter()
        .map(|d| d.name.clone())
        .collect();
    let wait = Duration::from_secs(30) + Duration::from_millis(20 * k as u64);
    let mut out: Vec<Timed> = vec![Timed::new("partition"), Timed::new("merge")];
    let mut epoch = 1;
    for _ in 0..repeat {
        for (e, event) in out.iter_mut().enumerate() {
            epoch += 1;
            let expects = members.iter().map(|(_, e, d)| (e, d));
            for (expect, daemon) in expects.chain(watchers.iter().map(|(_, e, d)| (e, d))) {
                let size = match e {
                    0 if *daemon < n / 2 => n / 2,
                    0 => n - n / 2,
                    _ => n,
                };
                expect.send(Expect { size, epoch })?;
            }
            let start = Instant::now();
            let handed = watch_views(net, &views_per_daemon, wait);
            let sets = (e == 0).then(|| vec![half.clone(), rest.clone()]);
            split(net, sets).await?;
            let times = wait_all(net, &mut reached, members.len(), epoch, wait)
                .await
                .with_context(|| format!("{} of {k} groups", event.event))?;
            let installed = wait_all(net, &mut views, watchers.len(), epoch, wait)
                .await
                .with_context(|| format!("{} of {k} groups: the daemons' views", event.event))?;
            let ms = |t: &Instant| t.saturating_duration_since(start).as_secs_f64() * 1e3;
            let keys: Vec<f64> = times.iter().map(ms).collect();
            // Each daemon's moment is when it had handed all its new views; a daemon the
            // sampler missed (it never counted them all, in its time) counts by its plain
            // member's view, which comes later.
            let handed = handed.join().unwrap_or_default();
            let last_view = installed
                .iter()
                .enumerate()
                .map(|(d, seen)| ms(handed.get(d).copied().flatten().as_ref().unwrap_or(seen)))
                .fold(0.0, f64::max);
            let last_key = keys.iter().cloned().fold(0.0, f64::max);
            event.max.push(last_key);
            event.avg.push(keys.iter().sum::<f64>() / keys.len() as f64);
            event.views.push(last_view);
            event.rekey.push(last_key - last_view);
        }
    }
    for (tx, _, _) in members {
        let _ = tx.disconnect().await;
    }
    for (mut tx, _, _) in watchers {
        let _ = tx.disconnect().await;
    }
    Ok(out)
}

/// Samples each daemon's count of group views handed to its clients, every 0.2 ms on a thread of
/// its own, until each has handed `per_daemon` more (or `within` passes): when each daemon
/// installed the new configuration's views. The plain members' views would say so too, but
/// later: they reach those members only when their tasks get the processors, which thousands of
/// members' keys keep busy.
fn watch_views(
    net: &Network,
    per_daemon: &[u64],
    within: Duration,
) -> std::thread::JoinHandle<Vec<Option<Instant>>> {
    use std::sync::atomic::Ordering::Relaxed;
    let metrics: Vec<_> = net.daemons.iter().map(|d| d.metrics.clone()).collect();
    let targets: Vec<u64> = metrics
        .iter()
        .zip(per_daemon)
        .map(|(m, n)| m.group_views.load(Relaxed) + n)
        .collect();
    std::thread::spawn(move || {
        let mut at: Vec<Option<Instant>> = vec![None; metrics.len()];
        let start = Instant::now();
        while at.iter().any(Option::is_none) && start.elapsed() < within {
            for ((a, m), target) in at.iter_mut().zip(&metrics).zip(&targets) {
                if a.is_none() && m.group_views.load(Relaxed) >= *target {
                    *a = Some(Instant::now());
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        at
    })
}

/// The times of one event's runs, in milliseconds from the cut (or the heal).
struct Timed {
    event: &'static str,
    /// Until the last member held every new key (Time_max), and the members' mean (Time_avg).
    max: Vec<f64>,
    avg: Vec<f64>,
    /// Until the last daemon installed the new configuration's views (the membership's share).
    views: Vec<f64>,
    /// From there to the last key: the key management's share.
    rekey: Vec<f64>,
}

impl Timed {
    fn new(event: &'static str) -> Timed {
        Timed {
            event,
            max: Vec::new(),
            avg: Vec::new(),
            views: Vec::new(),
            rekey: Vec::new(),
        }
    }
}

/// Waits for every member's report of run `epoch`: when each reached it, in the members' order.
async fn wait_all(
    net: &Network,
    reached: &mut mpsc::UnboundedReceiver<Reached>,
    members: usize,
    epoch: u64,
    within: Duration,
) -> Result<Vec<Instant>> {
    let deadline = tokio::time::Instant::now() + within;
    let mut times = Vec::new();
    while times.len() < members {
        let r = match tokio::time::timeout_at(deadline, reached.recv()).await {
            Ok(Some(r)) => r?,
            Ok(None) => bail!("the members' tasks ended"),
            Err(_) => bail!(
                "{} of {members} members hold every key after {within:?} ({})",
                times.len(),
                statuses(net).await
            ),
        };
        if r.1 == epoch {
            times.push((r.0, r.2));
        }
    }
    // In the reporters' order (a plain member's is its daemon's).
    times.sort_by_key(|t| t.0);
    Ok(times.into_iter().map(|t| t.1).collect())
}

fn plots(args: &IntegratedArgs, rows: &[serde_json::Value]) -> Result<()> {
    let series = |event: &str, x: &str, y: &str| -> Vec<Series> {
        ["layered", "integrated"]
            .iter()
            .map(|arch| Series {
                name: format!("{event}, {arch}"),
                points: rows
                    .iter()
                    .filter(|r| r["event"] == event && r["architecture"] == *arch)
                    .filter_map(|r| Some((r[x].as_f64()?, r[y].as_f64()?)))
                    .collect(),
            })
            .collect()
    };
    let groups = Chart {
        title: format!(
            "Fresh keys for every group once the daemons' views are in, after a partition and a \
             merge ({} daemons, groups of {})",
            args.daemons, args.daemons
        ),
        x_label: "groups".into(),
        y_label: "milliseconds from the last daemon's views to the last key".into(),
        log_y: true,
        series: [
            series("partition", "groups", "rekey_ms"),
            series("merge", "groups", "rekey_ms"),
        ]
        .into_iter()
        .flatten()
        .collect(),
    };
    std::fs::write(args.out.join("integrated-groups.svg"), groups.to_svg())?;
    let one = Chart {
        title: format!(
            "A join and a leave to the new secure view at every member ({} daemons)",
            args.daemons
        ),
        x_label: "members".into(),
        y_label: "milliseconds (Time_max)".into(),
        log_y: true,
        series: [
            series("join", "members", "time_max_ms"),
            series("leave", "members", "time_max_ms"),
        ]
        .into_iter()
        .flatten()
        .collect(),
    };
    std::fs::write(args.out.join("integrated-join-leave.svg"), one.to_svg())?;
    Ok(())
}
