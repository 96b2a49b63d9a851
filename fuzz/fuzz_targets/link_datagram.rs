//! Datagrams between daemons with sealed links: any bytes, from a configured peer, are refused
//! without panic (nothing made without the pair's key authenticates), and a genuine datagram
//! altered anywhere is refused too, under the pair's static key or (inputs whose first byte is
//! odd) under a daemons' key both hold.
#![no_main]
use conclave_crypto::{Identity, StaticDh};
use conclave_node::link::{LinkMode, Links};
use conclave_node::Time;
use conclave_wire::link::LinkHeader;
use libfuzzer_sys::fuzz_target;

fn links(me: u32, epoch: u64) -> Links {
    let seeds = [[1u8; 32], [2u8; 32]];
    let roster: Vec<_> = seeds
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let id = Identity::ed25519_from_seed(s).unwrap();
            (format!("d{}", i + 1), Some(id.public()))
        })
        .collect();
    let dh = StaticDh::from_ed25519_seed(&seeds[(me - 1) as usize]);
    Links::new(LinkMode::Sealed, me, epoch, Some(&dh), &roster).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let _ = LinkHeader::decode(data);
    let now = Time::ZERO;
    let (mut a, mut b) = (links(1, 10 << 32), links(2, 20 << 32));
    // Anything from d2's address is refused.
    assert!(a.open(now, 2, &mut data.to_vec()).is_err());
    // Introduce the two, then alter a genuine datagram with the input.
    assert!(b.seal(now, 1, vec![0]).is_none());
    for _ in 0..3 {
        while let Some((_, mut d)) = b.poll_hello() {
            let _ = a.open(now, 2, &mut d);
        }
        while let Some((_, mut d)) = a.poll_hello() {
            let _ = b.open(now, 1, &mut d);
        }
    }
    if data.first().is_some_and(|x| x & 1 == 1) {
        let secret = || zeroize::Zeroizing::new([7u8; 32]);
        a.install_ring_key(now, 5, secret(), vec![1, 2]);
        b.install_ring_key(now, 5, secret(), vec![1, 2]);
        while let Some((_, mut d)) = b.poll_hello() {
            let _ = a.open(now, 2, &mut d);
        }
        while let Some((_, mut d)) = a.poll_hello() {
            let _ = b.open(now, 1, &mut d);
        }
        assert_eq!(b.send_key(1), 5);
    }
    let genuine = b
        .seal(now, 1, b"a token and its messages".to_vec())
        .unwrap();
    let mut altered = genuine.clone();
    for (i, x) in data.iter().enumerate() {
        let at = i % altered.len();
        altered[at] ^= x;
    }
    if altered != genuine {
        assert!(a.open(now, 2, &mut altered).is_err());
    }
    assert!(a.open(now, 2, &mut genuine.clone()).is_ok());
});
