//! `conclave bench throughput | latency | membership`: real daemons on this machine (UDP between
//! them, TCP to their clients, all in this process on a multi-threaded runtime), measured from
//! the clients' side. JSON lines on stdout, and an SVG plot per experiment in `--out`.

use crate::process_bench::Transport;
use crate::user_cmd::service_name;
use crate::view_timing::{Members, Seen};
use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_bench::plot::{Chart, Series};
use conclave_client::{Address, Client, ClientEvent, Receiver, Sender, ServiceType};
use conclave_daemon::link::LinkMode;
use conclave_daemon::{AdminRequest, Config, Options, Running};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const GROUP: &str = "bench";

#[derive(Args)]
pub struct ThroughputArgs {
    #[arg(long, default_value_t = 3)]
    daemons: usize,
    /// Numbers of senders to run (one client per daemon receives; senders are clients too).
    #[arg(long, value_delimiter = ',', default_value = "1,3,5")]
    senders: Vec<usize>,
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "100,1024,8192,65536")]
    sizes: Vec<usize>,
    /// Service types.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "unreliable,reliable,fifo,causal,agreed,safe"
    )]
    services: Vec<String>,
    /// How long each configuration sends, in seconds.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// One secure group (docs/secure.md) with this key agreement protocol: every message sealed
    /// by its sender and opened by every member.
    #[arg(long)]
    secure: Option<String>,
    /// How the links between daemons are protected (docs/links.md): sealed, authenticated or
    /// off; several (comma-separated) run one after the other, each with daemons of its own,
    /// `--rounds` times, so that they are compared in the same minutes.
    #[arg(long, value_delimiter = ',', default_value = "sealed")]
    links: Vec<String>,
    /// Times the whole set of link modes is run (alternating).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Each configuration runs twice, with Conclave's clients and then with clients of Spread
    /// 4.x's protocol on the daemons' Spread ports (docs/spread.md); rows say which (`clients`).
    #[arg(long, conflicts_with = "secure")]
    spread: bool,
    /// As deployed: every daemon a `conclave daemon` process and every member a client process
    /// of its own (rows say `"deployment": "processes"`). Without it, the daemons and clients
    /// share this process (for profiling).
    #[arg(long, conflicts_with_all = ["secure", "spread"])]
    processes: bool,
    /// With --processes, each configuration also runs on relays in the daemons' places: the
    /// same byte flow (members to relay over TCP, datagrams of up to 60,000 bytes between
    /// relays, relay to members over TCP) with the protocol left out, the machine's limit
    /// (rows say `"deployment": "limit"`).
    #[arg(long, requires = "processes")]
    limit: bool,
    /// With --processes, how the members reach their daemons: tcp (loopback) or shm (the
    /// daemons' `shm` sockets, replies through shared memory); several (comma-separated) run
    /// one after the other, each with daemons of its own, `--rounds` times (rows say
    /// `transport`).
    #[arg(long, value_delimiter = ',', default_value = "tcp")]
    transport: Vec<String>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(Args)]
pub struct LatencyArgs {
    #[arg(long, default_value_t = 3)]
    daemons: usize,
    /// Offered loads, messages per second over all senders (one sender per daemon).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000")]
    rates: Vec<u64>,
    #[arg(long, default_value_t = 1024)]
    size: usize,
    #[arg(long, value_delimiter = ',', default_value = "agreed,safe")]
    services: Vec<String>,
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// As deployed: every daemon a `conclave daemon` process and every member a client process
    /// of its own (rows say `"deployment": "processes"`); a message carries its send time on
    /// the system clock, which every process on the machine reads alike, and the rows add what a
    /// message cost the daemons and the members in processor time and wake-ups.
    #[arg(long)]
    processes: bool,
    /// With --processes, how the members reach their daemons: tcp or shm (as for `bench
    /// throughput`); several (comma-separated) run one after the other.
    #[arg(long, value_delimiter = ',', default_value = "tcp")]
    transport: Vec<String>,
    /// With --processes, after each run the same senders and rate on relays (`bench relay`):
    /// skeleton members send stamped frames to their relays over TCP, the relays pass them to
    /// each other over UDP and to their members, with no protocol at all, the machine's limit
    /// (rows say `"deployment": "limit"`, and how many frames were `lost`: nothing retransmits);
    /// then, for as long, a thread that sleeps 200 µs at a time notes the most it overslept
    /// (`idle_oversleep_max_us`), the machine's own hiccups.
    #[arg(long, requires = "processes")]
    limit: bool,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// The transports named, checked (only --processes runs other than loopback TCP).
fn parse_transports(names: &[String], processes: bool) -> Result<Vec<Transport>> {
    let t = names
        .iter()
        .map(|n| Transport::parse(n))
        .collect::<Result<Vec<_>>>()?;
    if t.is_empty() || !processes && t != [Transport::Tcp] {
        bail!("--transport other than tcp needs --processes");
    }
    Ok(t)
}

#[derive(Args)]
pub struct MembershipArgs {
    /// Numbers of daemons to run.
    #[arg(long, value_delimiter = ',', default_value = "3,5,9,13")]
    daemons: Vec<usize>,
    /// Numbers of clients (spread over the daemons).
    #[arg(long, value_delimiter = ',', default_value = "2,10,25,50")]
    clients: Vec<usize>,
    /// Repetitions of each event.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

pub(crate) fn parse_link_mode(name: &str) -> Result<LinkMode> {
    Ok(match name {
        "sealed" => LinkMode::Sealed,
        "authenticated" => LinkMode::Authenticated,
        "off" => LinkMode::Off,
        _ => bail!("unknown link mode {name:?}: sealed, authenticated or off"),
    })
}

fn parse_services(names: &[String]) -> Result<Vec<ServiceType>> {
    names
        .iter()
        .map(|n| {
            crate::user_cmd::parse_service(n).with_context(|| format!("no service type {n:?}"))
        })
        .collect()
}

/// Every daemon's phase, ring, members and progress, and what it refused, for an error message.
pub(crate) async fn statuses(net: &Network) -> String {
    let mut st = Vec::new();
    for d in &net.daemons {
        let s = d
            .admin(AdminRequest::Status)
            .await
            .status
            .unwrap_or_default();
        st.push(format!(
            "{} {} {:?} {:?} ready {} clients {} connections {} progress (seen, received, delivered, queued) \
             {:?}, {} slow clients closed, {} refusals, {} configurations, {} retransmissions \
             asked, {} datagrams refused, {} not sent for want of a link epoch, {} messages \
             accepted from clients, {} delivered to clients",
            s.daemon,
            s.phase,
            s.ring,
            s.members,
            s.ready,
            s.clients,
            s.connections,
            s.progress,
            d.metrics.closed_slow_clients.load(Relaxed),
            d.metrics.refusals.load(Relaxed),
            d.metrics.views.load(Relaxed),
            d.metrics.retransmit_requests.load(Relaxed),
            d.metrics.bad_datagrams.load(Relaxed),
            d.metrics.link_waiting.load(Relaxed),
            d.metrics.messages_accepted.load(Relaxed),
            d.metrics.messages_delivered.load(Relaxed),
        ));
    }
    st.join("; ")
}

/// `n` daemons of this process, one ring.
pub(crate) struct Network {
    pub(crate) cfg: Config,
    pub(crate) daemons: Vec<Running>,
}

impl Network {
    pub(crate) async fn start(n: usize) -> Result<Network> {
        Self::start_with(Config::local_on_free_ports(n)?).await
    }

    /// The daemons `cfg` names, all in this process, with fresh identities.
    pub(crate) async fn start_with(cfg: Config) -> Result<Network> {
        let (cfg, ids) = cfg.with_identities(&mut rand_core::OsRng);
        let n = cfg.daemon.len();
        let mut daemons = Vec::new();
        for d in &cfg.daemon {
            // CONCLAVE_BENCH_RECORD=DIR records each daemon's history there (for the checker).
            let opts = Options {
                record: std::env::var_os("CONCLAVE_BENCH_RECORD")
                    .map(|dir| PathBuf::from(dir).join(format!("{}.jsonl", d.name))),
                identity: ids.get(&d.name),
                ..Options::default()
            };
            daemons.push(conclave_daemon::start(cfg.clone(), &d.name, opts).await?);
        }
        let net = Network { cfg, daemons };
        net.wait_ring(n).await?;
        Ok(net)
    }

    pub(crate) async fn wait_ring(&self, n: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut ok = true;
            for d in &self.daemons {
                let s = d
                    .admin(AdminRequest::Status)
                    .await
                    .status
                    .unwrap_or_default();
                ok &= s.ready && s.members.len() == n;
            }
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the {n} daemons did not form a ring in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Daemon `i mod n`'s client address: its TLS port if every daemon has one (Three-Step).
    pub(crate) fn address(&self, i: usize) -> Address {
        let d = &self.cfg.daemon[i % self.cfg.daemon.len()];
        match d.tls {
            Some(a) if self.cfg.daemon.iter().all(|d| d.tls.is_some()) => {
                Address::Tls(a.to_string())
            }
            _ => Address::Tcp(d.client.unwrap().to_string()),
        }
    }

    /// A client of daemon `i mod n` (over TLS, knowing the daemon's key, if the daemons have
    /// TLS ports).
    pub(crate) async fn connect(&self, i: usize, name: &str) -> Result<Client> {
        let d = &self.cfg.daemon[i % self.cfg.daemon.len()];
        let daemon_key = d
            .key
            .as_deref()
            .map(|k| conclave_crypto::identity_file::parse_public_text(&d.name, k))
            .transpose()?;
        let opts = conclave_client::Options {
            daemon_key,
            ..Default::default()
        };
        Ok(Client::connect_with(&self.address(i), name, opts).await?)
    }

    pub(crate) async fn stop(self) -> Result<()> {
        for d in self.daemons {
            d.shutdown().await?;
        }
        Ok(())
    }
}

/// Connects `k` clients (client i on daemon i mod n), joins them to the group, and waits until
/// each has the view of all `k`.
async fn members(net: &Network, k: usize, tag: &str) -> Result<Vec<(Sender, Receiver)>> {
    let mut out = Vec::new();
    for i in 0..k {
        let mut c = net.connect(i, &format!("{tag}{i}")).await?;
        c.join(GROUP).await?;
        out.push(c.split());
    }
    for (i, (_, r)) in out.iter_mut().enumerate() {
        if let Err(e) = wait_view(r, k).await {
            bail!(
                "member {i} of {k} ({tag}) saw no view of all: {e} ({})",
                statuses(net).await
            );
        }
    }
    Ok(out)
}

pub(crate) async fn wait_view(r: &mut Receiver, size: usize) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let ev = tokio::time::timeout_at(deadline, r.receive())
            .await
            .with_context(|| format!("no view of {size} in 30 s (views seen: {seen:?})"))??;
        if let ClientEvent::View { members, .. } = ev {
            if members.len() == size {
                return Ok(());
            }
            seen.push(members.len());
        }
    }
}

/// The daemons' log on standard error when `RUST_LOG` asks for it (to see why a view changed
/// in a run), timed from the start of the run.
fn log_from_env() {
    if let Ok(f) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(f)
            .with_writer(std::io::stderr)
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .try_init();
    }
}

pub fn run_throughput(args: ThroughputArgs) -> Result<()> {
    log_from_env();
    let services = parse_services(&args.services)?;
    let secure = args
        .secure
        .as_deref()
        .map(crate::secure_cmd::parse_protocol)
        .transpose()?
        .map(|p| (p, conclave_client::secure::KeySource::Agreement, false));
    let links = args
        .links
        .iter()
        .map(|m| parse_link_mode(m))
        .collect::<Result<Vec<_>>>()?;
    let transports = parse_transports(&args.transport, args.processes)?;
    if args.limit {
        if let Some(big) = args
            .sizes
            .iter()
            .find(|&&s| s > crate::limit_bench::MAX_MESSAGE)
        {
            bail!(
                "--limit carries each message in one datagram: sizes up to {} bytes (not {big})",
                crate::limit_bench::MAX_MESSAGE
            );
        }
    }
    std::fs::create_dir_all(&args.out)?;
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        let mut round = 0;
        for _ in 0..args.rounds.max(1) {
            for &mode in &links {
                let mut cfg = Config::local_on_free_ports(args.daemons)?;
                cfg.links.mode = mode;
                if args.spread {
                    for i in 0..cfg.daemon.len() {
                        cfg.daemon[i].spread = Some(cfg.free_tcp_port()?);
                    }
                }
                for &transport in transports.iter().filter(|_| args.processes) {
                    let relays = match args.limit {
                        true => {
                            Some(crate::process_bench::Daemons::start_relays(args.daemons).await?)
                        }
                        false => None,
                    };
                    let net = crate::process_bench::Daemons::start(cfg.clone(), transport).await?;
                    for load in loads(&args, &services) {
                        round += 1;
                        let mut row = net.throughput(&load, &format!("p{round}-")).await?;
                        row["links"] = mode.name().into();
                        row["clients"] = "conclave".into();
                        println!("{row}");
                        rows.push(row);
                        // The same load on the relays, in the same minute.
                        if let Some(relays) = &relays {
                            let mut row = relays.throughput(&load, &format!("l{round}-")).await?;
                            row["links"] = "none".into();
                            row["clients"] = "skeleton".into();
                            println!("{row}");
                            rows.push(row);
                        }
                    }
                    net.stop().await?;
                    if let Some(relays) = relays {
                        relays.stop().await?;
                    }
                }
                if args.processes {
                    continue;
                }
                let net = Network::start_with(cfg).await?;
                for load in loads(&args, &services) {
                    round += 1;
                    let mut row =
                        throughput_once(&net, &load, &format!("t{round}-"), secure).await?;
                    row["links"] = mode.name().into();
                    row["deployment"] = "in-process".into();
                    row["clients"] = "conclave".into();
                    println!("{row}");
                    rows.push(row);
                    if args.spread {
                        let tag = format!("s{round}-");
                        let mut m = crate::spread_bench::SpreadMembers;
                        let mut row = run_load(&net, &mut m, &load, &tag).await?;
                        row["bench"] = json!("throughput");
                        row["links"] = mode.name().into();
                        row["deployment"] = "in-process".into();
                        row["clients"] = "spread".into();
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
    for &senders in &args.senders {
        for s in &services {
            let points = rows
                .iter()
                .filter(|r| {
                    r["senders"] == senders
                        && r["service"] == service_name(*s)
                        && r["links"] == links[0].name()
                        && r["clients"] == "conclave"
                        && (r["transport"].is_null() || r["transport"] == transports[0].name())
                })
                .map(|r| {
                    (
                        r["size"].as_f64().unwrap_or(0.0),
                        r["msgs_per_s_min"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect();
            series.push(Series {
                name: format!("{} sender(s), {}", senders, service_name(*s)),
                points,
            });
        }
    }
    let chart = Chart {
        title: format!("Throughput, {} daemons on one machine", args.daemons),
        x_label: "message size (bytes)".into(),
        y_label: "messages per second delivered at each member".into(),
        log_y: true,
        series,
    };
    std::fs::write(args.out.join("throughput.svg"), chart.to_svg())?;
    Ok(())
}

/// Every configuration `args` asks for, in the order they run.
fn loads(args: &ThroughputArgs, services: &[ServiceType]) -> Vec<Load> {
    let mut out = Vec::new();
    for &senders in &args.senders {
        for &size in &args.sizes {
            for &service in services {
                out.push(Load {
                    receivers: args.daemons.max(senders),
                    senders,
                    size,
                    service,
                    seconds: args.seconds,
                });
            }
        }
    }
    out
}

/// What a throughput run offers: `senders` of the `receivers` members send `service` messages
/// of `size` bytes for `seconds`.
pub(crate) struct Load {
    pub(crate) receivers: usize,
    pub(crate) senders: usize,
    pub(crate) size: usize,
    pub(crate) service: ServiceType,
    pub(crate) seconds: f64,
}

/// Runs `load`; every member counts what it delivers, from the first send to its last delivery.
pub(crate) async fn throughput_once(
    net: &Network,
    load: &Load,
    tag: &str,
    secure: Option<(
        conclave_gka::ProtocolId,
        conclave_client::secure::KeySource,
        bool,
    )>,
) -> Result<serde_json::Value> {
    let mut row = match secure {
        Some((p, keys, evs)) => {
            let names: Vec<String> = (0..load.receivers).map(|i| format!("{tag}{i}")).collect();
            let mut m = crate::secure_bench::Secure::new(p, &names)?;
            m.keys = keys;
            m.evs = evs;
            let mut row = run_load(net, &mut m, load, tag).await?;
            row["secure"] = match (keys, evs) {
                (conclave_client::secure::KeySource::Agreement, _) => json!(format!("{p:?}")),
                (conclave_client::secure::KeySource::Daemons, false) => json!("daemons"),
                (conclave_client::secure::KeySource::Daemons, true) => json!("daemons-evs"),
                (conclave_client::secure::KeySource::KeyGraph, _) => json!("key-graph"),
            };
            row
        }
        None => run_load(net, &mut Plain, load, tag).await?,
    };
    row["bench"] = json!("throughput");
    Ok(row)
}

/// The members form the group, then `load.senders` of them send for `load.seconds`.
pub(crate) async fn run_load<M: Members>(
    net: &Network,
    m: &mut M,
    load: &Load,
    tag: &str,
) -> Result<serde_json::Value> {
    let &Load {
        receivers,
        senders,
        size,
        service,
        seconds,
    } = load;
    let mut ms = Vec::new();
    for i in 0..receivers {
        ms.push(m.add(net, i, &format!("{tag}{i}")).await?);
    }
    for (i, (_, r)) in ms.iter_mut().enumerate() {
        if let Err(e) = M::wait(r, receivers).await {
            bail!(
                "member {i} of {receivers} ({tag}) saw no view of all: {e:#} ({})",
                statuses(net).await
            );
        }
    }
    let sent = Arc::new(AtomicU64::new(0));
    // Messages the daemons refused (past a daemon's budget for a client's held messages): the
    // sender's call took them, but they are not delivered.
    let refused = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = Instant::now();
    let mut counters: Vec<Counter> = Vec::new();
    let mut send_tasks = Vec::new();
    // Members that only receive keep their sending half: dropping it ends the session.
    let mut quiet = Vec::new();
    // Views after the start: a daemon falsely suspected under the load changes them, and then
    // not every message reaches every member (EVS), so the run is reported as such.
    let views = Arc::new(AtomicU64::new(0));
    for (i, (mut s, mut r)) in ms.into_iter().enumerate() {
        let got = Arc::new(AtomicU64::new(0));
        let last = Arc::new(Mutex64::default());
        counters.push((got.clone(), last.clone()));
        let (views, refused) = (views.clone(), refused.clone());
        tokio::spawn(async move {
            while let Some(seen) = M::next(&mut r).await {
                match seen {
                    Seen::Refused => {
                        refused.fetch_add(1, Relaxed);
                    }
                    Seen::Message => {
                        got.fetch_add(1, Relaxed);
                        last.set(start.elapsed().as_nanos() as u64);
                    }
                    Seen::View => {
                        views.fetch_add(1, Relaxed);
                    }
                    Seen::Other => {}
                }
            }
        });
        if i < senders {
            let (sent, stop) = (sent.clone(), stop.clone());
            send_tasks.push(tokio::spawn(async move {
                // Each payload its own (the sender and a count first), so that a recorded
                // history names every message apart.
                let mut payload = vec![0x5a; size.max(16)];
                payload[..8].copy_from_slice(&(i as u64).to_be_bytes());
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    payload[8..16].copy_from_slice(&n.to_be_bytes());
                    if M::send(&mut s, service, &payload).await.is_err() {
                        break;
                    }
                    n += 1;
                    if n.is_multiple_of(M::BATCH) {
                        M::flush(&mut s).await;
                    }
                }
                M::flush(&mut s).await;
                sent.fetch_add(n, Relaxed);
                s
            }));
        } else {
            quiet.push(s);
        }
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Relaxed);
    let mut keep = Vec::new();
    for t in send_tasks {
        // A sender waits for its window only while the daemon still acknowledges: one that never
        // does is a fault to report, not a hang.
        match tokio::time::timeout(Duration::from_secs(20), t).await {
            Ok(s) => keep.push(s?),
            Err(_) => bail!(
                "a sender waited 20 s for its daemon to acknowledge ({})",
                statuses(net).await
            ),
        }
    }
    // Refusals come back after the sends: those of the last messages sent are awaited a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = refused.load(Relaxed);
    let total = sent.load(Relaxed) - refused;
    let (min, mean, delivered_min) = await_deliveries(net, &counters, &views, total).await?;
    // Counted before the members leave: a member still reading sees the others' departures.
    let view_changes = views.load(Relaxed);
    for s in keep.into_iter().chain(quiet) {
        M::close(s).await;
    }
    // The members leave before the next configuration joins.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(json!({
        "daemons": net.daemons.len(), "members": receivers,
        "senders": senders, "size": size, "service": service_name(service),
        "messages": total, "refused": refused, "delivered_min": delivered_min,
        "view_changes": view_changes,
        "msgs_per_s_min": min.round(), "msgs_per_s_mean": mean.round(),
        "mbytes_per_s_min": (min * size as f64 / 1e6 * 10.0).round() / 10.0,
    }))
}

/// What each member counts: the messages it delivered and when it delivered the last (ns from
/// the start).
pub(crate) type Counter = (Arc<AtomicU64>, Arc<Mutex64>);

/// Waits until every member has delivered the `total` sent (or, after a view change, until
/// deliveries stop); gives the slowest member's rate, the mean rate and the fewest delivered.
pub(crate) async fn await_deliveries(
    net: &Network,
    counters: &[Counter],
    views: &AtomicU64,
    total: u64,
) -> Result<(f64, f64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut still = (Instant::now(), 0u64);
    while counters.iter().any(|(g, _)| g.load(Relaxed) < total) {
        let now_got: u64 = counters.iter().map(|(g, _)| g.load(Relaxed)).sum();
        if now_got != still.1 {
            still = (Instant::now(), now_got);
        }
        if views.load(Relaxed) > 0 && still.0.elapsed() > Duration::from_secs(2) {
            break;
        }
        if Instant::now() > deadline {
            let got: Vec<u64> = counters.iter().map(|(g, _)| g.load(Relaxed)).collect();
            bail!(
                "members delivered {got:?} of the {total} sent ({})",
                statuses(net).await
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rates: Vec<f64> = counters
        .iter()
        .map(|(g, l)| g.load(Relaxed) as f64 / (l.get() as f64 / 1e9))
        .collect();
    let delivered_min = counters
        .iter()
        .map(|(g, _)| g.load(Relaxed))
        .min()
        .unwrap_or(0);
    let min = rates.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    Ok((min, mean, delivered_min))
}

/// A u64 shared between tasks (the time of the last delivery).
#[derive(Default)]
pub(crate) struct Mutex64(AtomicU64);

impl Mutex64 {
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn run_latency(args: LatencyArgs) -> Result<()> {
    let services = parse_services(&args.services)?;
    let transports = parse_transports(&args.transport, args.processes)?;
    std::fs::create_dir_all(&args.out)?;
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        let mut round = 0;
        for &transport in transports.iter().filter(|_| args.processes) {
            let cfg = Config::local_on_free_ports(args.daemons)?;
            let relays = match args.limit {
                true => Some(crate::process_bench::Daemons::start_relays(args.daemons).await?),
                false => None,
            };
            let net = crate::process_bench::Daemons::start(cfg, transport).await?;
            for &service in &services {
                for &rate in &args.rates {
                    round += 1;
                    let tag = format!("lp{round}-");
                    let row = net
                        .latency(rate, args.size, service, args.seconds, &tag)
                        .await?;
                    println!("{row}");
                    rows.push(row);
                    // The same senders on the relays, in the same minute.
                    if let Some(relays) = &relays {
                        let tag = format!("ll{round}-");
                        let mut row = relays
                            .latency(rate, args.size, service, args.seconds, &tag)
                            .await?;
                        // Then the machine alone for as long (not during the run, which a
                        // thread waking 5,000 times a second would disturb).
                        let seconds = args.seconds;
                        row["idle_oversleep_max_us"] = tokio::task::spawn_blocking(move || {
                            crate::limit_bench::oversleep_max_us(seconds)
                        })
                        .await?
                        .into();
                        println!("{row}");
                        rows.push(row);
                    }
                }
            }
            net.stop().await?;
            if let Some(relays) = relays {
                relays.stop().await?;
            }
        }
        if args.processes {
            return anyhow::Ok(rows);
        }
        let net = Network::start(args.daemons).await?;
        for &service in &services {
            for &rate in &args.rates {
                round += 1;
                let mut row =
                    latency_once(&net, rate, args.size, service, args.seconds, round).await?;
                row["deployment"] = "in-process".into();
                println!("{row}");
                rows.push(row);
            }
        }
        net.stop().await?;
        anyhow::Ok(rows)
    })?;
    // One line per service and percentile; the limit (the same for every service) once, from
    // the first service's rows.
    let mut lines: Vec<(&str, &str, bool)> = services
        .iter()
        .map(|s| (service_name(*s), service_name(*s), false))
        .collect();
    if args.limit {
        lines.push(("limit", service_name(services[0]), true));
    }
    let series = lines
        .iter()
        .flat_map(|&(name, service, limit)| {
            ["p50_us", "p99_us"].map(|p| Series {
                name: format!("{name} {}", &p[..3]),
                points: rows
                    .iter()
                    .filter(|r| r["service"] == service && (r["deployment"] == "limit") == limit)
                    .map(|r| {
                        (
                            r["rate"].as_f64().unwrap_or(0.0),
                            r[p].as_f64().unwrap_or(0.0),
                        )
                    })
                    .collect(),
            })
        })
        .collect();
    let chart = Chart {
        title: format!("Send-to-delivery latency, {} daemons", args.daemons),
        x_label: "offered load (messages per second)".into(),
        y_label: "latency (microseconds)".into(),
        log_y: true,
        series,
    };
    std::fs::write(args.out.join("latency.svg"), chart.to_svg())?;
    Ok(())
}

/// One sender per daemon, together offering `rate` messages per second; each message carries
/// its send time, and every member notes the delay at delivery (all in this process, one clock).
async fn latency_once(
    net: &Network,
    rate: u64,
    size: usize,
    service: ServiceType,
    seconds: f64,
    round: usize,
) -> Result<serde_json::Value> {
    let n = net.daemons.len();
    let ms = members(net, n, &format!("l{round}-")).await?;
    let epoch = Instant::now();
    let total = (rate as f64 * seconds) as u64;
    // Room for every sample from the start: growing the vector under the lock would hold up the
    // other receiving tasks while it is copied.
    let samples = Arc::new(std::sync::Mutex::new(Vec::<u64>::with_capacity(
        total as usize * n,
    )));
    let per_sender = total / n as u64;
    let mut tasks = Vec::new();
    let mut done = Vec::new();
    for (k, (mut s, mut r)) in ms.into_iter().enumerate() {
        let samples = samples.clone();
        let got = Arc::new(AtomicU64::new(0));
        done.push(got.clone());
        tokio::spawn(async move {
            while let Ok(ev) = r.receive().await {
                if let ClientEvent::Message { payload, .. } = ev {
                    let now = epoch.elapsed().as_nanos() as u64;
                    let t = payload
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_be_bytes);
                    samples.lock().unwrap().push(now.saturating_sub(t) / 1000);
                    got.fetch_add(1, Relaxed);
                }
            }
        });
        let interval = Duration::from_secs_f64(n as f64 / rate as f64);
        tasks.push(tokio::spawn(async move {
            let mut payload = vec![0u8; size.max(8)];
            // The senders take turns (sender k starts k/n of an interval late): started
            // together, they would all send in the same instant, a burst of n every interval.
            let mut next = tokio::time::Instant::now() + interval.mul_f64(k as f64 / n as f64);
            for _ in 0..per_sender {
                next += interval;
                tokio::time::sleep_until(next).await;
                let t = epoch.elapsed().as_nanos() as u64;
                payload[..8].copy_from_slice(&t.to_be_bytes());
                if s.multicast(service, &[GROUP], &payload).await.is_err() {
                    break;
                }
            }
            s
        }));
    }
    let mut keep = Vec::new();
    for t in tasks {
        keep.push(t.await?);
    }
    let want = per_sender * n as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.iter().any(|g| g.load(Relaxed) < want) {
        if Instant::now() > deadline {
            bail!("messages were lost at {rate}/s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for mut s in keep {
        let _ = s.disconnect().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut v = samples.lock().unwrap().clone();
    v.sort_unstable();
    Ok(json!({
        "bench": "latency", "daemons": n, "senders": n, "size": size,
        "service": service_name(service), "rate": rate, "deliveries": v.len(),
        "p50_us": percentile(&v, 0.5), "p99_us": percentile(&v, 0.99),
        "max_us": v.last().copied().unwrap_or(0),
    }))
}

pub fn run_membership(args: MembershipArgs) -> Result<()> {
    log_from_env();
    std::fs::create_dir_all(&args.out)?;
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        for &d in &args.daemons {
            let net = Network::start(d).await?;
            'clients: for &k in &args.clients {
                for event in ["join", "leave", "partition", "merge"] {
                    match membership_once(&net, k, event, args.repeat).await {
                        Ok(row) => {
                            println!("{row}");
                            rows.push(row);
                        }
                        // Reported, and the rest of this network's runs skipped: its state is
                        // unknown.
                        Err(e) => {
                            let row = json!({
                                "bench": "membership", "daemons": d, "clients": k,
                                "event": event, "error": format!("{e:#}"),
                            });
                            println!("{row}");
                            break 'clients;
                        }
                    }
                }
            }
            net.stop().await?;
        }
        anyhow::Ok(rows)
    })?;
    let mut series = Vec::new();
    for event in ["join", "leave", "partition", "merge"] {
        for &d in &args.daemons {
            series.push(Series {
                name: format!("{event}, {d} daemons"),
                points: rows
                    .iter()
                    .filter(|r| r["event"] == event && r["daemons"] == d)
                    .map(|r| {
                        (
                            r["clients"].as_f64().unwrap_or(0.0),
                            r["time_max_ms"].as_f64().unwrap_or(0.0),
                        )
                    })
                    .collect(),
            });
        }
    }
    let chart = Chart {
        title: "Time to a new view at every member (Time_max)".into(),
        x_label: "clients in the group".into(),
        y_label: "milliseconds".into(),
        log_y: true,
        series,
    };
    std::fs::write(args.out.join("membership.svg"), chart.to_svg())?;
    Ok(())
}

/// Plain members: clients joined to the group with EVS.
pub(crate) struct Plain;

impl Members for Plain {
    type Tx = Sender;
    type Rx = Receiver;
    const BATCH: u64 = 32;
    async fn add(&mut self, net: &Network, i: usize, name: &str) -> Result<(Sender, Receiver)> {
        let mut c = net.connect(i, name).await?;
        c.join(GROUP).await?;
        Ok(c.split())
    }
    async fn wait(rx: &mut Receiver, size: usize) -> Result<()> {
        wait_view(rx, size).await
    }
    async fn leave(tx: &mut Sender) -> Result<()> {
        Ok(tx.leave(GROUP).await?)
    }
    async fn close(mut tx: Sender) {
        let _ = tx.disconnect().await;
    }
    async fn next(rx: &mut Receiver) -> Option<Seen> {
        // A refusal (of a message, under load) is an event like another; only the end of the
        // session ends the count. Stopping at a refusal dropped the receiving half, and its
        // member's sender then waited for acknowledgements nobody read.
        Some(match rx.receive().await {
            Ok(ClientEvent::Message { .. }) => Seen::Message,
            Ok(ClientEvent::View { .. }) => Seen::View,
            Err(conclave_client::ClientError::Refused { .. }) => Seen::Refused,
            Ok(_) => Seen::Other,
            Err(_) => return None,
        })
    }
    async fn send(tx: &mut Sender, service: ServiceType, payload: &[u8]) -> Result<()> {
        Ok(tx.queue(service, &[GROUP], payload).await?)
    }
    async fn flush(tx: &mut Sender) {
        let _ = tx.flush().await;
    }
}

/// Time from an event to the new view at each member: Time_max (the last member) and Time_avg
/// (thesis 004 §4), averaged over `repeat` runs.
async fn membership_once(
    net: &Network,
    k: usize,
    event: &str,
    repeat: usize,
) -> Result<serde_json::Value> {
    let tag = format!("m{k}{event}");
    let mut row = crate::view_timing::time_events(net, &mut Plain, k, event, repeat, &tag).await?;
    row["bench"] = json!("membership");
    row["clients"] = json!(k);
    Ok(row)
}

/// Cuts the last daemon off from the others (or heals the cut).
pub(crate) async fn partition(net: &Network, cut: bool) -> Result<()> {
    let n = net.daemons.len();
    let names: Vec<String> = net.cfg.daemon.iter().map(|d| d.name.clone()).collect();
    let sets = cut.then(|| vec![names[..n - 1].to_vec(), vec![names[n - 1].clone()]]);
    split(net, sets).await
}

/// Splits the daemons into `sets` (each reaches only those of its own), or heals every split.
pub(crate) async fn split(net: &Network, sets: Option<Vec<Vec<String>>>) -> Result<()> {
    let req = match sets {
        Some(sets) => AdminRequest::Partition { sets },
        None => AdminRequest::Heal,
    };
    admin_all(net, req).await
}

/// Sends `req` to every daemon; the first refusal is the error.
pub(crate) async fn admin_all(net: &Network, req: AdminRequest) -> Result<()> {
    for d in &net.daemons {
        let r = d.admin(req.clone()).await;
        if !r.ok {
            bail!("{}", r.error.unwrap_or_default());
        }
    }
    Ok(())
}
