//! Timing a membership event to the new view at every member (thesis 004 §4's Time_max and
//! Time_avg), for plain members (`bench membership`) and secure ones (`bench secure`) alike.

use crate::net_bench::{partition, statuses, Network};
use anyhow::{bail, Context, Result};
use std::time::{Duration, Instant};

/// What a member's next event is, to a benchmark that counts.
pub(crate) enum Seen {
    Message,
    View,
    Other,
}

/// The members a benchmark runs: plain clients or secure ones.
pub(crate) trait Members {
    type Tx: Send + 'static;
    type Rx: Send + 'static;
    /// Messages a sender hands over before it writes them out.
    const BATCH: u64;
    /// Member `i` (on daemon i mod n) connects as `name` and joins the group.
    async fn add(&mut self, net: &Network, i: usize, name: &str) -> Result<(Self::Tx, Self::Rx)>;
    /// Waits for the member's next view of `size` members.
    async fn wait(rx: &mut Self::Rx, size: usize) -> Result<()>;
    async fn leave(tx: &mut Self::Tx) -> Result<()>;
    async fn close(tx: Self::Tx);
    /// The member's next event (`None`: its session ended).
    fn next(rx: &mut Self::Rx) -> impl std::future::Future<Output = Option<Seen>> + Send;
    /// Sends a message to the group (handed over; written out by `flush` or a full window).
    fn send(
        tx: &mut Self::Tx,
        service: conclave_client::ServiceType,
        payload: &[u8],
    ) -> impl std::future::Future<Output = Result<()>> + Send;
    fn flush(tx: &mut Self::Tx) -> impl std::future::Future<Output = ()> + Send;
}

/// What one membership event looks like with `k` members (member i on daemon i mod n): the last
/// daemon is the one cut off.
pub(crate) struct EventPlan {
    /// The size of each member's side of the partition.
    pub(crate) sides: Vec<usize>,
    /// Who sees the change, and the size of the view each waits for.
    pub(crate) watch: Vec<usize>,
    pub(crate) size: Vec<usize>,
}

impl EventPlan {
    pub(crate) fn new(n: usize, k: usize, event: &str) -> EventPlan {
        let alone = (0..k).filter(|i| i % n == n - 1).count();
        let sides: Vec<usize> = (0..k)
            .map(|i| if i % n == n - 1 { alone } else { k - alone })
            .collect();
        let (watch, size) = match event {
            "join" => ((0..k).collect(), vec![k + 1; k]),
            "leave" => ((0..k - 1).collect(), vec![k - 1; k - 1]),
            // Daemon n-1 is cut off: its clients see their own side, the rest theirs.
            "partition" => ((0..k).collect(), sides.clone()),
            _ => ((0..k).collect(), vec![k; k]),
        };
        EventPlan { sides, watch, size }
    }
}

/// `k` members form the group (named `{tag}0`..), then `event` happens; gives Time_max and
/// Time_avg in milliseconds. The network is back in one ring, with nobody in the group, after.
pub(crate) async fn time_event<M: Members>(
    net: &Network,
    m: &mut M,
    k: usize,
    event: &str,
    tag: &str,
) -> Result<(f64, f64)> {
    let n = net.daemons.len();
    let mut members = Vec::new();
    for i in 0..k {
        members.push(m.add(net, i, &format!("{tag}{i}")).await?);
    }
    for (i, (_, r)) in members.iter_mut().enumerate() {
        if let Err(e) = M::wait(r, k).await {
            bail!(
                "member {i} of {k} ({tag}) saw no view of all: {e:#} ({})",
                statuses(net).await
            );
        }
    }
    let (mut senders, mut receivers): (Vec<_>, Vec<_>) = members.into_iter().unzip();
    let EventPlan { sides, watch, size } = EventPlan::new(n, k, event);
    if event == "merge" {
        // Each side in its own view first.
        partition(net, true).await?;
        for (i, r) in receivers.iter_mut().enumerate() {
            if let Err(e) = M::wait(r, sides[i]).await {
                bail!(
                    "member {i}'s side of the partition: {e:#} ({})",
                    statuses(net).await
                );
            }
        }
    }
    let t0 = Instant::now();
    let mut extra = None;
    match event {
        "join" => extra = Some(m.add(net, k, &format!("{tag}{k}")).await?),
        "leave" => {
            let mut s = senders.pop().context("a member")?;
            receivers.pop();
            M::leave(&mut s).await?;
            senders.push(s);
        }
        "partition" => partition(net, true).await?,
        _ => partition(net, false).await?,
    }
    let mut times = Vec::new();
    for (&i, &want) in watch.iter().zip(&size) {
        if let Err(e) = M::wait(&mut receivers[i], want).await {
            bail!(
                "{event} with {k} members: member {i} saw no view of {want}: {e:#} ({})",
                statuses(net).await
            );
        }
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let max = times.iter().cloned().fold(0.0, f64::max);
    let avg = times.iter().sum::<f64>() / times.len() as f64;
    if event == "partition" {
        partition(net, false).await?;
        net.wait_ring(n).await?;
    }
    if let Some((s, _)) = extra {
        M::close(s).await;
    }
    for s in senders {
        M::close(s).await;
    }
    net.wait_ring(n).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok((max, avg))
}

/// The row of `repeat` timed events: the means of Time_max and Time_avg, and the worst Time_max.
pub(crate) async fn time_events<M: Members>(
    net: &Network,
    m: &mut M,
    k: usize,
    event: &str,
    repeat: usize,
    tag: &str,
) -> Result<serde_json::Value> {
    let (mut maxes, mut avgs) = (Vec::new(), Vec::new());
    for rep in 0..repeat {
        let (max, avg) = time_event(net, m, k, event, &format!("{tag}{rep}-")).await?;
        maxes.push(max);
        avgs.push(avg);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let round = |x: f64| (x * 100.0).round() / 100.0;
    Ok(serde_json::json!({
        "daemons": net.daemons.len(), "event": event, "repeat": repeat,
        "time_max_ms": round(mean(&maxes)), "time_avg_ms": round(mean(&avgs)),
        "time_max_worst_ms": round(maxes.iter().cloned().fold(0.0, f64::max)),
    }))
}
