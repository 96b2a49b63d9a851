//! `conclave demo`: the secure story over real daemons on this machine. Four members with
//! Ed25519 identities and a trust directory join a secure group; every view gets a key they
//! agree on (TGDH), every message is sealed under it; a member leaves and cannot open what is
//! sent after; a partition gives each side its own key, the merge one new key. The daemons'
//! own records show what they carried: ciphertext only.

use crate::demo::{admin_all, start_ring, step, wait_for};
use crate::user_cmd::service_name;
use anyhow::{bail, Context, Result};
use conclave_client::secure::{SecureClient, SecureConfig, SecureEvent, SecureSender, ViewKey};
use conclave_client::{Address, Client, ServiceType};
use conclave_crypto::{Fingerprint, Identity, SigScheme};
use conclave_daemon::{AdminRequest, Config, Options};
use conclave_gka::{Directory, ProtocolId};
use conclave_history::{Event, Record};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const GROUP: &str = "chat";
/// The members and the daemon each connects to.
const MEMBERS: [(&str, usize); 4] = [("alice", 0), ("bob", 1), ("carol", 2), ("dave", 2)];

type Log = Arc<Mutex<Vec<(usize, SecureEvent)>>>;

struct Story {
    senders: Vec<SecureSender>,
    log: Log,
    records: PathBuf,
}

impl Story {
    /// The member's latest secure view: its members and key.
    fn view(&self, i: usize) -> Option<(Vec<String>, Fingerprint)> {
        let log = self.log.lock().unwrap();
        log.iter().rev().find_map(|(c, e)| match e {
            SecureEvent::View(v) if *c == i => Some((v.members.to_vec(), v.fingerprint)),
            _ => None,
        })
    }

    /// Waits until each listed member's secure view has `n` members; gives their key.
    async fn wait_keys(&self, who: &[usize], n: usize) -> Result<Fingerprint> {
        wait_for("the secure views", || {
            who.iter()
                .all(|i| self.view(*i).is_some_and(|(m, _)| m.len() == n))
        })
        .await?;
        let keys: BTreeSet<Fingerprint> = who.iter().map(|i| self.view(*i).unwrap().1).collect();
        if keys.len() != 1 {
            bail!("the members of one view hold different keys: {keys:?}");
        }
        Ok(*keys.iter().next().unwrap())
    }

    fn messages(&self, i: usize) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter_map(|(c, e)| match e {
                SecureEvent::Message { payload, .. } if *c == i => {
                    Some(String::from_utf8_lossy(payload).into_owned())
                }
                _ => None,
            })
            .collect()
    }

    async fn send(&mut self, i: usize, service: ServiceType, text: &str) -> Result<()> {
        self.senders[i]
            .send(GROUP, service, text.as_bytes())
            .await?;
        Ok(())
    }

    /// What daemon d1 delivered to its client `who` last in the group, as it carried it.
    fn carried(&self, who: &str) -> Result<(String, ServiceType, Vec<u8>)> {
        let records = read_records(&self.records.join("d1.jsonl"))?;
        records
            .iter()
            .rev()
            .find_map(|r| match &r.ev {
                Event::Deliver {
                    group,
                    sender,
                    service,
                    payload,
                    ..
                } if group == GROUP && r.p.starts_with(who) => Some((
                    sender.clone(),
                    service_type(*service),
                    hex::decode(payload).ok()?,
                )),
                _ => None,
            })
            .context("no delivery recorded at d1")
    }
}

fn read_records(path: &Path) -> Result<Vec<Record>> {
    let f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(conclave_history::record::read(std::io::BufReader::new(f))?)
}

fn service_type(s: conclave_history::Service) -> ServiceType {
    use conclave_history::Service;
    match s {
        Service::Unreliable => ServiceType::Unreliable,
        Service::Reliable => ServiceType::Reliable,
        Service::Fifo => ServiceType::Fifo,
        Service::Causal => ServiceType::Causal,
        Service::Agreed => ServiceType::Agreed,
        Service::Safe => ServiceType::Safe,
    }
}

fn short(f: Fingerprint) -> String {
    f.to_string()
}

pub async fn story() -> Result<()> {
    let started = std::time::Instant::now();
    println!(
        "Conclave demo: a secure group over three daemons on this machine (UDP between daemons,\n\
         TCP to clients); every view gets a key its members agree on, every message is sealed"
    );
    let records = std::env::temp_dir().join(format!("conclave-demo-{}", std::process::id()));
    std::fs::create_dir_all(&records)?;
    let (cfg, ids) = Config::local_on_free_ports(3)
        .context("finding free ports")?
        .with_identities(&mut rand_core::OsRng);
    step("the daemons d1, d2 and d3 start and form one ring over sealed links (each records what it delivers)");
    let options = |name: &str| Options {
        record: Some(records.join(format!("{name}.jsonl"))),
        ..Options::default()
    };
    let (daemons, ring) = start_ring(&cfg, &ids, options).await?;
    println!("  {ring}");

    step("alice, bob, carol and dave make Ed25519 identities; a trust directory names all four");
    let mut directory = Directory::new();
    let mut identities = Vec::new();
    for (name, _) in MEMBERS {
        let id = Identity::generate(SigScheme::Ed25519, &mut rand_core::OsRng)?;
        println!(
            "  {name:<6} {}",
            conclave_client::secure::files::public_text(&id.public())
        );
        directory.insert(name.to_owned(), id.public());
        identities.push(id);
    }

    step("they join \"chat\" as a secure group (TGDH), one after the other: a new key each time");
    let log: Log = Arc::default();
    let mut story = Story {
        senders: Vec::new(),
        log: log.clone(),
        records: records.clone(),
    };
    for (i, (name, d)) in MEMBERS.iter().enumerate() {
        let addr = Address::Tcp(cfg.daemon[*d].client.unwrap().to_string());
        let client = Client::connect(&addr, name).await?;
        let secure = SecureClient::new(client, identities[i].clone(), directory.clone());
        let (mut tx, mut rx) = secure.split();
        let cfg = SecureConfig {
            protocol: ProtocolId::Tgdh,
            ..SecureConfig::default()
        };
        tx.join_secure(GROUP, cfg).await?;
        let who = tx.name().to_owned();
        let events = log.clone();
        tokio::spawn(async move {
            while let Ok(ev) = rx.receive().await {
                match &ev {
                    SecureEvent::View(v) => println!(
                        "  {who:<9} secure view of {} member{}, key {}",
                        v.members.len(),
                        if v.members.len() == 1 { "" } else { "s" },
                        short(v.fingerprint)
                    ),
                    SecureEvent::Message {
                        sender,
                        payload,
                        service,
                        ..
                    } => println!(
                        "  {who:<9} <{sender}> [{}] {}",
                        service_name(*service),
                        String::from_utf8_lossy(payload)
                    ),
                    SecureEvent::Refused { sender, error, .. } => {
                        println!("  {who:<9} refused from {sender}: {error}")
                    }
                    _ => {}
                }
                events.lock().unwrap().push((i, ev));
            }
        });
        story.senders.push(tx);
        let joined: Vec<usize> = (0..=i).collect();
        story.wait_keys(&joined, i + 1).await?;
    }
    let all_four = story.wait_keys(&[0, 1, 2, 3], 4).await?;
    let mut keys = vec![all_four];

    step("alice sends; the others open it");
    story
        .send(0, ServiceType::Agreed, "hello, this is sealed")
        .await?;
    wait_for("the message", || {
        (1..4).all(|i| !story.messages(i).is_empty())
    })
    .await?;
    let (_, _, bytes) = story.carried("alice")?;
    println!(
        "  what the daemons carried: {} bytes, {}... (the text is not in it)",
        bytes.len(),
        hex::encode(&bytes[..bytes.len().min(24)])
    );

    step("carol keeps a copy of her key, and leaves; the others agree a new key");
    let carols: ViewKey = story.senders[2]
        .view_key(GROUP)
        .await?
        .context("carol has a key")?;
    story.senders[2].leave(GROUP).await?;
    let three = story.wait_keys(&[0, 1, 3], 3).await?;
    keys.push(three);

    step("alice sends again: carol gets nothing, and her last key cannot open it");
    let before = story.messages(2).len();
    story
        .send(0, ServiceType::Safe, "carol must not read this")
        .await?;
    wait_for("the message", || {
        [1, 3].iter().all(|i| {
            story
                .messages(*i)
                .iter()
                .any(|m| m == "carol must not read this")
        })
    })
    .await?;
    let (sender, service, bytes) = story.carried("alice")?;
    match carols.open(&sender, service, &bytes) {
        Ok(_) => bail!("carol's old key opened a message sent after she left"),
        Err(e) => println!(
            "  carol's last key (key {}): {e}",
            short(carols.fingerprint())
        ),
    }
    let alices = story.senders[0]
        .view_key(GROUP)
        .await?
        .context("alice has a key")?;
    let opened = alices.open(&sender, service, &bytes)?;
    println!(
        "  alice's current key (key {}) opens it: {:?}",
        short(alices.fingerprint()),
        String::from_utf8_lossy(&opened)
    );
    if story.messages(2).len() != before {
        bail!("carol received a message after she left");
    }

    step("the network partitions: d1 on one side, d2 and d3 on the other; each side gets its key");
    let sets = vec![vec!["d1".into()], vec!["d2".into(), "d3".into()]];
    admin_all(&daemons, AdminRequest::Partition { sets }).await?;
    let alone = story.wait_keys(&[0], 1).await?;
    let pair = story.wait_keys(&[1, 3], 2).await?;
    keys.extend([alone, pair]);
    story
        .send(1, ServiceType::Agreed, "bob: sealed for dave only")
        .await?;
    wait_for("the message", || {
        story
            .messages(3)
            .iter()
            .any(|m| m == "bob: sealed for dave only")
    })
    .await?;

    step("the partition heals: one view, one new key");
    admin_all(&daemons, AdminRequest::Heal).await?;
    let merged = story.wait_keys(&[0, 1, 3], 3).await?;
    keys.push(merged);
    story
        .send(3, ServiceType::Agreed, "dave: together again")
        .await?;
    wait_for("the message", || {
        [0, 1].iter().all(|i| {
            story
                .messages(*i)
                .iter()
                .any(|m| m == "dave: together again")
        })
    })
    .await?;

    step("the check");
    // Every secure view any member had: one key per view, and no key in two views.
    let mut by_view = std::collections::BTreeMap::new();
    for (_, e) in log.lock().unwrap().iter() {
        if let SecureEvent::View(v) = e {
            if *by_view.entry(v.view).or_insert(v.fingerprint) != v.fingerprint {
                bail!("two keys in one view");
            }
        }
    }
    let distinct: BTreeSet<_> = by_view.values().collect();
    if distinct.len() != by_view.len() || keys.iter().any(|k| !distinct.contains(k)) {
        bail!("a key came back: {by_view:?}");
    }
    println!(
        "  {} secure views, each with its own key, the same at all its members; none used twice",
        by_view.len()
    );
    let texts = [
        "hello, this is sealed",
        "carol must not read this",
        "bob: sealed for dave only",
        "dave: together again",
    ];
    let mut carried = 0;
    for d in ["d1", "d2", "d3"] {
        for r in read_records(&records.join(format!("{d}.jsonl")))? {
            if let Event::Deliver { payload, .. } = &r.ev {
                carried += 1;
                let bytes = hex::decode(payload).unwrap_or_default();
                if texts
                    .iter()
                    .any(|t| bytes.windows(t.len()).any(|w| w == t.as_bytes()))
                {
                    bail!("a daemon delivered plaintext");
                }
            }
        }
    }
    println!("  the daemons delivered {carried} messages, and not one held a text in the clear");
    for d in daemons {
        d.shutdown().await?;
    }
    let _ = std::fs::remove_dir_all(&records);
    println!("\nDone in {:.1} s.", started.elapsed().as_secs_f64());
    Ok(())
}
