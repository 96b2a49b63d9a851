//! The real binary: daemon processes on this machine, clients over TCP, faults from the daemons'
//! own injection, a `kill -9` and a restart, every service type in flight; then the checker reads
//! the daemons' recorded histories. Nothing may be violated, and every message sent in the final
//! view must reach every member of it.

use conclave_client::{Address, Client, ClientError, ClientEvent, Sender, ServiceType};
use conclave_daemon::{AdminReply, AdminRequest, Config};
use conclave_history::record::{read, write};
use conclave_history::{check, Event, Record};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const SERVICES: [ServiceType; 6] = [
    ServiceType::Unreliable,
    ServiceType::Reliable,
    ServiceType::Fifo,
    ServiceType::Causal,
    ServiceType::Agreed,
    ServiceType::Safe,
];

fn config_text(c: &Config) -> String {
    let mut s = String::from("[core]\nflush_timeout_ms = 5000\n\n");
    for d in &c.daemon {
        s += &format!(
            "[[daemon]]\nname = \"{}\"\npeer = \"{}\"\nclient = \"{}\"\nadmin = \"{}\"\nmetrics = \"{}\"\n\n",
            d.name,
            d.peer,
            d.client.unwrap(),
            d.admin.unwrap(),
            d.metrics.unwrap()
        );
    }
    s
}

struct Net {
    dir: PathBuf,
    cfg: Config,
    cfg_path: PathBuf,
    children: Vec<Option<Child>>,
}

impl Net {
    fn record(&self, i: usize) -> PathBuf {
        self.dir.join(format!("d{}.jsonl", i + 1))
    }

    fn spawn(&mut self, i: usize) {
        let child = Command::new(env!("CARGO_BIN_EXE_conclave"))
            .args(["daemon", "--config"])
            .arg(&self.cfg_path)
            .args([
                "--name",
                &format!("d{}", i + 1),
                "--log",
                "warn",
                "--record",
            ])
            .arg(self.record(i))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the conclave binary runs");
        self.children[i] = Some(child);
    }

    async fn admin(&self, i: usize, req: &AdminRequest) -> Option<AdminReply> {
        let addr = self.cfg.daemon[i].admin.unwrap();
        let s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let (r, mut w) = s.into_split();
        let mut line = serde_json::to_vec(req).unwrap();
        line.push(b'\n');
        w.write_all(&line).await.ok()?;
        let mut answer = String::new();
        BufReader::new(r).read_line(&mut answer).await.ok()?;
        serde_json::from_str(answer.trim()).ok()
    }

    /// Waits until the daemons `alive` form one ring of exactly them, ready for clients.
    async fn wait_ring(&self, alive: &[usize]) {
        let want: Vec<String> = alive.iter().map(|i| format!("d{}", i + 1)).collect();
        for _ in 0..1000 {
            let mut ok = true;
            for &i in alive {
                let s = self
                    .admin(i, &AdminRequest::Status)
                    .await
                    .and_then(|r| r.status);
                ok &= s.is_some_and(|s| s.ready && s.members == want);
            }
            if ok {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the daemons {want:?} did not form a ring");
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What each client received, by its qualified name.
type Seen = Arc<Mutex<BTreeMap<String, Vec<ClientEvent>>>>;

struct Member {
    daemon: usize,
    name: String,
    /// Shared with the receiving task, which answers flush requests at once.
    sender: Arc<tokio::sync::Mutex<Sender>>,
    /// Payloads are unique across connections too (a message is named by its payload).
    connection: u64,
    count: u64,
}

static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

async fn connect(net: &Net, seen: &Seen, daemon: usize, private: &str, vs: bool) -> Member {
    let addr = Address::Tcp(net.cfg.daemon[daemon].client.unwrap().to_string());
    let mut c = Client::connect(&addr, private).await.expect("connects");
    if vs {
        c.join_vs("g").await.unwrap();
    } else {
        c.join("g").await.unwrap();
    }
    let (sender, mut rx) = c.split();
    let name = sender.name().to_owned();
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let (seen, who, acks) = (seen.clone(), name.clone(), sender.clone());
    tokio::spawn(async move {
        loop {
            match rx.receive().await {
                Ok(ev) => {
                    if let ClientEvent::FlushRequest { group, view } = &ev {
                        let _ = acks.lock().await.flush_ack(group, *view).await;
                    }
                    seen.lock()
                        .unwrap()
                        .entry(who.clone())
                        .or_default()
                        .push(ev);
                }
                Err(ClientError::Refused { .. }) => {}
                Err(_) => return,
            }
        }
    });
    Member {
        daemon,
        name,
        sender,
        connection: CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        count: 0,
    }
}

impl Member {
    async fn send(&mut self, service: ServiceType) -> Result<(), ClientError> {
        self.count += 1;
        let payload = format!("{}/{}/{}", self.name, self.connection, self.count);
        let mut s = self.sender.lock().await;
        s.multicast(service, &["g"], payload.as_bytes()).await
    }
}

/// Every member sends one message of each service type.
async fn round(members: &mut [Member]) {
    for m in members.iter_mut() {
        for s in SERVICES {
            let _ = m.send(s).await;
        }
    }
}

fn merged_history(net: &Net, extra: Vec<Record>) -> Vec<Record> {
    let mut all = extra;
    for i in 0..net.cfg.daemon.len() {
        let f = std::fs::File::open(net.record(i)).expect("a history per daemon");
        all.extend(read(std::io::BufReader::new(f)).expect("the history parses"));
    }
    // Each file is in its own order already; a stable sort by time keeps it.
    all.sort_by_key(|r| r.t);
    all
}

fn incarnations_in(path: &Path) -> BTreeMap<String, u32> {
    let f = std::fs::File::open(path).unwrap();
    let mut last = BTreeMap::new();
    for r in read(std::io::BufReader::new(f)).unwrap() {
        last.insert(r.p.clone(), r.inc);
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_survive_a_partition_a_kill_and_a_restart_with_nothing_lost() {
    let dir = std::env::temp_dir().join(format!("conclave-daemons-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = Config::local_on_free_ports(3).unwrap();
    let cfg_path = dir.join("conclave.toml");
    std::fs::write(&cfg_path, config_text(&cfg)).unwrap();
    let mut net = Net {
        dir: dir.clone(),
        cfg,
        cfg_path,
        children: vec![None, None, None],
    };
    for i in 0..3 {
        net.spawn(i);
    }
    net.wait_ring(&[0, 1, 2]).await;

    let seen: Seen = Arc::default();
    let mut members = Vec::new();
    for d in 0..3 {
        for (j, vs) in [(0, false), (1, true)] {
            members.push(connect(&net, &seen, d, &format!("c{j}"), vs).await);
        }
    }
    round(&mut members).await;

    // A partition: d3 alone.
    for i in 0..3 {
        let req = AdminRequest::Partition {
            sets: vec![vec!["d1".into(), "d2".into()], vec!["d3".into()]],
        };
        assert!(net.admin(i, &req).await.unwrap().ok);
    }
    net.wait_ring(&[0, 1]).await;
    net.wait_ring(&[2]).await;
    round(&mut members).await;
    for i in 0..3 {
        assert!(net.admin(i, &AdminRequest::Heal).await.unwrap().ok);
    }
    net.wait_ring(&[0, 1, 2]).await;
    round(&mut members).await;

    // kill -9 d2 with messages in flight.
    round(&mut members).await;
    let killed_at = conclave_daemon::record::wall_us();
    let mut child = net.children[1].take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let before = incarnations_in(&net.record(1));
    net.wait_ring(&[0, 2]).await;
    members.retain(|m| m.daemon != 1);
    round(&mut members).await;

    // d2 comes back as a new incarnation; its clients connect again.
    net.spawn(1);
    net.wait_ring(&[0, 1, 2]).await;
    for (j, vs) in [(0, false), (1, true)] {
        members.push(connect(&net, &seen, 1, &format!("c{j}"), vs).await);
    }
    let stable_at = conclave_daemon::record::wall_us();

    // Everyone is in one view of six; then each member sends once more in it.
    let names: BTreeSet<String> = members.iter().map(|m| m.name.clone()).collect();
    let last_view = |seen: &Seen, who: &str| -> Option<Vec<String>> {
        seen.lock()
            .unwrap()
            .get(who)?
            .iter()
            .rev()
            .find_map(|e| match e {
                ClientEvent::View { members, .. } => Some(members.clone()),
                _ => None,
            })
    };
    let everyone = names.iter().cloned().collect::<Vec<_>>();
    for _ in 0..500 {
        if names
            .iter()
            .all(|n| last_view(&seen, n).as_ref() == Some(&everyone))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in &names {
        assert_eq!(last_view(&seen, n).as_ref(), Some(&everyone), "{n}'s view");
    }
    let mut finals = Vec::new();
    for m in members.iter_mut() {
        m.send(ServiceType::Safe).await.unwrap();
        finals.push(format!("{}/{}/{}", m.name, m.connection, m.count));
    }
    let delivered = |seen: &Seen, who: &str, payload: &str| {
        seen.lock().unwrap().get(who).is_some_and(|evs| {
            evs.iter().any(
                |e| matches!(e, ClientEvent::Message { payload: p, .. } if p == payload.as_bytes()),
            )
        })
    };
    for _ in 0..500 {
        if names
            .iter()
            .all(|n| finals.iter().all(|p| delivered(&seen, n, p)))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in &names {
        for p in &finals {
            assert!(delivered(&seen, n, p), "{n} never delivered {p}");
        }
    }

    // The histories: the killed daemon and its clients crashed when it was killed.
    for i in [0, 1, 2] {
        let _ = net.admin(i, &AdminRequest::Shutdown).await;
    }
    for c in net.children.iter_mut().flatten() {
        let _ = c.wait();
    }
    let mut extra: Vec<Record> = before
        .into_iter()
        .filter(|(p, _)| !p.is_empty())
        .map(|(p, inc)| Record {
            t: killed_at,
            p,
            inc,
            ev: Event::Crash,
        })
        .collect();
    let mut processes: Vec<String> = (1..=3).map(|i| format!("d{i}")).collect();
    processes.extend(names.iter().cloned());
    extra.push(Record {
        t: stable_at,
        p: String::new(),
        inc: 0,
        ev: Event::Stable { processes },
    });
    let history = merged_history(&net, extra);
    // The shutdown at the end is not a fault: what it records after the final view is cut.
    let end = history
        .iter()
        .filter(|r| matches!(r.ev, Event::Crash) && r.t > stable_at)
        .map(|r| r.t)
        .min()
        .unwrap_or(u64::MAX);
    let history: Vec<Record> = history.into_iter().filter(|r| r.t < end).collect();
    let sends = history
        .iter()
        .filter(|r| matches!(r.ev, Event::Send { .. }))
        .count();
    assert!(sends >= 6 * 6 * 4, "only {sends} sends recorded");
    let v = check(&history, &conclave_history::Config::default());
    if !v.is_empty() {
        let out = dir.join("merged.jsonl");
        write(&history, std::fs::File::create(&out).unwrap()).unwrap();
        panic!(
            "{} violations (history in {}):\n{}",
            v.len(),
            out.display(),
            v.iter()
                .take(5)
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
