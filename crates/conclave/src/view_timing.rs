//! Timing a membership event to the new view at every member (thesis 004 §4's Time_max and
//! Time_avg), for plain members (`bench membership`) and secure ones (`bench secure`) alike.

use crate::net_bench::{partition, split, statuses, Network};
use anyhow::{bail, Context, Result};
use std::time::{Duration, Instant};

/// What a member's next event is, to a benchmark that counts.
pub(crate) enum Seen {
    Message,
    View,
    /// The daemon refused one of this member's messages (it is not delivered).
    Refused,
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
    fn wait(rx: &mut Self::Rx, size: usize)
        -> impl std::future::Future<Output = Result<()>> + Send;
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
    let mut wanted = vec![None; receivers.len()];
    for (&i, &want) in watch.iter().zip(&size) {
        wanted[i] = Some(want);
    }
    // The receivers stay until the members close: a member that stops reading ends its session.
    let (receivers, times) = wait_all::<M>(receivers, &wanted, t0).await;
    let times = match times {
        Ok(t) => t.into_iter().flatten().collect::<Vec<f64>>(),
        Err((i, e)) => {
            if event == "partition" || event == "merge" {
                // Healed first: the caller goes on with the network whole.
                let _ = partition(net, false).await;
            }
            bail!(
                "{event} with {k} members: member {i} saw no view of {:?}: {e:#} ({})",
                wanted[i],
                statuses(net).await
            )
        }
    };
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
    drop(receivers);
    net.wait_ring(n).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok((max, avg))
}

/// Waits, all at once, for each member's view of the size `wanted` gives it (none: not watched),
/// so that each member's time (ms from `t0`) is when its own view came. The receivers come back
/// in their order; an error names the member.
#[allow(clippy::type_complexity)]
async fn wait_all<M: Members>(
    receivers: Vec<M::Rx>,
    wanted: &[Option<usize>],
    t0: Instant,
) -> (Vec<M::Rx>, Result<Vec<Option<f64>>, (usize, anyhow::Error)>) {
    let tasks: Vec<_> = receivers
        .into_iter()
        .zip(wanted.iter().copied())
        .map(|(mut r, want)| {
            tokio::spawn(async move {
                let t = match want {
                    Some(size) => M::wait(&mut r, size)
                        .await
                        .map(|()| Some(t0.elapsed().as_secs_f64() * 1e3)),
                    None => Ok(None),
                };
                (r, t)
            })
        })
        .collect();
    let mut back = Vec::new();
    let mut times = Ok(Vec::new());
    for (i, task) in tasks.into_iter().enumerate() {
        let (r, t) = task.await.expect("a member's wait does not panic");
        back.push(r);
        match (&mut times, t) {
            (Ok(all), Ok(t)) => all.push(t),
            (Ok(_), Err(e)) => times = Err((i, e)),
            (Err(_), _) => {}
        }
    }
    (back, times)
}

/// Experiment E3, the clustering effect (paper 000 §6.1.5, Fig 13): the odd-numbered members
/// are cut off from the even-numbered ones (P1), the two sides merge, and the same cut happens
/// again (P2). Gives Time_max (ms) of each side for each cut: `[P1 even, P1 odd, P2 even, P2
/// odd]`. Member i is on a daemon of i's parity, so that cutting the odd daemons from the even
/// ones cuts the odd members from the even ones; it takes two daemons at least.
pub(crate) async fn time_clustering<M: Members>(
    net: &Network,
    m: &mut M,
    k: usize,
    tag: &str,
) -> Result<[f64; 4]> {
    let n = net.daemons.len();
    if n < 2 {
        bail!("the clustering experiment needs two daemons at least");
    }
    let parity: [Vec<usize>; 2] = [(0..n).step_by(2).collect(), (1..n).step_by(2).collect()];
    let mut members = Vec::new();
    for i in 0..k {
        let on = &parity[i % 2];
        members.push(
            m.add(net, on[(i / 2) % on.len()], &format!("{tag}{i}"))
                .await?,
        );
    }
    let (senders, mut receivers): (Vec<_>, Vec<_>) = members.into_iter().unzip();
    for (i, r) in receivers.iter_mut().enumerate() {
        if let Err(e) = M::wait(r, k).await {
            bail!(
                "member {i} of {k} ({tag}) saw no view of all: {e:#} ({})",
                statuses(net).await
            );
        }
    }
    let names = |side: &[usize]| -> Vec<String> {
        side.iter()
            .map(|&d| net.cfg.daemon[d].name.clone())
            .collect()
    };
    let sets = vec![names(&parity[0]), names(&parity[1])];
    let side_size = [k.div_ceil(2), k / 2];
    let mut out = [0.0f64; 4];
    let sides: Vec<Option<usize>> = (0..k).map(|i| Some(side_size[i % 2])).collect();
    for cut in 0..2 {
        let t0 = Instant::now();
        split(net, Some(sets.clone())).await?;
        let (back, times) = wait_all::<M>(receivers, &sides, t0).await;
        receivers = back;
        let times = match times {
            Ok(t) => t,
            // Healed first: the caller goes on with the network whole.
            Err((i, e)) => {
                let _ = split(net, None).await;
                bail!(
                    "P{}: member {i} saw no view of its side: {e:#} ({})",
                    cut + 1,
                    statuses(net).await
                )
            }
        };
        for (i, t) in times.into_iter().enumerate() {
            let slot = &mut out[2 * cut + i % 2];
            *slot = f64::max(*slot, t.unwrap_or(0.0));
        }
        split(net, None).await?;
        for (i, r) in receivers.iter_mut().enumerate() {
            if let Err(e) = M::wait(r, k).await {
                bail!(
                    "merge after P{}: member {i} saw no view of all: {e:#} ({})",
                    cut + 1,
                    statuses(net).await
                );
            }
        }
    }
    for s in senders {
        M::close(s).await;
    }
    net.wait_ring(n).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(out)
}

/// The row of `repeat` timed events: the means of Time_max and Time_avg, and the worst Time_max
/// (for `cluster`, the means of [`time_clustering`]'s four times; `time_max_ms` is P1's).
pub(crate) async fn time_events<M: Members>(
    net: &Network,
    m: &mut M,
    k: usize,
    event: &str,
    repeat: usize,
    tag: &str,
) -> Result<serde_json::Value> {
    if event == "cluster" {
        let mut sums = [0.0; 4];
        for rep in 0..repeat {
            let t = time_clustering(net, m, k, &format!("{tag}{rep}-")).await?;
            for (s, t) in sums.iter_mut().zip(t) {
                *s += t / repeat as f64;
            }
        }
        let round = |x: f64| (x * 100.0).round() / 100.0;
        return Ok(serde_json::json!({
            "daemons": net.daemons.len(), "event": event, "repeat": repeat,
            "time_max_ms": round(sums[0].max(sums[1])),
            "p2_time_max_ms": round(sums[2].max(sums[3])),
            "p1_even_ms": round(sums[0]), "p1_odd_ms": round(sums[1]),
            "p2_even_ms": round(sums[2]), "p2_odd_ms": round(sums[3]),
        }));
    }
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
