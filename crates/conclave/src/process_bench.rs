//! `conclave bench throughput --processes` and `bench latency --processes`: the load as
//! deployed. Every daemon is a `conclave daemon` process of its own, and every member a
//! `conclave bench member` process: a client that connects, joins, sends or counts, and talks to
//! the bench over its standard input and output (one JSON line per step). The in-process mode
//! (every daemon and client on one runtime) stays for profiling; this one is what a deployment
//! pays, system calls, wake-ups and copies between processes included.
//!
//! The steps, for every member at once: connect and join, print `{"ready":..}` once the view has
//! every member; on `go`, senders send for the configured time while everyone counts what it
//! delivers; each prints `{"sent":..}`; on `total N` (what was sent, less what the daemons
//! refused) each waits until it has delivered N (or deliveries stop after a view change) and
//! prints its count and the time of its last delivery. A member's rate is its count over that
//! time, measured from its own `go`. For latency (`--rate`), senders pace their messages and
//! stamp each with the system clock, and each member also prints every delivery's delay.

use crate::net_bench::{percentile, wait_view, Load, Mutex64};
use crate::user_cmd::service_name;
use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_client::{Address, Client, ClientError, ClientEvent, ServiceType};
use conclave_daemon::{AdminRequest, Config};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Messages a member hands its client library before it writes them out (as in-process).
const BATCH: u64 = 32;

/// How the members reach their daemons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Loopback TCP.
    Tcp,
    /// The daemons' `shm` sockets: replies through shared memory.
    Shm,
}

impl Transport {
    pub(crate) fn parse(name: &str) -> Result<Transport> {
        Ok(match name {
            "tcp" => Transport::Tcp,
            "shm" => Transport::Shm,
            _ => bail!("unknown transport {name:?}: tcp or shm"),
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
        }
    }
}

/// The daemons of a configuration, each a `conclave daemon` process of this binary.
pub(crate) struct Daemons {
    cfg: Config,
    transport: Transport,
    dir: PathBuf,
    children: Vec<Child>,
    /// Relays of the limit run in the daemons' places (`cfg`'s ports), not daemons; each ends
    /// when its input closes.
    relays: Vec<ChildStdin>,
}

impl Daemons {
    /// Writes `cfg` (with fresh identities) into a directory of its own and starts its daemons;
    /// returns once they form one ring. A port picked free can be taken by another program
    /// before a daemon binds it: then the daemons start again on other ports (three times).
    pub(crate) async fn start(mut cfg: Config, transport: Transport) -> Result<Daemons> {
        for attempt in 1..=3 {
            match Self::start_once(cfg.clone(), transport).await {
                Ok(d) => return Ok(d),
                Err(Started::Failed(e)) => return Err(e),
                Err(Started::PortTaken) if attempt < 3 => cfg = on_other_ports(cfg)?,
                Err(Started::PortTaken) => {}
            }
        }
        bail!("a daemon process ended at its start, three times")
    }

    async fn start_once(cfg: Config, transport: Transport) -> Result<Daemons, Started> {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "conclave-bench-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut cfg = cfg.with_identity_files(&dir, &mut rand_core::OsRng)?;
        if transport == Transport::Shm {
            for d in &mut cfg.daemon {
                d.shm = Some(dir.join(format!("{}.shm", d.name)));
            }
        }
        let path = dir.join("conclave.toml");
        std::fs::write(&path, config_text(&cfg))?;
        let exe = std::env::current_exe()?;
        let mut children = Vec::new();
        // CONCLAVE_BENCH_RECORD=DIR records each daemon's history there (for the checker), as
        // in-process.
        let record = std::env::var_os("CONCLAVE_BENCH_RECORD").map(PathBuf::from);
        for d in &cfg.daemon {
            let mut cmd = Command::new(&exe);
            cmd.args(["daemon", "--config"])
                .arg(&path)
                .args(["--name", &d.name, "--log", "warn"]);
            if let Some(dir) = &record {
                cmd.arg("--record")
                    .arg(dir.join(format!("{}.jsonl", d.name)));
            }
            children.push(
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .context("starting a daemon process")?,
            );
        }
        let mut net = Daemons {
            cfg,
            transport,
            dir,
            children,
            relays: Vec::new(),
        };
        net.wait_ring().await?;
        Ok(net)
    }

    /// `n` relays (`bench relay`) on free ports, for the machine's limit (on other ports again if
    /// one could not bind its own, three times).
    pub(crate) async fn start_relays(n: usize) -> Result<Daemons> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_relays_on(Config::local_on_free_ports(n)?).await {
                Ok(r) => return Ok(r),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried"))
    }

    async fn start_relays_on(cfg: Config) -> Result<Daemons> {
        let exe = std::env::current_exe()?;
        let (mut children, mut relays) = (Vec::new(), Vec::new());
        for d in &cfg.daemon {
            let others: Vec<String> = cfg
                .daemon
                .iter()
                .filter(|o| o.name != d.name)
                .map(|o| o.peer.to_string())
                .collect();
            let mut c = Command::new(&exe)
                .args(["bench", "relay", "--listen"])
                .arg(
                    d.client
                        .context("a daemon without a client port")?
                        .to_string(),
                )
                .args(["--peer", &d.peer.to_string(), "--peers", &others.join(",")])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("starting a relay process")?;
            let mut out = BufReader::new(c.stdout.take().context("the relay's output")?).lines();
            let line = tokio::time::timeout(Duration::from_secs(10), out.next_line())
                .await
                .context("a relay did not start in 10 s")??;
            if !line.is_some_and(|l| l.contains("listening")) {
                bail!("a relay did not start");
            }
            relays.push(c.stdin.take().context("the relay's input")?);
            children.push(c);
        }
        Ok(Daemons {
            cfg,
            transport: Transport::Tcp,
            dir: PathBuf::new(),
            children,
            relays,
        })
    }

    async fn wait_ring(&mut self) -> Result<(), Started> {
        let n = self.cfg.daemon.len();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // A daemon that ended already could not bind its ports.
            if self
                .children
                .iter_mut()
                .any(|c| c.try_wait().ok().flatten().is_some())
            {
                return Err(Started::PortTaken);
            }
            let mut ok = true;
            for d in &self.cfg.daemon {
                let s = self.status(d).await;
                ok &= s.is_some_and(|s| s.ready && s.members.len() == n);
            }
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Started::Failed(anyhow::anyhow!(
                    "the {n} daemon processes did not form a ring in 30 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn status(
        &self,
        d: &conclave_daemon::config::DaemonEntry,
    ) -> Option<conclave_daemon::Status> {
        let identity = conclave_daemon::read_identity(d.identity.as_ref()?).ok()?;
        conclave_daemon::endpoints::ask(d.admin?, &d.name, &identity, &AdminRequest::Status)
            .await
            .ok()?
            .status
    }

    /// Every daemon's ring and message counts, for an error that needs them.
    async fn statuses(&self) -> String {
        if !self.relays.is_empty() {
            return "relays of the limit run".into();
        }
        let mut st = Vec::new();
        for d in &self.cfg.daemon {
            st.push(match self.status(d).await {
                Some(s) => format!("{}: ring {:?} ready {}", d.name, s.members, s.ready),
                None => format!("{}: no answer", d.name),
            });
        }
        st.join("; ")
    }

    /// Runs `load` with every member a process of its own (member i on daemon i mod n).
    pub(crate) async fn throughput(&self, load: &Load, tag: &str) -> Result<Value> {
        let &Load {
            receivers,
            senders,
            size,
            service,
            seconds,
        } = load;
        let mut members = Vec::new();
        for i in 0..receivers {
            let group = format!("{tag}bench");
            let mut cmd = self.member_command(i, receivers, tag, &group, service, seconds)?;
            if i < senders {
                cmd.arg("--send").arg(size.to_string());
            }
            if !self.relays.is_empty() {
                cmd.arg("--skeleton");
            }
            members.push(MemberProcess::spawn(cmd)?);
        }
        for (i, m) in members.iter_mut().enumerate() {
            if let Err(e) = m.expect("ready", Duration::from_secs(60)).await {
                bail!(
                    "member {i} of {receivers} ({tag}) saw no view of all: {e:#} ({})",
                    self.statuses().await
                );
            }
        }
        let cpu_before: f64 = self.children.iter().map(cpu_seconds).sum();
        for m in &mut members {
            m.say("go").await?;
        }
        // The daemons' memory together (all of it, and what they allocated), sampled while the
        // senders send.
        let pids: Vec<u32> = self.children.iter().filter_map(|c| c.id()).collect();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let sampling = tokio::spawn(async move {
            let sum = |field| -> u64 {
                pids.iter()
                    .map(|p| proc_status_number(&format!("/proc/{p}/status"), field))
                    .sum()
            };
            let mut most = (0, 0);
            loop {
                most = (most.0.max(sum("VmRSS:")), most.1.max(sum("RssAnon:")));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = &mut stopped => return most,
                }
            }
        });
        // A sender is silent while it sends.
        let (sent, refused) = sent_and_refused(&mut members, seconds).await?;
        let _ = stop.send(());
        let (rss, anon) = sampling.await?;
        let total = sent.saturating_sub(refused);
        for m in &mut members {
            m.say(&format!("total {total}")).await?;
        }
        let mut got = Vec::new();
        let (mut views, mut rates, mut cpu_members) = (0, Vec::new(), 0.0);
        for m in &mut members {
            let r = m.expect("got", Duration::from_secs(60)).await?;
            let (g, last) = (
                r["got"].as_u64().unwrap_or(0),
                r["last_ns"].as_u64().unwrap_or(0),
            );
            views += r["views"].as_u64().unwrap_or(0);
            cpu_members += r["cpu_s"].as_f64().unwrap_or(0.0);
            rates.push(if last == 0 {
                0.0
            } else {
                g as f64 / (last as f64 / 1e9)
            });
            got.push(g);
        }
        let cpu_daemons = self.children.iter().map(cpu_seconds).sum::<f64>() - cpu_before;
        for m in members {
            m.finish().await;
        }
        // Relays drop what a full buffer does not take (nothing retransmits): the row says how
        // much. Daemons lose nothing outside a view change.
        if views == 0 && self.relays.is_empty() && got.iter().any(|&g| g < total) {
            bail!(
                "members delivered {got:?} of the {total} sent ({})",
                self.statuses().await
            );
        }
        let min = rates.iter().cloned().fold(f64::INFINITY, f64::min);
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        // The members leave before the next configuration joins.
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(json!({
            "bench": "throughput",
            "deployment": if self.relays.is_empty() { "processes" } else { "limit" },
            "transport": self.transport.name(),
            "daemons": self.cfg.daemon.len(), "members": receivers,
            "senders": senders, "size": size, "service": service_name(service),
            "messages": total, "refused": refused,
            "delivered_min": got.iter().min().copied().unwrap_or(0),
            "view_changes": views,
            "msgs_per_s_min": min.round(), "msgs_per_s_mean": mean.round(),
            "mbytes_per_s_min": (min * size as f64 / 1e6 * 10.0).round() / 10.0,
            "daemons_rss_mib": (rss as f64 / 1024.0).round(),
            "daemons_anon_mib": (anon as f64 / 1024.0).round(),
            "cpu_daemons_s": (cpu_daemons * 100.0).round() / 100.0,
            "cpu_members_s": (cpu_members * 100.0).round() / 100.0,
        }))
    }

    /// Member `i` (named from `tag`) of a load of `members` in `group`, on daemon i mod n:
    /// the `bench member` command, to which a sender adds what it sends.
    fn member_command(
        &self,
        i: usize,
        members: usize,
        tag: &str,
        group: &str,
        service: ServiceType,
        seconds: f64,
    ) -> Result<Command> {
        let d = &self.cfg.daemon[i % self.cfg.daemon.len()];
        let address = match &d.shm {
            Some(p) => format!("shm:{}", p.display()),
            None => d
                .client
                .context("a daemon without a client port")?
                .to_string(),
        };
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["bench", "member", "--address"])
            .arg(address)
            .args(["--name", &format!("{tag}{i}"), "--group", group])
            .arg("--members")
            .arg(members.to_string())
            .args(["--service", service_name(service), "--seconds"])
            .arg(seconds.to_string());
        Ok(cmd)
    }

    /// `bench latency` as deployed: a member process on each daemon, each sending its share of
    /// `rate` messages per second for `seconds`, every member noting each delivery's delay. On
    /// relays (the limit), skeleton members send and time frames alike.
    pub(crate) async fn latency(
        &self,
        rate: u64,
        size: usize,
        service: ServiceType,
        seconds: f64,
        tag: &str,
    ) -> Result<Value> {
        let n = self.cfg.daemon.len();
        let mut members = Vec::new();
        for i in 0..n {
            let group = format!("{tag}lat");
            let mut cmd = self.member_command(i, n, tag, &group, service, seconds)?;
            cmd.arg("--send")
                .arg(size.to_string())
                .arg("--rate")
                .arg((rate as f64 / n as f64).to_string())
                .arg("--phase")
                .arg((i as f64 / n as f64).to_string());
            if !self.relays.is_empty() {
                cmd.arg("--skeleton");
            }
            members.push(MemberProcess::spawn(cmd)?);
        }
        for m in &mut members {
            m.expect("ready", Duration::from_secs(60)).await?;
        }
        let cpu_before: f64 = self.children.iter().map(cpu_seconds).sum();
        let wakeups_before: u64 = self.children.iter().map(wakeups).sum();
        for m in &mut members {
            m.say("go").await?;
        }
        let (sent, refused) = sent_and_refused(&mut members, seconds).await?;
        let cpu_daemons = self.children.iter().map(cpu_seconds).sum::<f64>() - cpu_before;
        let wakeups_daemons = self
            .children
            .iter()
            .map(wakeups)
            .sum::<u64>()
            .saturating_sub(wakeups_before);
        let total = sent.saturating_sub(refused);
        for m in &mut members {
            m.say(&format!("total {total}")).await?;
        }
        let (mut delays, mut got, mut views) = (Vec::new(), Vec::new(), 0);
        let (mut cpu_members, mut wakeups_members) = (0.0, 0);
        for m in &mut members {
            let r = m.expect("got", Duration::from_secs(60)).await?;
            got.push(r["got"].as_u64().unwrap_or(0));
            views += r["views"].as_u64().unwrap_or(0);
            cpu_members += r["sending_cpu_s"].as_f64().unwrap_or(0.0);
            wakeups_members += r["sending_wakeups"].as_u64().unwrap_or(0);
            let all = r["delays_us"].as_array().into_iter().flatten();
            delays.extend(all.filter_map(|d| d.as_u64()));
        }
        for m in members {
            m.finish().await;
        }
        // Percentiles over part of the deliveries would say nothing. Relays retransmit nothing,
        // so there the row says how many were lost.
        if views > 0 || self.relays.is_empty() && got.iter().any(|&g| g < total) {
            bail!(
                "members delivered {got:?} of the {total} sent at {rate}/s, with {views} view \
                 changes ({})",
                self.statuses().await
            );
        }
        delays.sort_unstable();
        let lost = (total * n as u64).saturating_sub(delays.len() as u64);
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(json!({
            "bench": "latency",
            "deployment": if self.relays.is_empty() { "processes" } else { "limit" },
            "daemons": n, "senders": n,
            "transport": self.transport.name(),
            // A member's payload holds at least its name's hash and a count.
            "size": size.max(16), "service": service_name(service), "rate": rate,
            "deliveries": delays.len(), "lost": lost,
            "refused": refused, "view_changes": views,
            "p50_us": percentile(&delays, 0.5), "p99_us": percentile(&delays, 0.99),
            "max_us": delays.last().copied().unwrap_or(0),
            // While the senders sent: what a message cost the daemons and the members together,
            // in processor time and in times a process slept and was woken.
            "cpu_daemons_us_per_msg": per_message(cpu_daemons * 1e6, sent),
            "cpu_members_us_per_msg": per_message(cpu_members * 1e6, sent),
            "wakeups_daemons_per_msg": per_message(wakeups_daemons as f64, sent),
            "wakeups_members_per_msg": per_message(wakeups_members as f64, sent),
        }))
    }

    /// Stops the daemons (SIGTERM, then a kill if one lingers); their directory goes with them.
    pub(crate) async fn stop(mut self) -> Result<()> {
        self.relays.clear();
        for c in &self.children {
            if let Some(pid) = c.id() {
                // The daemon's own shutdown: it leaves the ring cleanly.
                let _ = std::process::Command::new("kill")
                    .arg(pid.to_string())
                    .status();
            }
        }
        for c in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(5), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
        Ok(())
    }
}

/// Why a start of the daemons did not give a ring.
enum Started {
    /// A daemon process ended at once (its ports were taken meanwhile): worth a second try.
    PortTaken,
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Started {
    fn from(e: anyhow::Error) -> Started {
        Started::Failed(e)
    }
}

impl From<std::io::Error> for Started {
    fn from(e: std::io::Error) -> Started {
        Started::Failed(e.into())
    }
}

/// `cfg` with the ports of other free ones (names, keys and settings kept).
fn on_other_ports(mut cfg: Config) -> Result<Config> {
    let fresh = Config::local_on_free_ports(cfg.daemon.len())?;
    for (d, f) in cfg.daemon.iter_mut().zip(fresh.daemon) {
        (d.peer, d.client, d.admin) = (f.peer, f.client, f.admin);
    }
    Ok(cfg)
}

impl Drop for Daemons {
    /// On an error's way out too: the directory holds the daemons' identity files. (The
    /// children are killed with their handles.)
    fn drop(&mut self) {
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The configuration file of `cfg`'s daemons (names, ports, keys, identity files, link mode).
fn config_text(cfg: &Config) -> String {
    let mut s = format!("[links]\nmode = \"{}\"\n\n", cfg.links.mode.name());
    for d in &cfg.daemon {
        s += &format!("[[daemon]]\nname = \"{}\"\npeer = \"{}\"\n", d.name, d.peer);
        if let Some(a) = d.client {
            s += &format!("client = \"{a}\"\n");
        }
        if let Some(a) = d.admin {
            s += &format!("admin = \"{a}\"\n");
        }
        if let Some(k) = &d.key {
            s += &format!("key = \"{k}\"\n");
        }
        if let Some(p) = &d.identity {
            s += &format!("identity = {:?}\n", p.display().to_string());
        }
        if let Some(p) = &d.shm {
            s += &format!("shm = {:?}\n", p.display().to_string());
        }
        s += "\n";
    }
    s
}

/// A numeric field of a `/proc/PID/status` file, sizes in KiB (0 where there is no such file:
/// not Linux).
fn proc_status_number(path: &str, field: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// How often a process has slept and been woken so far (its voluntary context switches).
fn wakeups(c: &Child) -> u64 {
    c.id()
        .map(|pid| status_wakeups(&format!("/proc/{pid}/status")))
        .unwrap_or(0)
}

/// [`wakeups`], from a `/proc/PID/status` file.
fn status_wakeups(path: &str) -> u64 {
    proc_status_number(path, "voluntary_ctxt_switches:")
}

/// Processor time (user and system, all threads) of a process so far, from `/proc/PID/stat`.
fn cpu_seconds(c: &Child) -> f64 {
    c.id()
        .map(|pid| stat_cpu_seconds(&format!("/proc/{pid}/stat")))
        .unwrap_or(0.0)
}

fn stat_cpu_seconds(path: &str) -> f64 {
    // The fields after the command's name (which may hold spaces, so after its closing
    // parenthesis): utime and stime are the 12th and 13th, in ticks of USER_HZ (100 on Linux).
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / 100.0)
        })
        .unwrap_or(0.0)
}

/// `x` per message of `messages`, to a tenth.
fn per_message(x: f64, messages: u64) -> f64 {
    (x * 10.0 / messages.max(1) as f64).round() / 10.0
}

/// Every member's "sent" line, once its `seconds` of sending are over: messages sent and
/// refused, added up.
async fn sent_and_refused(members: &mut [MemberProcess], seconds: f64) -> Result<(u64, u64)> {
    let (mut sent, mut refused) = (0, 0);
    for m in members {
        let r = m
            .expect("sent", Duration::from_secs_f64(seconds + 60.0))
            .await?;
        sent += r["sent"].as_u64().unwrap_or(0);
        refused += r["refused"].as_u64().unwrap_or(0);
    }
    Ok((sent, refused))
}

/// A member process and the pipes the bench steps it through.
struct MemberProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl MemberProcess {
    fn spawn(mut cmd: Command) -> Result<MemberProcess> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting a member process")?;
        let stdin = child.stdin.take().context("the member's input")?;
        let stdout = BufReader::new(child.stdout.take().context("the member's output")?).lines();
        Ok(MemberProcess {
            child,
            stdin,
            stdout,
        })
    }

    async fn say(&mut self, line: &str) -> Result<()> {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        Ok(self.stdin.flush().await?)
    }

    /// The member's next line, which must hold `key` (an error line or the end of the process
    /// is an error, and so is silence for `wait`).
    async fn expect(&mut self, key: &str, wait: Duration) -> Result<Value> {
        let line = tokio::time::timeout(wait, self.stdout.next_line())
            .await
            .with_context(|| format!("no {key:?} from a member in {wait:?}"))??
            .with_context(|| format!("a member ended before {key:?}"))?;
        let v: Value = serde_json::from_str(&line).with_context(|| format!("member: {line}"))?;
        if let Some(e) = v.get("error") {
            bail!("{}", e.as_str().unwrap_or_default());
        }
        if v.get(key).is_none() {
            bail!("a member said {line}, not {key:?}");
        }
        Ok(v)
    }

    async fn finish(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// `conclave bench member`: one member of `bench throughput --processes` or `bench latency
/// --processes` (not for direct use).
#[derive(Args)]
pub struct MemberArgs {
    /// The daemon's client address (`host:port`, or `shm:/path`).
    #[arg(long)]
    address: String,
    #[arg(long)]
    name: String,
    /// The group (a fresh one per load: a member of the load before may still be leaving).
    #[arg(long, default_value = "bench")]
    group: String,
    /// The view to wait for before saying it is ready.
    #[arg(long)]
    members: usize,
    /// Send messages of this many bytes (otherwise only count).
    #[arg(long)]
    send: Option<usize>,
    #[arg(long, default_value = "agreed")]
    service: String,
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// A member of the limit run: frames on a bare socket to a relay (`bench relay`).
    #[arg(long)]
    skeleton: bool,
    /// Latency: send at this rate (messages per second) rather than as fast as the daemon
    /// takes them, each message carrying its send time on the system clock; report the delay
    /// of every delivery.
    #[arg(long, requires = "send")]
    rate: Option<f64>,
    /// With `--rate`: start this fraction of an interval late, so that the senders of a load
    /// take turns rather than all sending in the same instant.
    #[arg(long, default_value_t = 0.0, requires = "rate", value_parser = parse_phase)]
    phase: f64,
}

/// A fraction of an interval, from 0 to 1.
fn parse_phase(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{s:?} is not a fraction from 0 to 1")),
    }
}

/// Runs one member; any failure is a JSON line `{"error": ..}` for the bench to report.
pub fn run_member(args: MemberArgs) -> Result<()> {
    // One thread, as a small client would: the member's work is the client library's.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Err(e) = rt.block_on(member(args)) {
        println!("{}", json!({ "error": format!("{e:#}") }));
    }
    Ok(())
}

/// What a member counts while it runs.
#[derive(Clone, Default)]
struct Counts {
    got: Arc<AtomicU64>,
    /// When the last delivery came, in ns from `go`.
    last: Arc<Mutex64>,
    views: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    /// With `--rate`: each delivery's delay from its send, in microseconds.
    delays: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl Counts {
    /// A delivery: counted, and (`timed`, with `--rate`) its delay noted from the send time its
    /// payload starts with. Its time is noted by [`Counts::settled`], once for what one wake-up
    /// brought: a clock read per message was a fiftieth of the machine's time at full load.
    fn delivered(&self, timed: bool, payload: &[u8]) {
        if timed {
            let sent = payload.get(..8).and_then(|b| b.try_into().ok());
            let delay = clock_ns().saturating_sub(sent.map_or(0, u64::from_be_bytes)) / 1000;
            self.delays
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(delay);
        }
        self.got.fetch_add(1, Relaxed);
    }

    /// Called before the member waits for more: the time of the last delivery, if any came
    /// since the last call (`seen`, the count then).
    fn settled(&self, start: Instant, seen: &mut u64) {
        let got = self.got.load(Relaxed);
        if got != *seen {
            *seen = got;
            self.last.set(start.elapsed().as_nanos() as u64);
        }
    }
}

/// Nanoseconds on the system clock, which every process on the machine reads alike.
fn clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How a member sends: through the client library, or (the limit) frames on a bare socket.
enum Sending {
    Client(conclave_client::Sender),
    Frames(tokio::net::tcp::OwnedWriteHalf),
}

async fn member(args: MemberArgs) -> Result<()> {
    let service = crate::user_cmd::parse_service(&args.service)
        .with_context(|| format!("no service type {:?}", args.service))?;
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let counts = Counts::default();
    let timed = args.rate.is_some();
    let (mut sending, start, counting) = if args.skeleton {
        let s = tokio::net::TcpStream::connect(&args.address).await?;
        s.set_nodelay(true)?;
        let (r, w) = s.into_split();
        let start = ready(&mut input).await?;
        let c = counts.clone();
        let counting = tokio::spawn(async move {
            let mut seen = 0;
            crate::limit_bench::count_frames(
                r,
                |frame| c.delivered(timed, frame),
                || c.settled(start, &mut seen),
            )
            .await
        });
        (Sending::Frames(w), start, counting)
    } else {
        let address: Address = args.address.parse()?;
        let mut c = Client::connect(&address, &args.name).await?;
        c.join(&args.group).await?;
        let (tx, mut rx) = c.split();
        wait_view(&mut rx, args.members).await?;
        let start = ready(&mut input).await?;
        let c = counts.clone();
        let counting = tokio::spawn(async move {
            let mut seen = 0;
            loop {
                let event = match rx.try_receive() {
                    Some(event) => event,
                    None => {
                        c.settled(start, &mut seen);
                        rx.receive().await
                    }
                };
                match event {
                    Ok(ClientEvent::Message { payload, .. }) => c.delivered(timed, &payload),
                    Ok(ClientEvent::View { .. }) => {
                        c.views.fetch_add(1, Relaxed);
                    }
                    Err(ClientError::Refused { .. }) => {
                        c.refused.fetch_add(1, Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        (Sending::Client(tx), start, counting)
    };
    let until = start + Duration::from_secs_f64(args.seconds);
    let own = || {
        (
            stat_cpu_seconds("/proc/self/stat"),
            status_wakeups("/proc/self/status"),
        )
    };
    let at_go = own();
    let mut sent = 0u64;
    if let Some(size) = args.send {
        // Each payload its own (the sender and a count first), as in-process.
        let mut payload = vec![0x5a; size.max(16)];
        payload[..8].copy_from_slice(&hash(&args.name).to_be_bytes());
        if let Some(rate) = args.rate {
            let interval = Duration::from_secs_f64(1.0 / rate.max(0.001));
            let mut next = tokio::time::Instant::now() + interval.mul_f64(args.phase);
            let mut frame = Vec::new();
            while Instant::now() < until {
                next += interval;
                tokio::time::sleep_until(next).await;
                payload[..8].copy_from_slice(&clock_ns().to_be_bytes());
                match &mut sending {
                    Sending::Client(tx) => {
                        tx.multicast(service, &[args.group.as_str()], &payload)
                            .await?
                    }
                    Sending::Frames(w) => {
                        crate::limit_bench::send_frame(w, &mut frame, &payload).await?
                    }
                }
                sent += 1;
            }
        } else {
            match &mut sending {
                Sending::Client(tx) => {
                    // The clock is read once a batch, as the limit's sender does.
                    while Instant::now() < until {
                        for _ in 0..BATCH {
                            payload[8..16].copy_from_slice(&sent.to_be_bytes());
                            tx.queue(service, &[args.group.as_str()], &payload).await?;
                            sent += 1;
                        }
                        tx.flush().await?;
                    }
                    tx.flush().await?;
                }
                Sending::Frames(w) => {
                    sent = crate::limit_bench::send_frames(w, &mut payload, until).await?;
                }
            }
        }
        // Refusals come back after the sends: those of the last messages are awaited a moment.
        tokio::time::sleep(Duration::from_millis(100)).await;
    } else {
        tokio::time::sleep_until(until.into()).await;
    }
    let at_sent = own();
    say(json!({ "sent": sent, "refused": counts.refused.load(Relaxed) }));
    let line = input.next_line().await?.unwrap_or_default();
    let total: u64 = line
        .strip_prefix("total ")
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("expected a total, got {line:?}"))?;
    // Every message sent, or until deliveries stop: after a view change, or at once in the
    // limit (where nothing retransmits what a full buffer dropped).
    let quiet = if args.skeleton { 1 } else { 2 };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut still = (Instant::now(), 0u64);
    while counts.got.load(Relaxed) < total && Instant::now() < deadline {
        let now = counts.got.load(Relaxed);
        if now != still.1 {
            still = (Instant::now(), now);
        }
        if (args.skeleton || counts.views.load(Relaxed) > 0)
            && still.0.elapsed() > Duration::from_secs(quiet)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delays = std::mem::take(&mut *counts.delays.lock().unwrap_or_else(|p| p.into_inner()));
    say(json!({
        "got": counts.got.load(Relaxed), "last_ns": counts.last.get(),
        "views": counts.views.load(Relaxed), "cpu_s": stat_cpu_seconds("/proc/self/stat"),
        "sending_cpu_s": at_sent.0 - at_go.0, "sending_wakeups": at_sent.1.saturating_sub(at_go.1),
        "delays_us": delays,
    }));
    // Every member stays until all have counted (the bench closes their input): one that
    // left earlier would change the others' view while they still count.
    let _ = input.next_line().await;
    if let Sending::Client(mut tx) = sending {
        let _ = tx.disconnect().await;
    }
    counting.abort();
    Ok(())
}

/// Says the member is ready and waits for `go`; the time of `go` is the member's start.
async fn ready(input: &mut Lines<BufReader<tokio::io::Stdin>>) -> Result<Instant> {
    say(json!({ "ready": true }));
    let go = input.next_line().await?;
    if go.as_deref() != Some("go") {
        bail!("expected go, got {go:?}");
    }
    Ok(Instant::now())
}

fn say(v: Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// A member's number in its payloads, from its name.
fn hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_is_a_fraction_of_an_interval() {
        assert_eq!(parse_phase("0.5"), Ok(0.5));
        assert_eq!(parse_phase("1"), Ok(1.0));
        for bad in ["nan", "-0.1", "1.5", "inf", "x"] {
            assert!(parse_phase(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_the_fields_of_proc_files() {
        let dir = std::env::temp_dir().join(format!("conclave-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let status = dir.join("status");
        std::fs::write(
            &status,
            "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nvoluntary_ctxt_switches:\t42\n\
             nonvoluntary_ctxt_switches:\t7\n",
        )
        .unwrap();
        assert_eq!(status_wakeups(status.to_str().unwrap()), 42);
        assert_eq!(proc_status_number(status.to_str().unwrap(), "VmRSS:"), 1024);
        assert_eq!(proc_status_number(status.to_str().unwrap(), "VmHWM:"), 2048);
        assert_eq!(proc_status_number(status.to_str().unwrap(), "VmSwap:"), 0);
        let stat = dir.join("stat");
        // A command name with spaces and a parenthesis: the fields count from the last one.
        std::fs::write(
            &stat,
            "42 (a b) c) S 1 42 42 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 3 0\n",
        )
        .unwrap();
        assert_eq!(stat_cpu_seconds(stat.to_str().unwrap()), 3.0);
        assert_eq!(stat_cpu_seconds(dir.join("none").to_str().unwrap()), 0.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writes_a_configuration_the_daemons_read_back() {
        let mut cfg = Config::local(3, 7000);
        cfg.links.mode = conclave_daemon::link::LinkMode::Off;
        let (cfg, _) = cfg.with_identities(&mut rand_core::OsRng);
        let back = Config::parse(&config_text(&cfg)).unwrap();
        assert_eq!(back.daemon, cfg.daemon);
        assert_eq!(back.links.mode, conclave_daemon::link::LinkMode::Off);
    }
}
