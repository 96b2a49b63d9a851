//! Spread clients for `conclave bench throughput --spread`: members that speak Spread 4.x's
//! client protocol to the daemons' Spread ports (docs/spread.md), as an application built on
//! libspread would: a sender writes its requests back to back (Spread has no window: TCP's flow
//! control, and the daemon's reading no further, hold it back), a receiver reads each message's
//! header and takes its bytes.

use crate::net_bench::Network;
use crate::view_timing::{Members, Seen};
use anyhow::{bail, Context, Result};
use conclave_client::ServiceType;
use conclave_wire::spread::{self as sp, client, Header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

const GROUP: &str = "bench";

pub(crate) struct SpreadMembers;

pub(crate) struct SpreadTx {
    w: OwnedWriteHalf,
    private_group: String,
    out: Vec<u8>,
}

pub(crate) struct SpreadRx {
    r: OwnedReadHalf,
    buf: Vec<u8>,
    at: usize,
}

impl SpreadRx {
    /// The next whole message's bytes (its header first); `None` once the connection ends.
    async fn next_bytes(&mut self) -> Option<(u32, std::ops::Range<usize>)> {
        loop {
            let rest = &self.buf[self.at..];
            if let Some(head) = rest.first_chunk::<{ sp::HEADER_BYTES }>() {
                let h = Header::decode(head);
                let extra = if h.kind & sp::REJECT_MESS != 0 { 4 } else { 0 };
                let len = sp::HEADER_BYTES
                    + extra
                    + sp::GROUP_NAME_BYTES * h.num_groups.max(0) as usize
                    + h.data_len.max(0) as usize;
                if rest.len() >= len {
                    let r = self.at..self.at + len;
                    self.at += len;
                    return Some((h.kind, r));
                }
            }
            if self.at > 0 && self.at * 2 >= self.buf.len() {
                self.buf.drain(..self.at);
                self.at = 0;
            }
            self.buf.reserve(64 * 1024);
            match self.r.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}

impl Members for SpreadMembers {
    type Tx = SpreadTx;
    type Rx = SpreadRx;
    const BATCH: u64 = 32;

    async fn add(&mut self, net: &Network, i: usize, name: &str) -> Result<(SpreadTx, SpreadRx)> {
        let d = &net.cfg.daemon[i % net.cfg.daemon.len()];
        let addr = d.spread.context("the daemons have no Spread port")?;
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let (mut r, mut w) = s.into_split();
        w.write_all(&client::hello(name, true)).await?;
        let mut buf = Vec::new();
        let (private_group, used) = loop {
            match client::accepted(&buf) {
                Ok(Some(a)) => break a,
                Ok(None) => {}
                Err(code) => bail!("the daemon refused Spread client {name}: {code}"),
            }
            if r.read_buf(&mut buf).await? == 0 {
                bail!("the daemon closed Spread client {name}'s connection");
            }
        };
        buf.drain(..used);
        w.write_all(&client::request(
            sp::JOIN_MESS,
            &private_group,
            &[GROUP],
            0,
            &[],
        ))
        .await?;
        let tx = SpreadTx {
            w,
            private_group,
            out: Vec::with_capacity(64 * 1024),
        };
        Ok((tx, SpreadRx { r, buf, at: 0 }))
    }

    async fn wait(rx: &mut SpreadRx, size: usize) -> Result<()> {
        loop {
            let Some((kind, range)) = rx.next_bytes().await else {
                bail!("the connection ended");
            };
            if kind & sp::REG_MEMB_MESS == 0 {
                continue;
            }
            if let Ok(Some((client::Message::Membership { members, .. }, _))) =
                client::next_message(&rx.buf[range])
            {
                if members.len() == size {
                    return Ok(());
                }
            }
        }
    }

    async fn leave(tx: &mut SpreadTx) -> Result<()> {
        let req = client::request(sp::LEAVE_MESS, &tx.private_group, &[GROUP], 0, &[]);
        Ok(tx.w.write_all(&req).await?)
    }

    async fn close(mut tx: SpreadTx) {
        let pg = tx.private_group.clone();
        let _ =
            tx.w.write_all(&client::request(sp::KILL_MESS, &pg, &[&pg], 0, &[]))
                .await;
        let _ = tx.w.shutdown().await;
    }

    async fn next(rx: &mut SpreadRx) -> Option<Seen> {
        let (kind, _) = rx.next_bytes().await?;
        Some(if kind & sp::REJECT_MESS != 0 {
            Seen::Refused
        } else if kind & sp::REGULAR_MESS != 0 {
            Seen::Message
        } else if kind & sp::REG_MEMB_MESS != 0 {
            Seen::View
        } else {
            Seen::Other
        })
    }

    async fn send(tx: &mut SpreadTx, service: ServiceType, payload: &[u8]) -> Result<()> {
        let hint = (1u32 << 8 | sp::ENDIAN_MARK).to_le_bytes();
        sp::write_data(
            &mut tx.out,
            sp::service_bit(service),
            &tx.private_group,
            &[GROUP],
            hint,
            payload,
        );
        if tx.out.len() >= 16 * 1024 {
            SpreadMembers::flush(tx).await;
        }
        Ok(())
    }

    async fn flush(tx: &mut SpreadTx) {
        let _ = tx.w.write_all(&tx.out).await;
        tx.out.clear();
    }
}
