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
