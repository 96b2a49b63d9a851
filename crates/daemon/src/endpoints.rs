//! The admin and metrics endpoints, and the admin protocol's client side (`conclave admin`).
//!
//! Both endpoints are closed to whoever merely reaches their port: an admin connection signs in
//! with an administrator's identity key ([`conclave_node::admin`]); a metrics request carries the
//! daemon's bearer token. Refusals are counted and logged at most once a second.

use crate::admin::{
    admin_proof_message, AdminChallenge, AdminProof, AdminReply, AdminRequest, MAX_ADMIN_LINE,
};
use crate::metrics::Metrics;
use crate::server::ToCore;
use anyhow::{bail, Context};
use conclave_crypto::identity_file::IdentityFile;
use conclave_crypto::PublicIdentity;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// How long an administrator has to answer the challenge, and a scraper to send its request.
const SIGN_IN: Duration = Duration::from_secs(5);

/// Who may sign in to this daemon's admin port, and what refusals cost.
pub(crate) struct AdminGate {
    pub daemon: String,
    pub keys: BTreeMap<String, PublicIdentity>,
    pub metrics: Arc<Metrics>,
    pub log: RefusalLog,
}

/// Logs refusals at most once a second, so that a flood of them cannot flood the log.
#[derive(Default)]
pub(crate) struct RefusalLog(Mutex<Option<Instant>>);

impl RefusalLog {
    fn refused(&self, what: &str, from: Option<SocketAddr>, why: &str) {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            *last = Some(Instant::now());
            tracing::warn!(from = ?from, "{what} refused: {why} (further refusals within a second are counted, not logged)");
        }
    }
}

/// Reads one line of at most [`MAX_ADMIN_LINE`] bytes; `None` at the end of the stream, on an
/// error, or past the limit.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> Option<String> {
    let mut line = String::new();
    match r.take(MAX_ADMIN_LINE as u64 + 1).read_line(&mut line).await {
        Ok(0) | Err(_) => None,
        Ok(_) if line.len() > MAX_ADMIN_LINE => None,
        Ok(_) => Some(line),
    }
}

async fn write_json<W: tokio::io::AsyncWrite + Unpin, T: serde::Serialize>(
    w: &mut W,
    v: &T,
) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(v).expect("admin lines serialize");
    out.push(b'\n');
    w.write_all(&out).await
}

/// Checks an administrator's answer to `nonce`: the name it gives, a key for that name, and
/// the signature under it.
fn check_proof(gate: &AdminGate, nonce: &[u8; 32], line: &str) -> Result<String, String> {
    let proof: AdminProof =
        serde_json::from_str(line.trim()).map_err(|e| format!("not a sign-in: {e}"))?;
    let key = gate
        .keys
        .get(&proof.name)
        .ok_or_else(|| format!("no administrator {:?} is known", proof.name))?;
    let sig = hex::decode(&proof.signature).map_err(|_| "the signature is not hex".to_owned())?;
    key.verify(&admin_proof_message(&gate.daemon, nonce), &sig)
        .map_err(|_| format!("the signature of {:?} does not verify", proof.name))?;
    Ok(proof.name)
}

pub(crate) async fn admin_session(
    s: tokio::net::TcpStream,
    gate: Arc<AdminGate>,
    core: mpsc::Sender<ToCore>,
) {
    let from = s.peer_addr().ok();
    let (r, mut w) = s.into_split();
    let mut lines = BufReader::new(r);
    let mut nonce = [0u8; 32];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut nonce);
    let hello = AdminChallenge {
        daemon: gate.daemon.clone(),
        challenge: hex::encode(nonce),
    };
    if write_json(&mut w, &hello).await.is_err() {
        return;
    }
    let answer = tokio::time::timeout(SIGN_IN, read_line(&mut lines)).await;
    let checked = match answer {
        Err(_) => Err("no sign-in in time".to_owned()),
        Ok(None) => Err("no sign-in".to_owned()),
        Ok(Some(line)) => check_proof(&gate, &nonce, &line),
    };
    let who = match checked {
        Ok(who) => who,
        Err(why) => {
            gate.metrics.admin_refusals.fetch_add(1, Relaxed);
            gate.log.refused("admin connection", from, &why);
            let _ = write_json(&mut w, &AdminReply::error(why)).await;
            return;
        }
    };
    tracing::debug!(admin = who, from = ?from, "admin signed in");
    if write_json(&mut w, &AdminReply::ok()).await.is_err() {
        return;
    }
    loop {
        let Some(line) = read_line(&mut lines).await else {
            return;
        };
        let reply = match serde_json::from_str::<AdminRequest>(line.trim()) {
            Err(e) => AdminReply::error(format!("bad request: {e}")),
            Ok(req) => {
                if matches!(req, AdminRequest::Shutdown | AdminRequest::Partition { .. }) {
                    tracing::info!(admin = who, request = line.trim(), "admin request");
                }
                let (reply, rx) = oneshot::channel();
                if core.send(ToCore::Admin { req, reply }).await.is_err() {
                    return;
                }
                rx.await
                    .unwrap_or_else(|_| AdminReply::error("the daemon has stopped"))
            }
        };
        if write_json(&mut w, &reply).await.is_err() {
            return;
        }
    }
}

/// Who may read this daemon's metrics.
pub(crate) struct MetricsGate {
    pub token: zeroize::Zeroizing<String>,
    pub metrics: Arc<Metrics>,
    pub log: RefusalLog,
}

/// Reads a metrics token file: its first line, which must not be empty.
pub(crate) fn read_token(path: &std::path::Path) -> anyhow::Result<zeroize::Zeroizing<String>> {
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path)
            .with_context(|| format!("reading the metrics token file {}", path.display()))?,
    );
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        bail!("the metrics token file {} is empty", path.display());
    }
    Ok(zeroize::Zeroizing::new(token.to_owned()))
}

/// The token an HTTP request head carries in `Authorization: Bearer`, if any.
fn bearer(head: &str) -> Option<&str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if !k.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let v = v.trim();
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    })
}

pub(crate) async fn serve_metrics(mut s: tokio::net::TcpStream, gate: Arc<MetricsGate>) {
    let from = s.peer_addr().ok();
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(SIGN_IN, async {
        while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&head);
    // Compared as digests, so that the comparison takes as long whatever the token's length.
    let digest = |t: &[u8]| conclave_crypto::kdf::derive::<32>(b"conclave metrics token", t, b"");
    let allowed = read.is_ok()
        && bearer(&text).is_some_and(|t| {
            subtle::ConstantTimeEq::ct_eq(
                &digest(t.as_bytes())[..],
                &digest(gate.token.as_bytes())[..],
            )
            .into()
        });
    let (status, body) = if allowed {
        ("200 OK", gate.metrics.render())
    } else {
        gate.metrics.metrics_refusals.fetch_add(1, Relaxed);
        gate.log.refused(
            "metrics request",
            from,
            "no bearer token, or not the daemon's",
        );
        (
            "401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"conclave\"",
            "a bearer token is required\n".to_owned(),
        )
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// An admin connection, signed in.
pub struct AdminClient {
    lines: BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: tokio::net::tcp::OwnedWriteHalf,
    addr: SocketAddr,
}

/// How long `conclave admin` waits for a daemon's answer.
const ANSWER: Duration = Duration::from_secs(5);

impl AdminClient {
    /// Connects to daemon `daemon`'s admin address and signs in as `identity` (its name is the
    /// one the configuration lists the key under: the daemon's own, or an `[[admin]]`'s). A
    /// challenge in another daemon's name is refused unsigned: whoever answers at the address
    /// could be relaying that daemon's challenge to sign in there with this proof.
    pub async fn connect(
        addr: SocketAddr,
        daemon: &str,
        identity: &IdentityFile,
    ) -> anyhow::Result<Self> {
        let s = tokio::time::timeout(ANSWER, tokio::net::TcpStream::connect(addr))
            .await
            .with_context(|| format!("{addr}: no answer"))?
            .with_context(|| format!("connecting to {addr}"))?;
        let (r, w) = s.into_split();
        let mut c = AdminClient {
            lines: BufReader::new(r),
            w,
            addr,
        };
        let hello: AdminChallenge = c.read().await?;
        if hello.daemon != daemon {
            bail!(
                "{addr} answers as daemon {:?}, not {daemon:?}: no proof is signed for it",
                hello.daemon
            );
        }
        let nonce: [u8; 32] = hex::decode(&hello.challenge)
            .ok()
            .and_then(|b| b.try_into().ok())
            .with_context(|| format!("{addr}: a challenge that is not 32 bytes of hex"))?;
        let signature = identity
            .identity()
            .sign(&admin_proof_message(&hello.daemon, &nonce))
            .map_err(|e| anyhow::anyhow!("signing the admin proof: {e}"))?;
        let proof = AdminProof {
            name: identity.name.clone(),
            signature: hex::encode(signature),
        };
        write_json(&mut c.w, &proof).await?;
        let r: AdminReply = c.read().await?;
        if !r.ok {
            bail!(
                "{addr} ({}) refused the sign-in as {:?}: {}",
                hello.daemon,
                identity.name,
                r.error.unwrap_or_default()
            );
        }
        Ok(c)
    }

    async fn read<T: serde::de::DeserializeOwned>(&mut self) -> anyhow::Result<T> {
        let addr = self.addr;
        let line = tokio::time::timeout(ANSWER, read_line(&mut self.lines))
            .await
            .with_context(|| format!("{addr}: no answer"))?
            .with_context(|| format!("{addr}: the connection closed"))?;
        serde_json::from_str(line.trim()).with_context(|| format!("{addr}: a bad answer"))
    }

    pub async fn ask(&mut self, req: &AdminRequest) -> anyhow::Result<AdminReply> {
        write_json(&mut self.w, req).await?;
        self.read().await
    }
}

/// Signs in to daemon `daemon`'s admin address and sends one request.
pub async fn ask(
    addr: SocketAddr,
    daemon: &str,
    identity: &IdentityFile,
    req: &AdminRequest,
) -> anyhow::Result<AdminReply> {
    AdminClient::connect(addr, daemon, identity)
        .await?
        .ask(req)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_token_is_found_in_any_case_of_the_header() {
        let h = "GET /metrics HTTP/1.1\r\nHost: x\r\nauthorization: bearer s3cret\r\n\r\n";
        assert_eq!(bearer(h), Some("s3cret"));
        assert_eq!(
            bearer("GET / HTTP/1.1\r\nAuthorization: Basic eA==\r\n\r\n"),
            None
        );
        assert_eq!(bearer("GET / HTTP/1.1\r\n\r\n"), None);
        // The request line is never a header, whatever it says.
        assert_eq!(bearer("Authorization: Bearer x\r\n\r\n"), None);
    }
}
