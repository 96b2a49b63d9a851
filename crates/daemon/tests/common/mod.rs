//! A daemon of its own for each test, on free ports.

use conclave_client::Address;
use conclave_daemon::{AdminRequest, Config, Options, Running};
use std::time::Duration;

/// One daemon with `tweak` applied to its configuration, started and ready for clients.
pub async fn one_daemon(tweak: impl FnOnce(&mut Config)) -> (Running, Address, Config) {
    let (mut cfg, ids) = Config::local_on_free_ports(1)
        .unwrap()
        .with_identities(&mut rand_core::OsRng);
    tweak(&mut cfg);
    let opts = Options {
        identity: ids.get("d1"),
        ..Options::default()
    };
    let d = conclave_daemon::start(cfg.clone(), "d1", opts)
        .await
        .unwrap();
    for _ in 0..500 {
        if d.admin(AdminRequest::Status).await.status.unwrap().ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let addr = Address::Tcp(cfg.daemon[0].client.unwrap().to_string());
    (d, addr, cfg)
}

/// Multicasts 10 KB messages to `group` (up to 20,000) until the daemon has closed a client
/// that does not read, which it must have done by then.
#[allow(dead_code)] // not every test file uses it
pub async fn talk_until_a_slow_client_is_closed(
    c: &mut conclave_client::Client,
    d: &Running,
    group: &str,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let payload = vec![7u8; 10_000];
    for _ in 0..20_000 {
        c.multicast(conclave_client::ServiceType::Agreed, &[group], &payload)
            .await
            .unwrap();
        if d.metrics.closed_slow_clients.load(Relaxed) > 0 {
            break;
        }
    }
    assert!(d.metrics.closed_slow_clients.load(Relaxed) > 0);
}
