//! The daemon's TLS port (`tls = "host:port"` in its entry): TLS 1.3 on which the daemon proves
//! its Ed25519 identity as a raw public key (RFC 7250); clients check it against the key the
//! configuration lists. The client proves its name inside the session, over the connection's
//! channel binding, which the node is given with the connection
//! ([`conclave_node::Node::open_bound_session`]). This is the client-daemon hop of the
//! Three-Step Client-Server architecture (paper 002 §V-B): the daemon-daemon hop is the links,
//! sealed under the daemons' key.

use anyhow::Context;
use conclave_crypto::identity_file::IdentityFile;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use rustls::server::AlwaysResolvesServerRawPublicKeys;
use rustls::sign::CertifiedKey;
use std::sync::Arc;

/// The server side of the daemon's TLS port, from its identity.
pub fn server_config(identity: &IdentityFile) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    // Borrowed from the wiped buffer: no copy of the secret outlives this call.
    let pkcs8 = identity.pkcs8_der();
    let key = rustls::crypto::aws_lc_rs::sign::any_eddsa_type(&PrivatePkcs8KeyDer::from(
        pkcs8.as_slice(),
    ))
    .context("loading the daemon's identity for TLS")?;
    let spki = conclave_crypto::identity_file::spki_der(&identity.identity().public())
        .context("a daemon's identity for TLS is an Ed25519 key")?;
    let certified = Arc::new(CertifiedKey::new(vec![CertificateDer::from(spki)], key));
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(AlwaysResolvesServerRawPublicKeys::new(certified)));
    Ok(Arc::new(config))
}

/// The channel binding of an accepted TLS connection.
pub fn binding(
    s: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
) -> Result<[u8; 32], rustls::Error> {
    let mut b = [0u8; 32];
    s.get_ref().1.export_keying_material(
        &mut b,
        conclave_wire::client::TLS_EXPORTER_LABEL,
        None,
    )?;
    Ok(b)
}
