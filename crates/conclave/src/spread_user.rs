//! `conclave user --spread ADDR`: the commands of `conclave user`, spoken in Spread 4.x's client
//! protocol (docs/spread.md) to a daemon's Spread port, so that the compatibility can be tried
//! without a C compiler. `ADDR` is what Spread's libraries take (`4803` for the Unix socket
//! `/tmp/4803`, `4803@host` for TCP), or `host:port`, or `unix:/path`.
//!
//! What differs from the native client: no flush requests (`ack` has nothing to answer), a group
//! list may name private groups (`#name#daemon`) and groups the client is not in, `quit` sends
//! `KILL_MESS`, and the events are Spread's: a message lists every group it was sent to; a view
//! carries its group id, its vs_sets and which of them holds this client.

use crate::user_cmd::{parse_line, service_name, Line};
use anyhow::{bail, Context, Result};
use conclave_wire::spread::{self as sp, client};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Where a Spread client connects, read as Spread's libraries read it.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Tcp(String),
    Unix(String),
}

fn target(addr: &str) -> Result<Target> {
    if let Some(p) = addr.strip_prefix("unix:") {
        return Ok(Target::Unix(p.to_owned()));
    }
    let digits = addr.chars().take_while(char::is_ascii_digit).count();
    let (port, rest) = addr.split_at(digits);
    Ok(match (port.parse::<u16>(), rest) {
        (Ok(p), "") => Target::Unix(format!("/tmp/{p}")),
        (Ok(p), r) if r.starts_with('@') && r.len() > 1 => Target::Tcp(format!("{}:{p}", &r[1..])),
        _ if addr.contains(':') => Target::Tcp(addr.to_owned()),
        _ => bail!("a Spread address is PORT (the Unix socket /tmp/PORT), PORT@HOST, HOST:PORT or unix:/path"),
    })
}

async fn open(addr: &str) -> Result<Box<dyn Stream>> {
    Ok(match target(addr)? {
        Target::Tcp(a) => {
            let s = tokio::net::TcpStream::connect(&a)
                .await
                .with_context(|| format!("connecting to {a}"))?;
            s.set_nodelay(true)?;
            Box::new(s)
        }
        #[cfg(unix)]
        Target::Unix(p) => Box::new(
            tokio::net::UnixStream::connect(&p)
                .await
                .with_context(|| format!("connecting to {p}"))?,
        ),
        #[cfg(not(unix))]
        Target::Unix(_) => bail!("Unix sockets need a Unix system"),
    })
}

fn reject_name(code: i8) -> String {
    let name = match code {
        -3 => "REJECT_QUOTA",
        -5 => "REJECT_ILLEGAL_NAME",
        -6 => "REJECT_NOT_UNIQUE",
        -7 => "REJECT_VERSION",
        -9 => "REJECT_AUTH",
        _ => "reject",
    };
    format!("{name} ({code})")
}

fn service_of(kind: u32) -> &'static str {
    service_name(sp::service_type(kind))
}

fn cause_of(kind: u32) -> &'static str {
    match kind & 0xf00 {
        sp::CAUSED_BY_JOIN => "join",
        sp::CAUSED_BY_LEAVE => "leave",
        sp::CAUSED_BY_DISCONNECT => "disconnect",
        _ => "network",
    }
}

/// A message as JSON and as a line of text.
fn describe(m: &client::Message) -> (serde_json::Value, String) {
    let text = |d: &[u8]| String::from_utf8_lossy(d).into_owned();
    match m {
        client::Message::Data {
            kind,
            sender,
            groups,
            mess_type,
            endian_mismatch,
            data,
        } => (
            json!({"ev": "message", "groups": groups, "sender": sender,
                   "service": service_of(*kind), "self_discard": kind & sp::SELF_DISCARD != 0,
                   "mess_type": mess_type, "endian_mismatch": endian_mismatch,
                   "payload": text(data)}),
            format!(
                "{} <{sender}> [{}, type {mess_type}] {}",
                groups.join(","),
                service_of(*kind),
                text(data)
            ),
        ),
        client::Message::Membership {
            kind,
            group,
            members,
            id,
            vs_sets,
            local,
        } => (
            json!({"ev": "view", "group": group, "members": members, "reason": cause_of(*kind),
                   "id": [id.proc_id, id.time, id.index], "vs_sets": vs_sets, "local": local}),
            format!(
                "view of {group} ({}): {} [vs sets: {}]",
                cause_of(*kind),
                members.join(" "),
                vs_sets
                    .iter()
                    .map(|s| s.join(" "))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ),
        ),
        client::Message::Transitional { group, .. } => (
            json!({"ev": "transitional", "group": group}),
            format!("{group}: transitional signal"),
        ),
        client::Message::SelfLeave { group } => (
            json!({"ev": "left", "group": group}),
            format!("left {group}"),
        ),
        client::Message::Reject {
            old_kind, groups, ..
        } => (
            json!({"ev": "rejected", "type": format!("{old_kind:#x}"), "groups": groups}),
            format!("rejected: request {old_kind:#x} to {}", groups.join(",")),
        ),
    }
}

fn say(json_lines: bool, v: serde_json::Value, text: String) {
    if json_lines {
        println!("{v}");
    } else if !text.is_empty() {
        println!("{text}");
    }
}

pub async fn spread_user(addr: &str, name: &str, json_lines: bool, linger: u64) -> Result<()> {
    if name.len() > sp::MAX_PRIVATE_NAME {
        bail!(
            "a Spread client's name is at most {} bytes",
            sp::MAX_PRIVATE_NAME
        );
    }
    let mut s = open(addr).await?;
    s.write_all(&client::hello(name, true)).await?;
    let mut input = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let pg = loop {
        match client::accepted(&input) {
            Ok(Some((pg, used))) => {
                input.drain(..used);
                break pg;
            }
            Ok(None) => {}
            Err(code) => bail!("the daemon refused the connection: {}", reject_name(code)),
        }
        let n = s.read(&mut buf).await?;
        if n == 0 {
            bail!("the daemon closed the connection during the handshake");
        }
        input.extend_from_slice(&buf[..n]);
    };
    say(
        json_lines,
        json!({"ev": "connected", "name": pg}),
        format!("connected with private group {pg}"),
    );
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut input_open = true;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        // Messages already read, then wait for more.
        loop {
            match client::next_message(&input) {
                Ok(Some((m, used))) => {
                    input.drain(..used);
                    let (v, t) = describe(&m);
                    say(json_lines, v, t);
                }
                Ok(None) => break,
                Err(e) => bail!("the daemon sent what Spread's protocol does not allow: {e}"),
            }
        }
        let until = deadline.unwrap_or_else(|| {
            tokio::time::Instant::now() + std::time::Duration::from_secs(86_400)
        });
        tokio::select! {
            n = s.read(&mut buf) => {
                let n = n?;
                if n == 0 {
                    say(json_lines, json!({"ev": "disconnected"}), "the daemon closed the connection".into());
                    return Ok(());
                }
                input.extend_from_slice(&buf[..n]);
            }
            _ = tokio::time::sleep_until(until), if deadline.is_some() => break,
            line = stdin.next_line(), if input_open => {
                let Some(line) = line? else {
                    input_open = false;
                    deadline = Some(tokio::time::Instant::now() + std::time::Duration::from_millis(linger));
                    continue;
                };
                let req = match parse_line(&line) {
                    Err(e) => {
                        say(json_lines, json!({"ev": "error", "error": format!("{e:#}")}), format!("error: {e:#}"));
                        continue;
                    }
                    Ok(Line::Nothing) => continue,
                    Ok(Line::Quit) => break,
                    Ok(Line::Sleep(ms)) => {
                        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                        continue;
                    }
                    Ok(Line::Ack(_)) => {
                        say(json_lines, json!({"ev": "error", "error": "Spread's protocol has no flush requests"}), "error: Spread's protocol has no flush requests".into());
                        continue;
                    }
                    Ok(Line::Join(g, _)) => client::request(sp::JOIN_MESS, &pg, &[&g], 0, &[]),
                    Ok(Line::Leave(g)) => client::request(sp::LEAVE_MESS, &pg, &[&g], 0, &[]),
                    Ok(Line::Send(service, groups, text)) => {
                        let bit = sp::service_bit(service);
                        let names: Vec<&str> = groups.iter().map(String::as_str).collect();
                        client::request(bit, &pg, &names, 0, text.as_bytes())
                    }
                };
                s.write_all(&req).await?;
            }
        }
    }
    s.write_all(&client::request(sp::KILL_MESS, &pg, &[&pg], 0, &[]))
        .await?;
    let _ = s.shutdown().await;
    say(json_lines, json!({"ev": "bye"}), "Bye.".into());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_as_spread_reads_them() {
        assert_eq!(target("4803").unwrap(), Target::Unix("/tmp/4803".into()));
        assert_eq!(
            target("4803@localhost").unwrap(),
            Target::Tcp("localhost:4803".into())
        );
        assert_eq!(
            target("127.0.0.1:4803").unwrap(),
            Target::Tcp("127.0.0.1:4803".into())
        );
        assert_eq!(
            target("unix:/tmp/x").unwrap(),
            Target::Unix("/tmp/x".into())
        );
        assert!(target("spread").is_err());
        assert!(target("4803@").is_err());
    }
}
