//! `conclave demo --plain`: three daemons and three clients on this machine, over real sockets,
//! tell the story of a group without its keys: members join, messages of every service type flow
//! in order, the network partitions and each side goes on with its own view, the partition heals
//! and the views merge, and nothing is lost. `conclave demo` tells the secure story
//! (`secure_demo`); `--keys` the key agreement alone.

use crate::keys_demo::{self, KeyDemoArgs};
use crate::user_cmd::{event_text, service_name};
use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_client::{Address, Client, ClientEvent, GroupViewId, Sender, ServiceType};
use conclave_daemon::config::Identities;
use conclave_daemon::{AdminRequest, Config, Options, Running};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Args)]
pub struct DemoArgs {
    /// Tell the key agreement story instead (one process, no daemons).
    #[arg(long)]
    keys: bool,
    /// Tell the story of a group without keys (ordering, views, a partition, nothing lost).
    #[arg(long, conflicts_with = "keys")]
    plain: bool,
    #[command(flatten)]
    key_args: KeyDemoArgs,
}

const GROUP: &str = "chat";
const NAMES: [&str; 3] = ["alice", "bob", "carol"];

type Log = Arc<Mutex<Vec<(usize, ClientEvent)>>>;

struct Story {
    daemons: Vec<Running>,
    senders: Vec<Sender>,
    log: Log,
    /// What each client sent, in order.
    sent: Vec<Vec<(ServiceType, Vec<u8>)>>,
}

pub fn run(args: DemoArgs) -> Result<()> {
    if args.keys {
        return keys_demo::run(args.key_args);
    }
    let rt = tokio::runtime::Runtime::new()?;
    if args.plain {
        rt.block_on(story())
    } else {
        rt.block_on(crate::secure_demo::story())
    }
}

pub(crate) fn step(text: &str) {
    println!("\n> {text}");
}

/// Starts every daemon of `cfg` (each with the options `options` gives its name) and waits for
/// one ring of all of them; gives them and the ring's description.
pub(crate) async fn start_ring(
    cfg: &Config,
    ids: &Identities,
    options: impl Fn(&str) -> Options,
) -> Result<(Vec<Running>, String)> {
    let mut daemons = Vec::new();
    for d in &cfg.daemon {
        let opts = Options {
            identity: ids.get(&d.name),
            ..options(&d.name)
        };
        daemons.push(conclave_daemon::start(cfg.clone(), &d.name, opts).await?);
    }
    let mut ring = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = true;
        for d in &daemons {
            let s = d
                .admin(AdminRequest::Status)
                .await
                .status
                .unwrap_or_default();
            all &= s.ready && s.members.len() == cfg.daemon.len();
            ring = format!(
                "ring {}: {}",
                s.ring.clone().unwrap_or_default(),
                s.members.join(" ")
            );
        }
        if all {
            return Ok((daemons, ring));
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the daemons did not form a ring in 20 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends an admin request to every daemon.
pub(crate) async fn admin_all(daemons: &[Running], req: AdminRequest) -> Result<()> {
    for d in daemons {
        let r = d.admin(req.clone()).await;
        if !r.ok {
            bail!("{}: {}", d.name, r.error.unwrap_or_default());
        }
    }
    Ok(())
}

pub(crate) async fn wait_for(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        if tokio::time::Instant::now() > deadline {
            bail!("the demo waited 20 s for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

impl Story {
    /// The members of each client's latest view of the group.
    fn views(&self) -> Vec<Vec<String>> {
        let log = self.log.lock().unwrap();
        (0..NAMES.len())
            .map(|i| {
                log.iter()
                    .rev()
                    .find_map(|(c, e)| match e {
                        ClientEvent::View { members, .. } if *c == i => Some(members.to_vec()),
                        _ => None,
                    })
                    .unwrap_or_default()
            })
            .collect()
    }

    fn messages_at(&self, i: usize) -> usize {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|(c, e)| *c == i && matches!(e, ClientEvent::Message { .. }))
            .count()
    }

    async fn wait_views(&self, want: [usize; 3]) -> Result<()> {
        wait_for("the views", || {
            self.views().iter().zip(want).all(|(v, n)| v.len() == n)
        })
        .await
    }

    async fn send(&mut self, i: usize, service: ServiceType, text: &str) -> Result<()> {
        self.senders[i]
            .multicast(service, &[GROUP], text.as_bytes())
            .await?;
        self.sent[i].push((service, text.as_bytes().to_vec()));
        Ok(())
    }

    async fn admin_all(&self, req: AdminRequest) -> Result<()> {
        admin_all(&self.daemons, req).await
    }

    /// Every message delivered to every member of the view it was sent in; agreed and safe
    /// messages in one order everywhere.
    fn check(&self) -> Result<(usize, usize)> {
        let log = self.log.lock().unwrap();
        let mut members: BTreeMap<GroupViewId, Vec<String>> = BTreeMap::new();
        let names: Vec<String> = self.senders.iter().map(|s| s.name().to_owned()).collect();
        let mut sent_views: Vec<Vec<GroupViewId>> = vec![Vec::new(); NAMES.len()];
        let mut got: Vec<Vec<(String, Vec<u8>, ServiceType)>> = vec![Vec::new(); NAMES.len()];
        for (c, e) in log.iter() {
            match e {
                ClientEvent::View {
                    view, members: m, ..
                } => {
                    members.insert(*view, m.to_vec());
                }
                ClientEvent::Sent { view, .. } => sent_views[*c].push(*view),
                ClientEvent::Message {
                    sender,
                    payload,
                    service,
                    ..
                } => got[*c].push((sender.clone(), payload.to_vec(), *service)),
                _ => {}
            }
        }
        let mut count = 0;
        for (i, sent) in self.sent.iter().enumerate() {
            for ((_, payload), view) in sent.iter().zip(&sent_views[i]) {
                count += 1;
                for m in members.get(view).context("a view nobody installed")? {
                    let r = names.iter().position(|n| n == m).context("a stranger")?;
                    if !got[r]
                        .iter()
                        .any(|(s, p, _)| *s == names[i] && p == payload)
                    {
                        bail!(
                            "{m} did not deliver {:?} from {}",
                            String::from_utf8_lossy(payload),
                            names[i]
                        );
                    }
                }
            }
        }
        // Agreed and safe messages: any two members deliver those they share in one order.
        let total = |r: usize| -> Vec<Vec<u8>> {
            got[r]
                .iter()
                .filter(|(_, _, s)| *s >= ServiceType::Agreed)
                .map(|(_, p, _)| p.clone())
                .collect()
        };
        let mut pairs = 0;
        for a in 0..NAMES.len() {
            for b in a + 1..NAMES.len() {
                let (ta, tb) = (total(a), total(b));
                let common_a: Vec<_> = ta.iter().filter(|p| tb.contains(p)).collect();
                let common_b: Vec<_> = tb.iter().filter(|p| ta.contains(p)).collect();
                if common_a != common_b {
                    bail!(
                        "{} and {} delivered agreed messages in different orders",
                        names[a],
                        names[b]
                    );
                }
                pairs += 1;
            }
        }
        Ok((count, pairs))
    }
}

async fn story() -> Result<()> {
    let started = std::time::Instant::now();
    println!("Conclave demo: three daemons and three clients on this machine, over UDP and TCP");
    let (cfg, ids) = Config::local_on_free_ports(3)
        .context("finding free ports")?
        .with_identities(&mut rand_core::OsRng);
    step("the daemons d1, d2 and d3 start and form one ring, their links sealed");
    let (daemons, ring) = start_ring(&cfg, &ids, |_| Options::default()).await?;
    println!("  {ring}");

    step("alice (on d1), bob (on d2) and carol (on d3) connect and join \"chat\"");
    let log: Log = Arc::default();
    let mut senders = Vec::new();
    for (i, name) in NAMES.iter().enumerate() {
        let addr = Address::Tcp(cfg.daemon[i].client.unwrap().to_string());
        let mut c = Client::connect(&addr, name).await?;
        c.join(GROUP).await?;
        let (s, mut r) = c.split();
        let who = s.name().to_owned();
        let events = log.clone();
        tokio::spawn(async move {
            while let Ok(ev) = r.receive().await {
                let text = event_text(&ev);
                if !text.is_empty() && !matches!(ev, ClientEvent::Joined { .. }) {
                    println!("  {who:<9} {text}");
                }
                events.lock().unwrap().push((i, ev));
            }
        });
        senders.push(s);
        // One at a time, so the views grow one join at a time.
        let want = i + 1;
        let l = log.clone();
        wait_for("the join", || {
            l.lock().unwrap().iter().any(|(c, e)| {
                *c == i && matches!(e, ClientEvent::View { members, .. } if members.len() == want)
            })
        })
        .await?;
    }
    let mut s = Story {
        daemons,
        senders,
        log,
        sent: vec![Vec::new(); NAMES.len()],
    };
    s.wait_views([3, 3, 3]).await?;

    step("alice sends one message of each service type; bob and carol one agreed message each");
    for service in [
        ServiceType::Unreliable,
        ServiceType::Reliable,
        ServiceType::Fifo,
        ServiceType::Causal,
        ServiceType::Agreed,
        ServiceType::Safe,
    ] {
        let text = format!("alice's {} message", service_name(service));
        s.send(0, service, &text).await?;
    }
    s.send(1, ServiceType::Agreed, "bob: hello all").await?;
    s.send(2, ServiceType::Agreed, "carol: hello all").await?;
    wait_for("the deliveries", || (0..3).all(|i| s.messages_at(i) == 8)).await?;

    step("the network partitions: d1 and d2 on one side, d3 on the other");
    s.admin_all(AdminRequest::Partition {
        sets: vec![vec!["d1".into(), "d2".into()], vec!["d3".into()]],
    })
    .await?;
    s.wait_views([2, 2, 1]).await?;

    step("each side goes on with its own view");
    s.send(0, ServiceType::Agreed, "alice: d3 is gone?").await?;
    s.send(2, ServiceType::Agreed, "carol: anyone there?")
        .await?;
    wait_for("the deliveries", || {
        s.messages_at(0) == 9 && s.messages_at(1) == 9 && s.messages_at(2) == 9
    })
    .await?;

    step("the partition heals and the views merge");
    s.admin_all(AdminRequest::Heal).await?;
    s.wait_views([3, 3, 3]).await?;
    s.send(1, ServiceType::Safe, "bob: together again").await?;
    wait_for("the deliveries", || (0..3).all(|i| s.messages_at(i) == 10)).await?;

    step("the check");
    let (n, pairs) = s.check()?;
    println!(
        "  nothing lost: each of the {n} messages was delivered to every member of the view it was sent in"
    );
    println!("  the {pairs} pairs of members delivered the agreed and safe messages they share in one order");
    for d in s.daemons {
        d.shutdown().await?;
    }
    println!("\nDone in {:.1} s.", started.elapsed().as_secs_f64());
    Ok(())
}
