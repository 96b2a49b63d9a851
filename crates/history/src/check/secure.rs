//! The secure layer (RELIABILITY.md "Secure layer"): K1 one key per secure view and no key in
//! two, K2 a secure view is a view of the layer below that the process installed, with the same
//! members, K3 nothing fails to open in a correct run, K4 a process holds only keys of views it is
//! a member of (so, with K1, a leaver holds no later key and a joiner no earlier one), K6 once
//! stable every member's secure view is its final view. Keys appear only as fingerprints.
//!
//! Where the history has the secure layer's data (`secure_send`, `secure_deliver`): K2 at this
//! layer, every message is delivered in the receiver's current secure view, the one it was
//! sealed in, the same at every receiver, and from a member of it; K3, nothing is delivered
//! twice or without having been sent. Where it has the key agreement's intake
//! (`secure_consumed`): K5, a run takes in only messages signed for its own view. (K7 compares
//! runs of the five protocols, not one history: `crates/secure/tests/over_daemons.rs`.)
//!
//! A daemon records the views it hands a client when it hands them; the client installs a view's
//! secure view later, when it has read the view and agreed the key. So a secure view is checked
//! against every view the process was given, not only the latest record.

use super::*;

/// Keys seen so far, by view and by key: one key per view, and no key in two views.
#[derive(Default)]
struct KeysSeen<'a> {
    by_view: HashMap<(&'a str, &'a ViewId), (&'a str, usize)>,
    by_key: HashMap<&'a str, (&'a str, &'a ViewId, usize)>,
}

impl<'a> KeysSeen<'a> {
    /// Takes `key` of `view` of `group` (record `i`); reports under `property` a view with two
    /// keys or a key in two views, `what` naming how the key came.
    fn see(
        &mut self,
        group: &'a str,
        view: &'a ViewId,
        key: &'a str,
        i: usize,
        (property, what): (&'static str, &str),
        rep: &mut Report<'_>,
    ) {
        match self.by_view.get(&(group, view)) {
            Some((k, rec)) if *k != key => rep.add(
                property,
                format!("two keys {what} in view {view} of {group}: {k} and {key}"),
                &[*rec, i],
            ),
            Some(_) => {}
            None => {
                self.by_view.insert((group, view), (key, i));
            }
        }
        match self.by_key.get(key) {
            Some((g, v, rec)) if (*g, *v) != (group, view) => rep.add(
                property,
                format!("key {key} {what} in view {v} of {g} and in view {view} of {group}"),
                &[*rec, i],
            ),
            Some(_) => {}
            None => {
                self.by_key.insert(key, (group, view, i));
            }
        }
    }

    /// The key first seen for `view` of `group`, and its record.
    fn of(&self, group: &str, view: &ViewId) -> Option<(&'a str, usize)> {
        self.by_view.get(&(group, view)).copied()
    }
}

pub(super) fn secure(records: &[Record], f: &Facts, rep: &mut Report<'_>) {
    // (process, group) -> the view installed last, with its members and record.
    let mut current: HashMap<(Proc, &str), (&ViewId, &[String], usize)> = HashMap::new();
    // (process, group, view) -> its members and record.
    let mut installed: HashMap<(Proc, &str, &ViewId), (&[String], usize)> = HashMap::new();
    let mut left: HashMap<(Proc, &str), usize> = HashMap::new();
    // Key servers of groups: in the views, not secure members.
    let mut servers: HashSet<(Proc, &str)> = HashSet::new();
    let mut last_secure: HashMap<(Proc, &str), (&ViewId, usize)> = HashMap::new();
    let mut keys = KeysSeen::default();
    let mut secure_groups: HashSet<&str> = HashSet::new();
    // What the applications handed their secure layers, and where each message was delivered.
    let mut sent: HashSet<(&str, &str)> = HashSet::new();
    let mut delivered_in: HashMap<(&str, &str), (&ViewId, usize)> = HashMap::new();
    let mut delivered: HashMap<(Proc, &str, &str), usize> = HashMap::new();
    let mut deliveries: Vec<(&str, &str, usize)> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let proc: Proc = (r.p.clone(), r.inc);
        match &r.ev {
            Event::View {
                group,
                view,
                members,
                ..
            } if !group.is_empty() => {
                current.insert((proc.clone(), group), (view, members, i));
                installed.insert((proc.clone(), group, view), (members, i));
                left.remove(&(proc, group.as_str()));
            }
            Event::Leave { group } => {
                left.insert((proc, group), i);
            }
            Event::KeyServer { group } => {
                servers.insert((proc, group));
            }
            Event::SecureView {
                group,
                view,
                members,
                key,
                without,
            } => {
                secure_groups.insert(group);
                if !members.contains(&r.p) {
                    rep.add(
                        "K4",
                        format!(
                            "{} holds the key of view {view} of {group}, not its member",
                            r.p
                        ),
                        &[i],
                    );
                }
                // The view's members, less those it names as holding no key, in their order.
                let holders = |m: &[String]| {
                    without.iter().all(|w| m.contains(w))
                        && m.iter().filter(|x| !without.contains(x)).eq(members.iter())
                };
                match installed.get(&(proc.clone(), group.as_str(), view)) {
                    Some((m, _)) if holders(m) => {}
                    Some((_, vrec)) => rep.add(
                        "K2",
                        format!("{}'s secure view {view} of {group} has other members", r.p),
                        &[*vrec, i],
                    ),
                    None => rep.add(
                        "K2",
                        format!(
                            "{} has a secure view {view} of {group} it was never given",
                            r.p
                        ),
                        &[i],
                    ),
                }
                keys.see(group, view, key, i, ("K1", "installed"), rep);
                last_secure.insert((proc, group), (view, i));
            }
            Event::SecureSend { group, msg } => {
                sent.insert((group, msg));
            }
            Event::SecureDeliver {
                group,
                msg,
                sender,
                view,
            } => {
                // Delivered in the secure view it was sealed in, which is the receiver's
                // current one, and whose members include the sender.
                match last_secure.get(&(proc.clone(), group.as_str())) {
                    Some((v, srec)) if *v == view => {
                        let members = match &records[*srec].ev {
                            Event::SecureView { members, .. } => members.as_slice(),
                            _ => &[],
                        };
                        if !members.contains(sender) {
                            rep.add(
                                "K2",
                                format!(
                                    "{} delivered {msg} of {group} from {sender}, not a member \
                                     of secure view {view}",
                                    r.p
                                ),
                                &[*srec, i],
                            );
                        }
                    }
                    other => {
                        let mut recs: Vec<usize> = other.iter().map(|(_, s)| *s).collect();
                        recs.push(i);
                        rep.add(
                            "K2",
                            format!(
                                "{} delivered {msg} of {group} sealed in secure view {view}, its \
                                 secure view being {}",
                                r.p,
                                other.map_or("none".to_owned(), |(v, _)| v.to_string())
                            ),
                            &recs,
                        );
                    }
                }
                match delivered_in.get(&(group.as_str(), msg.as_str())) {
                    Some((v, first)) if *v != view => rep.add(
                        "K2",
                        format!("{msg} of {group} delivered in secure views {v} and {view}"),
                        &[*first, i],
                    ),
                    Some(_) => {}
                    None => {
                        delivered_in.insert((group, msg), (view, i));
                    }
                }
                if let Some(first) = delivered.insert((proc.clone(), group, msg), i) {
                    rep.add(
                        "K3",
                        format!("{} delivered {msg} of {group} twice", r.p),
                        &[first, i],
                    );
                }
                deliveries.push((group, msg, i));
            }
            Event::SecureConsumed {
                group,
                sender,
                signed_for,
                run,
            } if signed_for != run => rep.add(
                "K5",
                format!(
                    "{}'s key agreement run of view {run} of {group} took in a message of \
                     {sender} for view {signed_for}",
                    r.p
                ),
                &[i],
            ),
            Event::SecureRefused {
                group,
                sender,
                error,
            } if error == "open_failed" || error == "replay" => rep.add(
                "K3",
                format!("{} refused data of {group} from {sender}: {error}", r.p),
                &[i],
            ),
            _ => {}
        }
    }
    // K3: what is delivered was sent (where the history records the sends).
    if !sent.is_empty() {
        for (group, msg, i) in deliveries {
            if !sent.contains(&(group, msg)) {
                rep.add(
                    "K3",
                    format!("{} delivered {msg} of {group}, never sent", records[i].p),
                    &[i],
                );
            }
        }
    }
    // K6: once stable, every secure member's last secure view is its last view.
    let Some((_, stable, srec)) = &f.stable else {
        return;
    };
    let mut last_inc: HashMap<&str, u32> = HashMap::new();
    for r in records {
        let e = last_inc.entry(r.p.as_str()).or_insert(r.inc);
        *e = (*e).max(r.inc);
    }
    for ((proc, group), (view, _, vrec)) in &current {
        if !stable.contains(&proc.0)
            || last_inc.get(proc.0.as_str()) != Some(&proc.1)
            || !secure_groups.contains(group)
            || left.contains_key(&(proc.clone(), *group))
            || servers.contains(&(proc.clone(), *group))
            || f.crashed.contains_key(proc)
        {
            continue;
        }
        match last_secure.get(&(proc.clone(), *group)) {
            Some((v, _)) if v == view => {}
            other => {
                let mut recs = vec![*srec, *vrec];
                recs.extend(other.map(|(_, r)| *r));
                rep.add(
                    "K6",
                    format!(
                        "{} ends in view {view} of {group} without its key{}",
                        proc.0,
                        other.map_or(String::new(), |(v, _)| format!(" (last key: view {v})"))
                    ),
                    &recs,
                );
            }
        }
    }
}

/// The daemons' own group, whose keys are the daemons' keys (the integrated architecture's K_s).
pub const DAEMONS_GROUP: &str = "#daemons";

/// S-ring-key: a daemons' key is held by daemons of one ring and no one else. Every secure view
/// of [`DAEMONS_GROUP`] lists as members only daemons (each under `#` and its name) of the ring
/// its view belongs to, as those daemons recorded that ring; with K1 and K4, no process outside
/// that ring holds the key. (Not all of them: a daemon's member joins the group a moment after
/// its daemon joins the ring, so a ring's first group views may lack it.)
pub(super) fn daemons_key(records: &[Record], rep: &mut Report<'_>) {
    // (ring seq, representative) -> the ring's daemons, as a daemon recorded it.
    let mut rings: HashMap<(u64, &str), BTreeSet<&str>> = HashMap::new();
    for r in records {
        if let Event::View {
            group,
            view,
            members,
            ..
        } = &r.ev
        {
            if group.is_empty() {
                let daemons = members.iter().map(String::as_str).collect();
                rings.entry((view.0, view.1.as_str())).or_insert(daemons);
            }
        }
    }
    for (i, r) in records.iter().enumerate() {
        let Event::SecureView {
            group,
            view,
            members,
            key,
            ..
        } = &r.ev
        else {
            continue;
        };
        if group != DAEMONS_GROUP {
            continue;
        }
        let holders: BTreeSet<&str> = members
            .iter()
            .map(|m| m.strip_prefix('#').unwrap_or("(not a daemon)"))
            .collect();
        // A group view's number is its ring's sequence number, then its index on the ring.
        match rings.get(&(view.0 >> 32, view.1.as_str())) {
            Some(ring) if holders.is_subset(ring) => {}
            Some(ring) => rep.add(
                "S-ring-key",
                format!(
                    "{} holds daemons' key {key} of view {view} with {holders:?}, beyond \
                     that ring's daemons {ring:?}",
                    r.p
                ),
                &[i],
            ),
            None => rep.add(
                "S-ring-key",
                format!(
                    "{} holds daemons' key {key} of view {view}, of a ring no daemon installed",
                    r.p
                ),
                &[i],
            ),
        }
    }
}

/// S-group-key: a group key the daemons derive reaches only that view's members, and is one key
/// for one view. Every key a daemon hands a process is of a view the process was given and is a
/// member of; all handed for a view are the same, no two views get the same one, and a secure
/// view installed in a view whose key was handed holds that key.
pub(super) fn group_keys(records: &[Record], rep: &mut Report<'_>) {
    // (process, group, view) -> the view's members, as given to the process.
    let mut given: HashMap<(Proc, &str, &ViewId), &[String]> = HashMap::new();
    let mut handed = KeysSeen::default();
    for (i, r) in records.iter().enumerate() {
        let proc: Proc = (r.p.clone(), r.inc);
        match &r.ev {
            Event::View {
                group,
                view,
                members,
                ..
            } if !group.is_empty() => {
                given.insert((proc, group, view), members);
            }
            Event::GroupKey { group, view, key } => {
                match given.get(&(proc, group.as_str(), view)) {
                    Some(members) if members.contains(&r.p) => {}
                    Some(_) => rep.add(
                        "S-group-key",
                        format!(
                            "{} was handed the key of view {view} of {group}, not its member",
                            r.p
                        ),
                        &[i],
                    ),
                    None => rep.add(
                        "S-group-key",
                        format!(
                            "{} was handed the key of view {view} of {group}, a view it was \
                             never given",
                            r.p
                        ),
                        &[i],
                    ),
                }
                handed.see(group, view, key, i, ("S-group-key", "handed"), rep);
            }
            _ => {}
        }
    }
    for (i, r) in records.iter().enumerate() {
        if let Event::SecureView {
            group, view, key, ..
        } = &r.ev
        {
            if let Some((k, rec)) = handed.of(group, view) {
                if k != key {
                    rep.add(
                        "S-group-key",
                        format!(
                            "{}'s secure view {view} of {group} holds key {key}, not the \
                             handed {k}",
                            r.p
                        ),
                        &[rec, i],
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::check::{check, Config};
    use crate::record::{Event, Record, ViewId};

    fn rec(t: u64, p: &str, ev: Event) -> Record {
        Record {
            t,
            p: p.into(),
            inc: 0,
            ev,
        }
    }

    fn view(n: u64, members: &[&str]) -> Event {
        Event::View {
            group: "g".into(),
            view: ViewId(n, "d1".into()),
            members: members.iter().map(|m| m.to_string()).collect(),
            transitional: vec![],
        }
    }

    fn secure(n: u64, members: &[&str], key: &str) -> Event {
        Event::SecureView {
            group: "g".into(),
            view: ViewId(n, "d1".into()),
            members: members.iter().map(|m| m.to_string()).collect(),
            key: key.into(),
            without: Vec::new(),
        }
    }

    /// A correct history: a and b in view 1 with key k1, then a alone in view 2 with k2.
    fn good() -> Vec<Record> {
        vec![
            rec(
                1,
                "a",
                Event::Join {
                    group: "g".into(),
                    vs: true,
                },
            ),
            rec(
                2,
                "b",
                Event::Join {
                    group: "g".into(),
                    vs: true,
                },
            ),
            rec(3, "a", view(1, &["a", "b"])),
            rec(3, "b", view(1, &["a", "b"])),
            rec(4, "a", secure(1, &["a", "b"], "k1")),
            rec(4, "b", secure(1, &["a", "b"], "k1")),
            rec(5, "b", Event::Leave { group: "g".into() }),
            rec(6, "a", view(2, &["a"])),
            rec(7, "a", secure(2, &["a"], "k2")),
            rec(
                8,
                "",
                Event::Stable {
                    processes: vec!["a".into()],
                },
            ),
        ]
    }

    fn properties(h: &[Record]) -> Vec<&'static str> {
        let mut p: Vec<_> = check(h, &Config::default())
            .into_iter()
            .map(|v| v.property)
            .filter(|p| p.starts_with('K'))
            .collect();
        p.dedup();
        p
    }

    fn send(p: &str, msg: &str) -> Record {
        rec(
            4,
            p,
            Event::SecureSend {
                group: "g".into(),
                msg: msg.into(),
            },
        )
    }

    fn deliver(p: &str, msg: &str, sender: &str, view: u64) -> Record {
        rec(
            4,
            p,
            Event::SecureDeliver {
                group: "g".into(),
                msg: msg.into(),
                sender: sender.into(),
                view: ViewId(view, "d1".into()),
            },
        )
    }

    fn consumed(p: &str, signed_for: u64, run: u64) -> Record {
        rec(
            3,
            p,
            Event::SecureConsumed {
                group: "g".into(),
                sender: "b".into(),
                signed_for: ViewId(signed_for, "d1".into()),
                run: ViewId(run, "d1".into()),
            },
        )
    }

    /// [`good`] with the secure layer's data and key agreement intake in view 1: a sends m1 and
    /// m2, both deliver m1.
    fn with_data() -> Vec<Record> {
        let mut h = good();
        h.splice(
            6..6,
            [
                send("a", "a:m1"),
                send("a", "a:m2"),
                deliver("a", "a:m1", "a", 1),
                deliver("b", "a:m1", "a", 1),
            ],
        );
        h.insert(4, consumed("a", 1, 1));
        h
    }

    #[test]
    fn a_correct_history_has_no_key_violation() {
        assert_eq!(properties(&good()), Vec::<&str>::new());
        assert_eq!(properties(&with_data()), Vec::<&str>::new());
    }

    /// A layer that delivers across views, delivers twice, delivers what nobody sent or from a
    /// non-member, or lets a run take in another run's message, is caught.
    #[test]
    fn the_checker_catches_a_layer_that_mixes_views_or_runs() {
        let at = |h: &[Record], p: &str| {
            h.iter()
                .position(|r| r.p == p && matches!(r.ev, Event::SecureDeliver { .. }))
                .unwrap()
        };
        let mut across = with_data();
        let i = at(&across, "b");
        across[i] = deliver("b", "a:m1", "a", 2);
        assert_eq!(properties(&across), ["K2"]);

        let mut twice = with_data();
        let i = at(&twice, "b");
        twice.insert(i, deliver("b", "a:m1", "a", 1));
        assert_eq!(properties(&twice), ["K3"]);

        let mut unsent = with_data();
        unsent.retain(|r| !matches!(&r.ev, Event::SecureSend { msg, .. } if msg == "a:m1"));
        assert_eq!(properties(&unsent), ["K3"]);

        let mut outsider = with_data();
        let i = at(&outsider, "b");
        outsider[i] = deliver("b", "a:m1", "c", 1);
        assert_eq!(properties(&outsider), ["K2"]);

        let mut old_run = with_data();
        old_run[4] = consumed("a", 0, 1);
        assert_eq!(properties(&old_run), ["K5"]);
    }

    /// Each broken layer is caught: a key reused, a key in a view that is not the member's, a
    /// leaver keeping the key, data that does not open, a member stuck without the final key.
    #[test]
    fn the_checker_catches_each_broken_layer() {
        let mut reused = good();
        reused[8] = rec(7, "a", secure(2, &["a"], "k1"));
        assert_eq!(properties(&reused), ["K1"]);

        let mut two_keys = good();
        two_keys[5] = rec(4, "b", secure(1, &["a", "b"], "kx"));
        assert_eq!(properties(&two_keys), ["K1"]);

        let mut across = good();
        across[4] = rec(4, "a", secure(1, &["a"], "k1"));
        assert_eq!(properties(&across), ["K2"]);

        let mut leaver = good();
        leaver.insert(7, rec(6, "b", secure(2, &["a"], "k2")));
        assert!(
            properties(&leaver).contains(&"K4"),
            "{:?}",
            properties(&leaver)
        );

        let mut refused = good();
        refused.insert(
            6,
            rec(
                5,
                "a",
                Event::SecureRefused {
                    group: "g".into(),
                    sender: "b".into(),
                    error: "open_failed".into(),
                },
            ),
        );
        assert_eq!(properties(&refused), ["K3"]);

        let mut stuck = good();
        stuck.remove(8);
        assert_eq!(properties(&stuck), ["K6"]);
    }

    /// A key-graph view names who holds no key: the holders must be the view's members but
    /// those, in order; a key server in the views is no secure member (K6 passes it by).
    #[test]
    fn views_with_members_that_hold_no_key_and_key_servers() {
        let partial = |without: &[&str]| {
            let mut h = good();
            let mut ev = secure(1, &["a"], "k1");
            if let Event::SecureView { without: w, .. } = &mut ev {
                *w = without.iter().map(|m| m.to_string()).collect();
            }
            h[4] = rec(4, "a", ev);
            h.remove(5);
            h
        };
        assert!(properties(&partial(&["b"])).is_empty());
        assert_eq!(properties(&partial(&[])), ["K2"]);
        assert_eq!(properties(&partial(&["b", "z"])), ["K2"]);

        let mut served = good();
        served.insert(
            0,
            rec(
                0,
                "s",
                Event::Join {
                    group: "g".into(),
                    vs: true,
                },
            ),
        );
        served.insert(1, rec(0, "s", Event::KeyServer { group: "g".into() }));
        let n = served.len();
        served.insert(n - 1, rec(6, "s", view(2, &["a", "s"])));
        if let Event::Stable { processes } = &mut served[n].ev {
            processes.push("s".into());
        }
        assert!(properties(&served).is_empty(), "{:?}", properties(&served));
        served.remove(1);
        assert_eq!(properties(&served), ["K6"]);
    }

    /// A daemons' key is judged against the ring its view belongs to: one held with a daemon
    /// that is not in that ring (or of a ring nobody installed) is caught.
    #[test]
    fn a_daemons_key_beyond_its_ring_is_caught() {
        let ring = |p: &str| {
            rec(
                1,
                p,
                Event::View {
                    group: String::new(),
                    view: ViewId(5, "d1.0".into()),
                    members: vec!["d1".into(), "d2".into()],
                    transitional: vec![],
                },
            )
        };
        let key = |p: &str, seq: u64, members: &[&str]| {
            rec(
                2,
                p,
                Event::SecureView {
                    group: super::DAEMONS_GROUP.into(),
                    view: ViewId(seq << 32 | 1, "d1.0".into()),
                    members: members.iter().map(|m| m.to_string()).collect(),
                    key: "ks".into(),
                    without: Vec::new(),
                },
            )
        };
        let ring_key = |h: &[Record]| {
            check(h, &Config::default())
                .into_iter()
                .filter(|v| v.property == "S-ring-key")
                .count()
        };
        let good = vec![ring("d1"), ring("d2"), key("#d1", 5, &["#d1", "#d2"])];
        assert_eq!(ring_key(&good), 0);
        // A daemon whose member has not joined yet holds none.
        let early = vec![ring("d1"), ring("d2"), key("#d1", 5, &["#d1"])];
        assert_eq!(ring_key(&early), 0);
        let beyond = vec![
            ring("d1"),
            ring("d2"),
            key("#d1", 5, &["#d1", "#d2", "#d3"]),
        ];
        assert_eq!(ring_key(&beyond), 1);
        let nowhere = vec![ring("d1"), ring("d2"), key("#d1", 6, &["#d1", "#d2"])];
        assert_eq!(ring_key(&nowhere), 1);
    }

    /// Keys the daemons hand: only to a view's members, one per view, the key the members
    /// install. A key handed to a non-member, two keys for a view, one key for two views, or a
    /// secure view holding another key than the one handed, is caught.
    #[test]
    fn a_handed_group_key_beyond_its_view_is_caught() {
        let handed = |p: &str, n: u64, key: &str| {
            rec(
                3,
                p,
                Event::GroupKey {
                    group: "g".into(),
                    view: ViewId(n, "d1".into()),
                    key: key.into(),
                },
            )
        };
        // good(): views of a and b at 2 and 3, a's second view at 7.
        let with_keys = || {
            let mut h = good();
            h.insert(8, handed("a", 2, "k2"));
            h.insert(4, handed("b", 1, "k1"));
            h.insert(4, handed("a", 1, "k1"));
            h
        };
        let group_key = |h: &[Record]| {
            check(h, &Config::default())
                .into_iter()
                .filter(|v| v.property == "S-group-key")
                .count()
        };
        assert_eq!(properties(&with_keys()), Vec::<&str>::new());

        let mut outsider = with_keys();
        outsider.push(rec(9, "c", view(2, &["a"])));
        outsider.push(handed("c", 2, "k2"));
        assert_eq!(group_key(&outsider), 1);

        let mut not_given = with_keys();
        not_given.push(handed("b", 2, "k2"));
        assert_eq!(group_key(&not_given), 1);

        let mut two = with_keys();
        two[5] = handed("b", 1, "kx");
        assert_eq!(group_key(&two), 1);

        let mut reused = with_keys();
        let at = reused
            .iter()
            .position(|r| matches!(&r.ev, Event::GroupKey { key, .. } if key == "k2"))
            .unwrap();
        reused[at] = handed("a", 2, "k1");
        // k1 for two views, and a's secure view 2 holds k2, not the k1 handed.
        assert_eq!(group_key(&reused), 2);
    }
}
