//! A daemon with two clients in a group, fed any sequence of packets from any daemon, client
//! commands and timer firings, never panics: hostile packets are typed errors, bad commands
//! are refused.
#![no_main]
use conclave_gcs::{ClientCommand, Daemon, DaemonConfig, GroupViewId};
use conclave_wire::gcs::{RingId, ServiceType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut d = Daemon::new(DaemonConfig::default(), 2, 0, conclave_gcs::Time::ZERO);
    let _ = d.connect(1, "a");
    let _ = d.connect(2, "b");
    let _ = d.handle_client(
        conclave_gcs::Time::ZERO,
        1,
        ClientCommand::Join {
            group: "g".into(),
            vs: true,
        },
    );
    let mut rest = data;
    let mut now = conclave_gcs::Time::ZERO;
    while let Some((&head, tail)) = rest.split_first() {
        now += std::time::Duration::from_micros(5_000);
        rest = tail;
        match head >> 6 {
            // A packet from daemon 1 or 3.
            0 | 1 => {
                let len = (head as usize & 0x3f).min(rest.len());
                let (chunk, tail) = rest.split_at(len);
                rest = tail;
                let from = if head >> 6 == 0 { 1 } else { 3 };
                let _ = d.handle_packet(
                    now,
                    from,
                    &conclave_wire::client::Bytes::copy_from_slice(chunk),
                );
            }
            // A client command.
            2 => {
                let who = if head & 1 == 0 { 1 } else { 2 };
                let group = if head & 2 == 0 { "g" } else { "h" };
                let cmd = match (head >> 2) & 3 {
                    0 => ClientCommand::Join {
                        group: group.into(),
                        vs: head & 16 != 0,
                    },
                    1 => ClientCommand::Leave {
                        group: group.into(),
                    },
                    2 => ClientCommand::Multicast {
                        service: ServiceType::Agreed,
                        groups: vec![group.into()],
                        payload: vec![head].into(),
                    },
                    _ => ClientCommand::FlushAck {
                        group: group.into(),
                        view: GroupViewId {
                            ring: RingId {
                                seq: head as u64,
                                rep: 1,
                                inc: 0,
                            },
                            index: 0,
                        },
                    },
                };
                let _ = d.handle_client(now, who, cmd);
            }
            _ => {
                if head & 1 == 0 {
                    d.handle_timeout(now);
                } else {
                    let _ = d.disconnect(now, 2);
                    let _ = d.connect(2, "b");
                }
            }
        }
        while d.poll_transmit().is_some() {}
        while d.poll_event().is_some() {}
    }
});
