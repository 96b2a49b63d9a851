//! The real binary: daemon processes on this machine, clients over TCP, faults from the daemons'
//! own injection, a `kill -9` and a restart, every service type in flight; then the checker reads
//! the daemons' recorded histories. Nothing may be violated, and every message sent in the final
//! view must reach every member of it. The same run with secure groups adds the secure layer's
//! records (made by the clients: the daemons see only sealed payloads) to the daemons', and the
//! checker judges K1-K4 and K6 on them too.

use conclave_client::{Address, Client, ClientError, ClientEvent, Sender, ServiceType};
use conclave_daemon::{AdminReply, AdminRequest, Config};
use conclave_history::record::{read, write};
use conclave_history::{check, Event, Record};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
            "[[daemon]]\nname = \"{}\"\npeer = \"{}\"\nclient = \"{}\"\nadmin = \"{}\"\nkey = \"{}\"\nidentity = {:?}\n\n",
            d.name,
            d.peer,
            d.client.unwrap(),
            d.admin.unwrap(),
            d.key.as_ref().unwrap(),
            d.identity.as_ref().unwrap(),
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
        let d = &self.cfg.daemon[i];
        let identity = conclave_daemon::read_identity(d.identity.as_ref().unwrap()).unwrap();
        conclave_daemon::endpoints::ask(d.admin.unwrap(), &d.name, &identity, req)
            .await
            .ok()
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

/// The tests here run one at a time: each picks free ports and its daemons bind them later (and
/// bind them again after a restart), and a test beside it could take one meanwhile (a daemon
/// then failed with "address already in use" and its ring never formed).
static ONE_NETWORK_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_survive_a_partition_a_kill_and_a_restart_with_nothing_lost() {
    let _alone = ONE_NETWORK_AT_A_TIME.lock().await;
    let dir = std::env::temp_dir().join(format!("conclave-daemons-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = Config::local_on_free_ports(3)
        .unwrap()
        .with_identity_files(&dir, &mut rand_core::OsRng)
        .unwrap();
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
                ClientEvent::View { members, .. } => Some(members.to_vec()),
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

/// A secure client of the multi-process test: the test records what its secure layer installs
/// and refuses, as the simulator records its clients' (the daemons see only sealed payloads).
struct SecureMember {
    daemon: usize,
    name: String,
    tx: conclave_client::secure::SecureSender,
    /// Which connection of the test this is: a member that connects again under the same name
    /// sends other payloads.
    connection: u64,
    count: u64,
    seen: Arc<Mutex<SecureSeen>>,
}

static SECURE_CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Secure views (group -> members) and opened payloads, by member; and the secure layer's
/// records, each with the wall-clock time it was made at.
#[derive(Default)]
struct SecureSeen {
    views: BTreeMap<(String, String), Vec<String>>,
    opened: BTreeMap<String, BTreeSet<Vec<u8>>>,
    records: Vec<Record>,
}

const SECURE_GROUPS: [(&str, conclave_gka::ProtocolId); 2] = [
    ("s-tgdh", conclave_gka::ProtocolId::Tgdh),
    ("s-gdh", conclave_gka::ProtocolId::Gdh),
];

struct Trust {
    identities: BTreeMap<String, conclave_crypto::Identity>,
    directory: conclave_gka::Directory,
}

impl Trust {
    /// An identity for each private name; the directory names them unqualified (`c0` stands for
    /// `c0#d1`, `c0#d2`, ...), as a trust directory may.
    fn new(names: &[&str]) -> Trust {
        let mut identities = BTreeMap::new();
        let mut directory = conclave_gka::Directory::new();
        for (i, n) in names.iter().enumerate() {
            let id = conclave_crypto::Identity::ed25519_from_seed(&[i as u8 + 1; 32]).unwrap();
            directory.insert(n.to_string(), id.public());
            identities.insert(n.to_string(), id);
        }
        Trust {
            identities,
            directory,
        }
    }
}

async fn connect_secure(
    net: &Net,
    trust: &Trust,
    seen: &Arc<Mutex<SecureSeen>>,
    daemon: usize,
    private: &str,
) -> SecureMember {
    use conclave_client::secure::{SecureClient, SecureConfig, SecureEvent};
    let addr = Address::Tcp(net.cfg.daemon[daemon].client.unwrap().to_string());
    let c = Client::connect(&addr, private).await.expect("connects");
    let s = SecureClient::new(
        c,
        trust.identities[private].clone(),
        trust.directory.clone(),
    );
    let name = s.name().to_owned();
    let (mut tx, mut rx) = s.split();
    for (group, protocol) in SECURE_GROUPS {
        let cfg = SecureConfig {
            protocol,
            ..SecureConfig::default()
        };
        tx.join_secure(group, cfg).await.unwrap();
    }
    let (mine, who) = (seen.clone(), name.clone());
    tokio::spawn(async move {
        loop {
            let ev = match rx.receive().await {
                Ok(ev) => ev,
                Err(e) if !e.is_final() => continue,
                Err(_) => return,
            };
            let t = conclave_daemon::record::wall_us();
            let mut seen = mine.lock().unwrap();
            let record = |ev| Record {
                t,
                p: who.clone(),
                inc: 0,
                ev,
            };
            match ev {
                SecureEvent::View(v) => {
                    seen.views
                        .insert((who.clone(), v.group.clone()), v.members.to_vec());
                    let r = record(Event::SecureView {
                        group: v.group,
                        view: conclave_daemon::record::group_view_id(
                            &format!("d{}", v.view.ring.rep),
                            v.view,
                        ),
                        members: v.members.to_vec(),
                        key: v.fingerprint.to_string(),
                        without: v.without,
                    });
                    seen.records.push(r);
                }
                SecureEvent::Refused {
                    group,
                    sender,
                    error,
                } => {
                    let r = record(Event::SecureRefused {
                        group,
                        sender,
                        error: error.kind().into(),
                    });
                    seen.records.push(r);
                }
                SecureEvent::Message {
                    group,
                    sender,
                    view,
                    payload,
                    ..
                } => {
                    let r = record(Event::SecureDeliver {
                        msg: conclave_daemon::record::message_name(&sender, &group, &payload),
                        group,
                        sender,
                        view: conclave_daemon::record::group_view_id(
                            &format!("d{}", view.ring.rep),
                            view,
                        ),
                    });
                    seen.records.push(r);
                    seen.opened
                        .entry(who.clone())
                        .or_default()
                        .insert(payload.to_vec());
                }
                _ => {}
            }
        }
    });
    SecureMember {
        daemon,
        name,
        tx,
        connection: SECURE_CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        count: 0,
        seen: seen.clone(),
    }
}

impl SecureMember {
    /// The history's record of a message handed to the secure layer.
    fn record_send(&self, group: &str, payload: &[u8]) {
        let r = Record {
            t: conclave_daemon::record::wall_us(),
            p: self.name.clone(),
            inc: 0,
            ev: Event::SecureSend {
                group: group.to_owned(),
                msg: conclave_daemon::record::message_name(&self.name, group, payload),
            },
        };
        self.seen.lock().unwrap().records.push(r);
    }

    fn payload(&self, group: &str) -> Vec<u8> {
        format!("{group}/{}/{}/{}", self.name, self.connection, self.count).into_bytes()
    }

    /// One message of each service type to each secure group, queued: a key agreement may be
    /// under way, and then they wait for its key.
    async fn round(&mut self) {
        for (group, _) in SECURE_GROUPS {
            for s in SERVICES {
                self.count += 1;
                let p = self.payload(group);
                if self.tx.queue(group, s, &p).await.is_ok() {
                    self.record_send(group, &p);
                }
            }
        }
    }
}

/// Waits until every member's last secure view of every secure group is the members `want`
/// gives for it.
async fn wait_secure(
    seen: &Arc<Mutex<SecureSeen>>,
    members: &[SecureMember],
    want: impl Fn(&SecureMember) -> Vec<String>,
) {
    let ok = || {
        let seen = seen.lock().unwrap();
        members.iter().all(|m| {
            SECURE_GROUPS
                .iter()
                .all(|(g, _)| seen.views.get(&(m.name.clone(), g.to_string())) == Some(&want(m)))
        })
    };
    for _ in 0..1500 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = seen.lock().unwrap();
    let got: Vec<_> = members
        .iter()
        .map(|m| {
            let views: Vec<_> = SECURE_GROUPS
                .iter()
                .map(|(g, _)| seen.views.get(&(m.name.clone(), g.to_string())))
                .collect();
            (m.name.clone(), want(m), views)
        })
        .collect();
    panic!("secure views not as wanted: {got:#?}");
}

/// The client records' incarnations, from the daemons' records of the same client: the latest
/// one before each (a secure view follows the view the daemon handed the client).
fn with_incarnations(mut records: Vec<Record>, daemons: &[Record]) -> Vec<Record> {
    let mut by_client: BTreeMap<&str, Vec<(u64, u32)>> = BTreeMap::new();
    for r in daemons {
        by_client.entry(&r.p).or_default().push((r.t, r.inc));
    }
    for r in &mut records {
        let incs = by_client
            .get(r.p.as_str())
            .expect("the daemons recorded the client");
        r.inc = incs
            .iter()
            .take_while(|(t, _)| *t <= r.t)
            .last()
            .map(|(_, inc)| *inc)
            .expect("a daemon record before the secure layer's");
    }
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_groups_survive_a_partition_a_kill_and_a_restart_checked_from_the_records() {
    let _alone = ONE_NETWORK_AT_A_TIME.lock().await;
    let dir = std::env::temp_dir().join(format!("conclave-secure-daemons-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = Config::local_on_free_ports(3)
        .unwrap()
        .with_identity_files(&dir, &mut rand_core::OsRng)
        .unwrap();
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

    let trust = Trust::new(&["c0", "c1"]);
    let seen: Arc<Mutex<SecureSeen>> = Arc::default();
    let mut members = Vec::new();
    for d in 0..3 {
        for j in 0..2 {
            members.push(connect_secure(&net, &trust, &seen, d, &format!("c{j}")).await);
        }
    }
    let all = |ms: &[SecureMember]| -> Vec<String> {
        let mut v: Vec<String> = ms.iter().map(|m| m.name.clone()).collect();
        v.sort();
        v
    };
    let everyone = all(&members);
    wait_secure(&seen, &members, |_| everyone.clone()).await;
    for m in members.iter_mut() {
        m.round().await;
    }

    // A partition: d3 alone. Each side gets a key of its own.
    for i in 0..3 {
        let req = AdminRequest::Partition {
            sets: vec![vec!["d1".into(), "d2".into()], vec!["d3".into()]],
        };
        assert!(net.admin(i, &req).await.unwrap().ok);
    }
    for m in members.iter_mut() {
        m.round().await;
    }
    let (near, far): (Vec<&SecureMember>, Vec<&SecureMember>) =
        members.iter().partition(|m| m.daemon < 2);
    let (near, far) = (all_names(&near), all_names(&far));
    wait_secure(&seen, &members, |m| {
        if m.daemon < 2 {
            near.clone()
        } else {
            far.clone()
        }
    })
    .await;
    for i in 0..3 {
        assert!(net.admin(i, &AdminRequest::Heal).await.unwrap().ok);
    }
    for m in members.iter_mut() {
        m.round().await;
    }
    wait_secure(&seen, &members, |_| everyone.clone()).await;

    // kill -9 d2 with messages in flight.
    for m in members.iter_mut() {
        m.round().await;
    }
    let killed_at = conclave_daemon::record::wall_us();
    let mut child = net.children[1].take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let before = incarnations_in(&net.record(1));
    // The clients that come back take the same names: what their first sessions saw must not
    // pass for the new ones'.
    {
        let mut seen = seen.lock().unwrap();
        for m in members.iter().filter(|m| m.daemon == 1) {
            seen.views.retain(|(who, _), _| *who != m.name);
        }
    }
    members.retain(|m| m.daemon != 1);
    for m in members.iter_mut() {
        m.round().await;
    }
    let survivors = all(&members);
    wait_secure(&seen, &members, |_| survivors.clone()).await;

    // d2 comes back as a new incarnation; its clients connect again.
    net.spawn(1);
    net.wait_ring(&[0, 1, 2]).await;
    for j in 0..2 {
        members.push(connect_secure(&net, &trust, &seen, 1, &format!("c{j}")).await);
    }
    let everyone = all(&members);
    wait_secure(&seen, &members, |_| everyone.clone()).await;
    let stable_at = conclave_daemon::record::wall_us();

    // Every member sends once more in the final secure view; every member opens all of it.
    let mut finals = Vec::new();
    for m in members.iter_mut() {
        m.count += 1;
        for (group, _) in SECURE_GROUPS {
            let p = m.payload(group);
            m.record_send(group, &p);
            m.tx.send(group, ServiceType::Safe, &p).await.unwrap();
            finals.push(p);
        }
    }
    let opened_all = || {
        let seen = seen.lock().unwrap();
        members.iter().all(|m| {
            finals
                .iter()
                .all(|p| seen.opened.get(&m.name).is_some_and(|o| o.contains(p)))
        })
    };
    for _ in 0..500 {
        if opened_all() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(opened_all(), "a final message was not opened everywhere");

    for i in [0, 1, 2] {
        let _ = net.admin(i, &AdminRequest::Shutdown).await;
    }
    for c in net.children.iter_mut().flatten() {
        let _ = c.wait();
    }
    let daemons = merged_history(&net, Vec::new());
    let secure = std::mem::take(&mut seen.lock().unwrap().records);
    let mut extra = with_incarnations(secure, &daemons);
    extra.extend(
        before
            .into_iter()
            .filter(|(p, _)| !p.is_empty())
            .map(|(p, inc)| Record {
                t: killed_at,
                p,
                inc,
                ev: Event::Crash,
            }),
    );
    let mut processes: Vec<String> = (1..=3).map(|i| format!("d{i}")).collect();
    processes.extend(everyone.iter().cloned());
    extra.push(Record {
        t: stable_at,
        p: String::new(),
        inc: 0,
        ev: Event::Stable { processes },
    });
    let history = merged_history(&net, extra);
    let end = history
        .iter()
        .filter(|r| matches!(r.ev, Event::Crash) && r.t > stable_at)
        .map(|r| r.t)
        .min()
        .unwrap_or(u64::MAX);
    let history: Vec<Record> = history.into_iter().filter(|r| r.t < end).collect();
    let secure_views = history
        .iter()
        .filter(|r| matches!(r.ev, Event::SecureView { .. }))
        .count();
    // Four views of six members per group at least (formed, partition, heal, kill, restart).
    assert!(
        secure_views >= 2 * 6 * 4,
        "only {secure_views} secure views recorded"
    );
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

fn all_names(ms: &[&SecureMember]) -> Vec<String> {
    let mut v: Vec<String> = ms.iter().map(|m| m.name.clone()).collect();
    v.sort();
    v
}
