//! Counters a daemon exposes in the Prometheus text format (any HTTP GET to the metrics address).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

macro_rules! metrics {
    ($($field:ident: $kind:literal, $help:literal;)*) => {
        #[derive(Default, Debug)]
        pub struct Metrics {
            $(pub $field: AtomicU64,)*
            /// Packets refused, by peer and reason (`conclave_peer_refusals{peer, reason}`).
            pub peer_refusals: Mutex<BTreeMap<(String, &'static str), u64>>,
        }

        impl Metrics {
            /// The Prometheus exposition text.
            pub fn render(&self) -> String {
                let mut s = String::new();
                $(
                    s.push_str(concat!(
                        "# HELP conclave_", stringify!($field), " ", $help, "\n",
                        "# TYPE conclave_", stringify!($field), " ", $kind, "\n",
                        "conclave_", stringify!($field), " "
                    ));
                    s.push_str(&self.$field.load(Relaxed).to_string());
                    s.push('\n');
                )*
                s.push_str(
                    "# HELP conclave_peer_refusals Packets and datagrams refused, by peer and reason.\n\
                     # TYPE conclave_peer_refusals counter\n",
                );
                for ((peer, reason), n) in self.peer_refusals() {
                    s.push_str(&format!(
                        "conclave_peer_refusals{{peer=\"{peer}\",reason=\"{reason}\"}} {n}\n"
                    ));
                }
                s
            }

            /// Refusals by peer and reason, in order.
            pub fn peer_refusals(&self) -> BTreeMap<(String, &'static str), u64> {
                self.peer_refusals
                    .lock()
                    .map(|m| m.clone())
                    .unwrap_or_default()
            }

            /// Counts a refusal of `peer`'s input.
            pub fn peer_refused(&self, peer: &str, reason: &'static str) {
                if let Ok(mut m) = self.peer_refusals.lock() {
                    *m.entry((peer.to_owned(), reason)).or_default() += 1;
                }
            }
        }
    };
}

metrics! {
    packets_sent: "counter", "Daemon packets sent (before fault injection).";
    packets_received: "counter", "Daemon packets received and decoded.";
    packets_to_core: "counter", "Daemon packets handed to the core (taken or refused by it), past the links.";
    bytes_sent: "counter", "Bytes of datagrams sent to other daemons.";
    bytes_received: "counter", "Bytes of datagrams received from other daemons.";
    bad_datagrams: "counter", "Datagrams refused: unknown sender, refused by the link (forged, altered, replayed, stale), malformed, or undecodable.";
    fault_drops: "counter", "Datagrams dropped by fault injection.";
    link_waiting: "counter", "Datagrams not sent: the peer's link epoch was not known yet (a hello went instead).";
    link_hellos: "counter", "Link hellos sent (a daemon's epoch, to a peer that lacks it; or the daemons' new key, offered).";
    daemons_keys: "counter", "Keys the daemons agreed among themselves (one per daemon membership change, cascades aside).";
    group_keys: "counter", "Client group keys derived from the daemons' key and handed to members (integrated architecture).";
    messages_resealed: "counter", "Messages of EVS groups keyed by the daemons opened and sealed again under the delivery view's key (Optimized EVS).";
    reseals_failed: "counter", "Messages of such groups sealed under another view's key that could not be resealed (the key expired or was never held here, or the message did not open): delivered as they came.";
    links_on_daemons_key: "gauge", "Peers (this daemon among them) that datagrams go to under the daemons' current key.";
    retransmit_requests: "counter", "Messages this daemon asked the ring to retransmit.";
    views: "counter", "Daemon configurations installed.";
    group_views: "counter", "Group views delivered to this daemon's clients.";
    messages_accepted: "counter", "Client messages accepted for sending.";
    messages_delivered: "counter", "Messages delivered to this daemon's clients.";
    refusals: "counter", "Client requests refused.";
    client_proofs_refused: "counter", "Clients refused at connect: a proof of a listed name that does not verify, or a name no [[client]] lists where one must.";
    tls_handshakes_failed: "counter", "TLS connections from clients whose handshake failed or did not finish in the handshake time.";
    admin_refusals: "counter", "Admin connections refused: no proof, a name no key is known for, or a signature that does not verify.";
    metrics_refusals: "counter", "Metrics requests refused: no bearer token, or the wrong one.";
    access_refusals: "counter", "Client joins, key requests and messages the access policy refused (among the refusals).";
    spread_refused: "counter", "Spread sessions refused or closed for what they sent: a handshake refused (version, name, authentication, quota) or a malformed or hostile request.";
    spread_rejects: "counter", "Requests of Spread clients answered with a REJECT_MESS (the access policy or a limit refused them).";
    connections: "gauge", "Client connections open.";
    clients: "gauge", "Clients connected under a name.";
    unread_bytes: "gauge", "Bytes queued for clients and not yet written to them.";
    incomplete_bytes: "gauge", "Bytes of client requests not yet complete, held for all connections.";
    shared_read_bytes: "gauge", "Bytes of read buffers held because messages' payloads are views of them, all connections together.";
    delivery_views: "gauge", "Payloads of deliveries framed and not yet written that are views of the buffers they arrived in, all connections together (at most 1,024; past that they are copied).";
    groups: "gauge", "Client groups this daemon keeps state for.";
    foreign_client_names: "counter", "Joins, leaves, departures and state entries another daemon sent for a client that is not its own (its name does not end in that daemon's name): dropped.";
    sync_changes_dropped: "counter", "Group changes dropped past the limit of what a state exchange keeps (only a faulty daemon's flood reaches it).";
    closed_slow_clients: "counter", "Clients disconnected for not reading their events.";
    closed_limits: "counter", "Connections closed for holding too many bytes of incomplete requests.";
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_counter_is_rendered_with_help_and_type() {
        let m = super::Metrics::default();
        m.views.store(3, super::Relaxed);
        let text = m.render();
        assert!(text.contains("# TYPE conclave_views counter\nconclave_views 3\n"));
        assert_eq!(
            text.matches("# HELP").count(),
            text.matches("# TYPE").count()
        );
        m.peer_refused("d2", "undecodable");
        m.peer_refused("d2", "undecodable");
        assert!(m
            .render()
            .contains("conclave_peer_refusals{peer=\"d2\",reason=\"undecodable\"} 2\n"));
    }
}
