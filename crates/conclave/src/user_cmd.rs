//! `conclave user`: a client on a terminal or in a script, in the manner of Spread's spuser.
//!
//! Commands, one a line on stdin:
//!
//! ```text
//! join GROUP [vs]              (j)  join; `vs` asks for flush requests before view changes
//! leave GROUP                  (l)
//! send [SERVICE] GROUPS TEXT   (s)  SERVICE: unreliable reliable fifo causal agreed (default) safe;
//!                                   GROUPS: one group or several joined by commas
//! ack GROUP                         acknowledge the group's pending flush request (with --manual-ack)
//! sleep MS                          wait (scripts)
//! quit                         (q)
//! ```
//!
//! With `--identity FILE` the client proves its name when the daemons know a key for it
//! (`[[client]]` in their configuration). `--daemon tls:host:port --daemon-key KEY` talks TLS to
//! the daemon's TLS port and goes on only if the daemon proves it holds KEY.
//!
//! With `--spread ADDR` the same commands go to a daemon's Spread port in Spread 4.x's client
//! protocol (see `spread_user`).
//!
//! With `--secure --identity FILE --directory FILE [--protocol P]` every group is a secure group
//! (docs/secure.md): the same commands, a message to one group at a time, flushes acknowledged by
//! the secure layer. With `--secure --keys daemons` the keys come from the daemons instead
//! (docs/integrated.md), and no identity is needed.

use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_client::{Address, Client, ClientError, ClientEvent, GroupViewId, ServiceType};
use serde_json::json;
use std::collections::BTreeMap;
use tokio::io::{AsyncBufReadExt, BufReader};

#[derive(Args)]
pub struct UserArgs {
    /// The daemon: host:port, tls:host:port (with --daemon-key), unix:/path or shm:/path (its
    /// `shm` socket: replies through shared memory).
    #[arg(long, default_value = "127.0.0.1:4901")]
    daemon: String,
    /// The client's private name (the daemon makes it name#daemon).
    #[arg(long, default_value = "user")]
    name: String,
    /// One JSON object per event on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// Leave flush requests to the `ack` command instead of acknowledging them at once.
    #[arg(long)]
    manual_ack: bool,
    /// After stdin ends, keep printing events this long (milliseconds) before leaving.
    #[arg(long, default_value_t = 500)]
    linger: u64,
    /// Events received and not yet printed, at most, before the session ends.
    #[arg(long, default_value_t = conclave_client::EVENT_QUEUE)]
    event_queue: usize,
    /// Speak Spread 4.x's client protocol to this Spread port of a daemon instead (docs/spread.md):
    /// PORT (the Unix socket /tmp/PORT), PORT@HOST, HOST:PORT or unix:/path.
    #[arg(long, conflicts_with_all = ["secure", "identity", "daemon_key", "manual_ack"])]
    spread: Option<String>,
    #[command(flatten)]
    secure: crate::secure_cmd::SecureArgs,
}

pub fn service_name(s: ServiceType) -> &'static str {
    match s {
        ServiceType::Unreliable => "unreliable",
        ServiceType::Reliable => "reliable",
        ServiceType::Fifo => "fifo",
        ServiceType::Causal => "causal",
        ServiceType::Agreed => "agreed",
        ServiceType::Safe => "safe",
    }
}

pub fn parse_service(s: &str) -> Option<ServiceType> {
    Some(match s {
        "unreliable" => ServiceType::Unreliable,
        "reliable" => ServiceType::Reliable,
        "fifo" => ServiceType::Fifo,
        "causal" => ServiceType::Causal,
        "agreed" => ServiceType::Agreed,
        "safe" => ServiceType::Safe,
        _ => return None,
    })
}

pub fn view_text(v: &GroupViewId) -> String {
    format!("{}.{}@{}", v.ring.seq, v.index, v.ring.rep)
}

fn payload_text(p: &[u8]) -> String {
    match std::str::from_utf8(p) {
        Ok(s) => s.to_owned(),
        Err(_) => format!("0x{}", hex::encode(p)),
    }
}

/// An event as one JSON object.
pub fn event_json(ev: &ClientEvent) -> serde_json::Value {
    match ev {
        ClientEvent::Joined { group, vs } => json!({"ev": "joined", "group": group, "vs": vs}),
        ClientEvent::Left { group } => json!({"ev": "left", "group": group}),
        ClientEvent::Sent {
            group,
            service,
            view,
            ..
        } => {
            json!({"ev": "sent", "group": group, "service": service_name(*service), "view": view_text(view)})
        }
        ClientEvent::FlushAcked { group } => json!({"ev": "flush_acked", "group": group}),
        ClientEvent::View {
            group,
            view,
            members,
            transitional,
            reason,
        } => json!({
            "ev": "view", "group": group, "view": view_text(view), "members": &members[..],
            "transitional": &transitional[..], "reason": format!("{reason:?}").to_lowercase(),
        }),
        ClientEvent::TransitionalSignal { group } => json!({"ev": "transitional", "group": group}),
        ClientEvent::FlushRequest { group, view } => {
            json!({"ev": "flush_request", "group": group, "view": view_text(view)})
        }
        ClientEvent::Closed { reason } => json!({"ev": "closed", "reason": reason}),
        // The key itself is never printed.
        ClientEvent::ViewKey { group, view, key } => json!({
            "ev": "view_key", "group": group, "view": view_text(view),
            "key": conclave_crypto::GroupKey::from_bytes(key.0).fingerprint().to_string(),
        }),
        ClientEvent::Message {
            group,
            sender,
            service,
            payload,
            view,
            transitional,
        } => json!({
            "ev": "message", "group": group, "sender": sender, "service": service_name(*service),
            "view": view_text(view), "transitional": transitional, "payload": payload_text(payload),
        }),
    }
}

/// An event as a line of text.
pub fn event_text(ev: &ClientEvent) -> String {
    match ev {
        ClientEvent::Joined { group, .. } => format!("joining {group}"),
        ClientEvent::Left { group } => format!("left {group}"),
        ClientEvent::Sent { .. } => String::new(),
        ClientEvent::ViewKey { group, view, key } => format!(
            "{group}: key of view {} from the daemons ({})",
            view_text(view),
            conclave_crypto::GroupKey::from_bytes(key.0).fingerprint()
        ),
        ClientEvent::FlushAcked { group } => format!("flush of {group} acknowledged"),
        ClientEvent::View {
            group,
            view,
            members,
            reason,
            ..
        } => format!(
            "view {} of {group} ({}): {}",
            view_text(view),
            format!("{reason:?}").to_lowercase(),
            members.join(" ")
        ),
        ClientEvent::TransitionalSignal { group } => format!("{group}: transitional signal"),
        ClientEvent::FlushRequest { group, view } => {
            format!("{group}: flush request for view {}", view_text(view))
        }
        ClientEvent::Closed { reason } => format!("closed by the daemon: {reason}"),
        ClientEvent::Message {
            group,
            sender,
            service,
            payload,
            transitional,
            ..
        } => format!(
            "{group} <{sender}> [{}{}] {}",
            service_name(*service),
            if *transitional { ", transitional" } else { "" },
            payload_text(payload)
        ),
    }
}

pub enum Line {
    Join(String, bool),
    Leave(String),
    Send(ServiceType, Vec<String>, String),
    Ack(String),
    Sleep(u64),
    Quit,
    Nothing,
}

pub fn parse_line(line: &str) -> Result<Line> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(Line::Nothing);
    }
    let (cmd, rest) = line.split_once(' ').unwrap_or((line, ""));
    let rest = rest.trim();
    let words: Vec<&str> = rest.split_whitespace().collect();
    Ok(match cmd {
        "join" | "j" => match words.as_slice() {
            [g] => Line::Join(g.to_string(), false),
            [g, "vs"] => Line::Join(g.to_string(), true),
            _ => bail!("join GROUP [vs]"),
        },
        "leave" | "l" => match words.as_slice() {
            [g] => Line::Leave(g.to_string()),
            _ => bail!("leave GROUP"),
        },
        "send" | "s" => {
            let (service, rest) = match rest.split_once(' ') {
                Some((w, r)) if parse_service(w).is_some() => (parse_service(w).unwrap(), r.trim()),
                _ => (ServiceType::Agreed, rest),
            };
            let Some((groups, text)) = rest.split_once(' ') else {
                bail!("send [SERVICE] GROUPS TEXT");
            };
            Line::Send(
                service,
                groups.split(',').map(str::to_owned).collect(),
                text.to_owned(),
            )
        }
        "ack" => match words.as_slice() {
            [g] => Line::Ack(g.to_string()),
            _ => bail!("ack GROUP"),
        },
        "sleep" => Line::Sleep(rest.parse().context("sleep MS")?),
        "quit" | "q" => Line::Quit,
        other => bail!("unknown command {other:?} (join, leave, send, ack, sleep, quit)"),
    })
}

pub fn run_user(args: UserArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(user(args))
}

/// Writes events as JSON lines or as text, buffered: one write for a burst of events (a line
/// each was slower than the daemons deliver).
struct Out {
    json_lines: bool,
    w: std::io::BufWriter<std::io::Stdout>,
}

impl Out {
    fn say(&mut self, v: serde_json::Value, text: String) {
        use std::io::Write;
        let _ = if self.json_lines {
            writeln!(self.w, "{v}")
        } else if !text.is_empty() {
            writeln!(self.w, "{text}")
        } else {
            Ok(())
        };
    }

    fn error(&mut self, e: &str) {
        self.say(json!({"ev": "error", "error": e}), format!("error: {e}"));
    }

    fn flush(&mut self) {
        use std::io::Write;
        let _ = self.w.flush();
    }
}

/// What the sending task does, in the order the lines came.
enum Do {
    Line(Line),
    Ack(String, GroupViewId),
    /// Stdin ended: wait this long (milliseconds), then leave.
    Linger(u64),
}

/// Sends the commands one after the other, and reports what failed. It runs beside the loop
/// that takes events, so a send that waits for room in the window never stops the events (and
/// the acknowledgements that make room) from being taken.
async fn send_all(
    mut tx: conclave_client::Sender,
    mut todo: tokio::sync::mpsc::UnboundedReceiver<Do>,
    failed: tokio::sync::mpsc::UnboundedSender<String>,
) {
    while let Some(d) = todo.recv().await {
        let r: Result<(), ClientError> = match d {
            Do::Linger(ms) => {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                break;
            }
            Do::Ack(g, v) => tx.flush_ack(&g, v).await,
            Do::Line(Line::Nothing) => Ok(()),
            Do::Line(Line::Quit) => break,
            Do::Line(Line::Sleep(ms)) => {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                Ok(())
            }
            Do::Line(Line::Join(g, vs)) => tx.join(&g, vs).await,
            Do::Line(Line::Leave(g)) => tx.leave(&g).await,
            Do::Line(Line::Send(s, groups, text)) => {
                let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                tx.multicast(s, &groups, text.as_bytes()).await
            }
            // Answered where the pending requests are kept.
            Do::Line(Line::Ack(_)) => Ok(()),
        };
        if let Err(e) = r {
            let _ = failed.send(e.to_string());
        }
    }
    let _ = tx.disconnect().await;
}

async fn user(args: UserArgs) -> Result<()> {
    if let Some(spread) = &args.spread {
        return crate::spread_user::spread_user(spread, &args.name, args.json, args.linger).await;
    }
    let addr: Address = args.daemon.parse()?;
    if args.secure.secure {
        return crate::secure_cmd::secure_user(
            &addr,
            &args.name,
            args.json,
            args.linger,
            &args.secure,
        )
        .await;
    }
    let identity = match &args.secure.identity {
        Some(path) => Some(crate::secure_cmd::read_identity(path)?.identity()),
        None => None,
    };
    let opts = conclave_client::Options {
        event_queue: args.event_queue,
        identity,
        daemon_key: args.secure.daemon_key()?,
        ..Default::default()
    };
    let c = Client::connect_with(&addr, &args.name, opts)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let mut out = Out {
        json_lines: args.json,
        w: std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout()),
    };
    out.say(
        json!({"ev": "connected", "name": c.name()}),
        format!("connected as {}", c.name()),
    );
    out.flush();
    let (tx, mut rx) = c.split();
    let (todo, todo_rx) = tokio::sync::mpsc::unbounded_channel();
    let (failed_tx, mut failed) = tokio::sync::mpsc::unbounded_channel();
    let mut sending = tokio::spawn(send_all(tx, todo_rx, failed_tx));
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut pending: BTreeMap<String, GroupViewId> = BTreeMap::new();
    let mut input_open = true;
    let mut sent_all = false;
    let end: Result<()> = loop {
        out.flush();
        tokio::select! {
            biased;
            Some(e) = failed.recv() => out.error(&e),
            // The sending task is done (quit, or stdin ended and the linger passed).
            _ = &mut sending => {
                sent_all = true;
                break Ok(());
            }
            ev = rx.receive() => {
                // This event and every one already here, then one write.
                let mut next = Some(ev);
                let mut ended = None;
                while let Some(ev) = next.take() {
                    match ev {
                        Ok(ev) => {
                            if let ClientEvent::FlushRequest { group, view } = &ev {
                                if args.manual_ack {
                                    pending.insert(group.clone(), *view);
                                } else {
                                    let _ = todo.send(Do::Ack(group.clone(), *view));
                                }
                            }
                            out.say(event_json(&ev), event_text(&ev));
                        }
                        Err(ClientError::Refused { code, reason }) => out.say(
                            json!({"ev": "refused", "code": code.to_string(), "reason": reason}),
                            format!("refused ({code}): {reason}"),
                        ),
                        // After a quit the session ends as it should.
                        Err(_) if sending.is_finished() => ended = Some(Ok(())),
                        Err(e) => {
                            out.say(
                                json!({"ev": "disconnected", "reason": e.to_string()}),
                                e.to_string(),
                            );
                            ended = Some(Err(anyhow::anyhow!("{e}")));
                        }
                    }
                    if ended.is_some() {
                        break;
                    }
                    next = rx.try_receive();
                }
                if let Some(end) = ended {
                    break end;
                }
            }
            line = stdin.next_line(), if input_open => {
                let Some(line) = line? else {
                    input_open = false;
                    let _ = todo.send(Do::Linger(args.linger));
                    continue;
                };
                match parse_line(&line) {
                    Err(e) => out.error(&format!("{e:#}")),
                    Ok(Line::Ack(g)) => match pending.remove(&g) {
                        Some(v) => {
                            let _ = todo.send(Do::Ack(g, v));
                        }
                        None => out.error(&format!("no flush request of {g} is pending")),
                    },
                    Ok(l) => {
                        let _ = todo.send(Do::Line(l));
                    }
                }
            },
        }
    };
    out.flush();
    if !sent_all {
        let _ = sending.await;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_parse() {
        assert!(matches!(parse_line("j chat").unwrap(), Line::Join(g, false) if g == "chat"));
        assert!(matches!(
            parse_line("join chat vs").unwrap(),
            Line::Join(_, true)
        ));
        assert!(matches!(
            parse_line("s safe a,b hello world").unwrap(),
            Line::Send(ServiceType::Safe, g, t) if g == ["a", "b"] && t == "hello world"
        ));
        assert!(matches!(
            parse_line("send chat hi there").unwrap(),
            Line::Send(ServiceType::Agreed, g, t) if g == ["chat"] && t == "hi there"
        ));
        assert!(matches!(parse_line("# comment").unwrap(), Line::Nothing));
        assert!(parse_line("send chat").is_err());
        assert!(parse_line("dance").is_err());
        assert!(parse_line("sleep x").is_err());
    }
}
