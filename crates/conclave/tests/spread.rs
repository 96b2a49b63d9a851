//! Spread clients against the real binary: two daemon processes with Spread ports, a
//! `conclave user` process (Conclave's protocol), a `conclave user --spread` process on a Unix
//! socket, and a raw Spread client (the tests' own implementation of the protocol, over TCP) in
//! one group, through a partition and a merge.

#[path = "../../node/tests/common/spread_client.rs"]
mod spread_client;

use conclave_daemon::{AdminRequest, Config};
use serde_json::Value;
use spread_client::{self as sc, Handshake, Message};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A process whose JSON lines on stdout are collected.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("conclave runs");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let lines: Arc<Mutex<Vec<Value>>> = Arc::default();
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if let Ok(v) = serde_json::from_str(&line) {
                    l.lock().unwrap().push(v);
                }
            }
        });
        Proc {
            child,
            stdin,
            lines,
        }
    }

    fn say(&mut self, line: &str) {
        let s = self.stdin.as_mut().unwrap();
        writeln!(s, "{line}").unwrap();
        s.flush().unwrap();
    }

    /// Waits for a line that `want` accepts, and returns it.
    async fn wait(&self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..1000 {
            if let Some(v) = self.lines.lock().unwrap().iter().find(|v| want(v)) {
                return v.clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "no {what} in {:#?}",
            self.lines.lock().unwrap().iter().collect::<Vec<_>>()
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The raw Spread client over TCP: what it has read, and the messages in it.
struct Raw {
    w: tokio::net::tcp::OwnedWriteHalf,
    bytes: Arc<Mutex<Vec<u8>>>,
    pg: String,
    read: usize,
    /// Messages read and not yet looked at.
    queued: std::collections::VecDeque<Message>,
}

impl Raw {
    async fn connect(addr: std::net::SocketAddr, name: &str) -> Raw {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut r, mut w) = s.into_split();
        let bytes: Arc<Mutex<Vec<u8>>> = Arc::default();
        let b = bytes.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => b.lock().unwrap().extend_from_slice(&buf[..n]),
                }
            }
        });
        w.write_all(&sc::connect(name, true)).await.unwrap();
        w.write_all(&sc::null_auth()).await.unwrap();
        for _ in 0..500 {
            let got = bytes.lock().unwrap().clone();
            match sc::handshake(&got) {
                Handshake::Incomplete => tokio::time::sleep(Duration::from_millis(10)).await,
                Handshake::Rejected(c) => panic!("rejected: {c}"),
                Handshake::Accepted {
                    private_group,
                    used,
                    ..
                } => {
                    return Raw {
                        w,
                        bytes,
                        pg: private_group,
                        read: used,
                        queued: Default::default(),
                    }
                }
            }
        }
        panic!("no handshake");
    }

    async fn req(&mut self, kind: u32, groups: &[&str], data: &[u8]) {
        let b = sc::request(false, kind, &self.pg, groups, 9, data);
        self.w.write_all(&b).await.unwrap();
    }

    /// Reads messages until one that `want` accepts; returns it.
    async fn wait(&mut self, what: &str, want: impl Fn(&Message) -> bool) -> Message {
        let mut seen = Vec::new();
        for _ in 0..1000 {
            let got = self.bytes.lock().unwrap().clone();
            let (ms, used) = sc::messages(&got[self.read..], &self.pg);
            self.read += used;
            self.queued.extend(ms);
            while let Some(m) = self.queued.pop_front() {
                if want(&m) {
                    return m;
                }
                seen.push(m);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no {what} in {seen:#?}");
    }
}

fn ev<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    (v["ev"] == name).then_some(v)
}

fn members(v: &Value) -> Vec<String> {
    v["members"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| m.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_and_conclave_clients_share_a_group_through_a_partition_and_a_merge() {
    let dir = std::env::temp_dir().join(format!("conclave-spread-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = Config::local_on_free_ports(2)
        .unwrap()
        .with_identity_files(&dir, &mut rand_core::OsRng)
        .unwrap();
    for i in 0..2 {
        cfg.daemon[i].spread = Some(cfg.free_tcp_port().unwrap());
    }
    let spread: Vec<_> = cfg.daemon.iter().map(|d| d.spread.unwrap()).collect();
    let unix: PathBuf = dir.join("4803");
    let mut text = String::new();
    for (i, d) in cfg.daemon.iter().enumerate() {
        text += &format!(
            "[[daemon]]\nname = \"{}\"\npeer = \"{}\"\nclient = \"{}\"\nadmin = \"{}\"\n\
             spread = \"{}\"\nkey = \"{}\"\nidentity = {:?}\n",
            d.name,
            d.peer,
            d.client.unwrap(),
            d.admin.unwrap(),
            spread[i],
            d.key.as_ref().unwrap(),
            d.identity.as_ref().unwrap(),
        );
        if i == 0 {
            text += &format!("spread_unix = {unix:?}\n");
        }
        text += "\n";
    }
    let cfg_path = dir.join("conclave.toml");
    std::fs::write(&cfg_path, &text).unwrap();
    let cfg_arg = cfg_path.to_str().unwrap();
    let _daemons: Vec<Proc> = ["d1", "d2"]
        .iter()
        .map(|n| Proc::spawn(&["daemon", "--config", cfg_arg, "--name", n, "--log", "warn"]))
        .collect();
    let admin = |i: usize, req: AdminRequest| {
        let d = cfg.daemon[i].clone();
        async move {
            let id = conclave_daemon::read_identity(d.identity.as_ref().unwrap()).unwrap();
            conclave_daemon::endpoints::ask(d.admin.unwrap(), &d.name, &id, &req)
                .await
                .ok()
        }
    };
    let ring = |want: Vec<&'static str>, of: Vec<usize>| {
        let admin = &admin;
        async move {
            for _ in 0..1000 {
                let mut ok = true;
                for &i in &of {
                    let s = admin(i, AdminRequest::Status).await.and_then(|r| r.status);
                    ok &= s.is_some_and(|s| s.ready && s.members == want);
                }
                if ok {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("no ring {want:?}");
        }
    };
    ring(vec!["d1", "d2"], vec![0, 1]).await;

    // A Conclave client and a `conclave user --spread` (on the Unix socket) on d1.
    let d1 = cfg.daemon[0].client.unwrap().to_string();
    let mut native = Proc::spawn(&["user", "--daemon", &d1, "--name", "nat", "--json"]);
    native.say("join g");
    let spread_unix = format!("unix:{}", unix.display());
    let mut sp = Proc::spawn(&["user", "--spread", &spread_unix, "--name", "sp", "--json"]);
    sp.wait("connected", |v| v["ev"] == "connected").await;
    sp.say("join g");
    // The raw Spread client on d2, over TCP.
    let mut raw = Raw::connect(spread[1], "raw").await;
    assert_eq!(raw.pg, "#raw#d2");
    raw.req(sc::JOIN, &["g"], b"").await;
    let all = ["#nat#d1", "#sp#d1", "#raw#d2"];
    raw.wait(
        "a view of all three",
        |m| matches!(m, Message::Membership { members, .. } if members == &all),
    )
    .await;

    // Messages both ways.
    native.say("send agreed g from-native");
    raw.wait("the native message", |m| {
        matches!(m, Message::Data { sender, data, .. } if sender == "#nat#d1" && data == b"from-native")
    })
    .await;
    raw.req(sc::SAFE, &["g"], b"from-raw").await;
    native
        .wait("the raw message", |v| {
            ev(v, "message").is_some_and(|v| v["sender"] == "raw#d2" && v["payload"] == "from-raw")
        })
        .await;
    let m = sp
        .wait("the raw message", |v| {
            ev(v, "message").is_some_and(|v| v["payload"] == "from-raw")
        })
        .await;
    assert_eq!(m["sender"], "#raw#d2");
    assert_eq!(m["mess_type"], 9);
    assert_eq!(m["service"], "safe");

    // A partition: each side sees a network view of its own members.
    let parts = vec![vec!["d1".to_string()], vec!["d2".to_string()]];
    for i in 0..2 {
        let req = AdminRequest::Partition {
            sets: parts.clone(),
        };
        assert!(admin(i, req).await.unwrap().ok);
    }
    ring(vec!["d1"], vec![0]).await;
    ring(vec!["d2"], vec![1]).await;
    raw.wait(
        "the transitional signal",
        |m| matches!(m, Message::Transitional { group, .. } if group == "g"),
    )
    .await;
    let alone = raw
        .wait("a network view of one", |m| {
            matches!(m, Message::Membership { service, members, .. }
                if *service == sc::REG_MEMB | sc::CAUSED_BY_NETWORK && members == &["#raw#d2"])
        })
        .await;
    let Message::Membership { vs_sets, .. } = &alone else {
        unreachable!()
    };
    assert_eq!(vs_sets, &[vec!["#raw#d2".to_string()]]);
    native
        .wait("a network view of d1's", |v| {
            ev(v, "view")
                .is_some_and(|v| v["reason"] == "network" && members(v) == ["nat#d1", "sp#d1"])
        })
        .await;
    // Each side goes on alone.
    sp.say("send fifo g sp-alone");
    native
        .wait("sp's message in the partition", |v| {
            ev(v, "message").is_some_and(|v| v["payload"] == "sp-alone")
        })
        .await;

    // The merge: one view of all, two vs_sets, each member's own set marked.
    for i in 0..2 {
        assert!(admin(i, AdminRequest::Heal).await.unwrap().ok);
    }
    ring(vec!["d1", "d2"], vec![0, 1]).await;
    let merged = raw
        .wait("the merged view", |m| {
            matches!(m, Message::Membership { service, members, .. }
                if *service == sc::REG_MEMB | sc::CAUSED_BY_NETWORK && members == &all)
        })
        .await;
    let Message::Membership { vs_sets, local, .. } = &merged else {
        unreachable!()
    };
    let d1_set = vec!["#nat#d1".to_string(), "#sp#d1".to_string()];
    let d2_set = vec!["#raw#d2".to_string()];
    assert_eq!(vs_sets, &[d1_set.clone(), d2_set.clone()]);
    assert_eq!(local, &d2_set);
    let v = sp
        .wait("the merged view", |v| {
            ev(v, "view").is_some_and(|v| v["reason"] == "network" && members(v).len() == 3)
        })
        .await;
    assert_eq!(v["local"], 0);
    assert_eq!(v["vs_sets"][0], serde_json::json!(d1_set));

    // Messages after the merge, to the group and to a private group.
    raw.req(sc::AGREED, &["g", "#sp#d1"], b"after-merge").await;
    let m = sp
        .wait("the message after the merge", |v| {
            ev(v, "message").is_some_and(|v| v["payload"] == "after-merge")
        })
        .await;
    assert_eq!(m["groups"], serde_json::json!(["g", "#sp#d1"]));
    native
        .wait("the message after the merge", |v| {
            ev(v, "message").is_some_and(|v| v["payload"] == "after-merge")
        })
        .await;
    sp.say("quit");
    raw.wait("sp's disconnect", |m| {
        matches!(m, Message::Membership { service, members, .. }
            if *service == sc::REG_MEMB | sc::CAUSED_BY_DISCONNECT && members == &["#nat#d1", "#raw#d2"])
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}
