//! TLS to a daemon (`tls:host:port`): TLS 1.3 on which the daemon authenticates by its Ed25519
//! identity as a raw public key (RFC 7250), checked against the key the client was given for
//! it. There is no certificate authority and no host name to check: the daemon's key is the
//! daemon. The client authenticates inside the session, by its name's proof signed over the
//! connection's channel binding ([`conclave_wire::client::proof_message`]).

use crate::ClientError;
use conclave_crypto::PublicIdentity;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls13_signature_with_raw_key, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, SubjectPublicKeyInfoDer, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;

/// Accepts exactly one daemon's key.
#[derive(Debug)]
struct DaemonKey {
    spki: Vec<u8>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for DaemonKey {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.spki.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("only TLS 1.3 is offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(cert.as_ref()),
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

/// The TLS configuration of a client that trusts the daemon with key `daemon` and no other.
pub fn client_config(daemon: &PublicIdentity) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    let spki = conclave_crypto::identity_file::spki_der(daemon)
        .ok_or_else(|| ClientError::Invalid("a daemon's key for TLS is an Ed25519 key".into()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = DaemonKey {
        spki,
        provider: provider.clone(),
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ClientError::Invalid(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The stream of a TLS session with a daemon, and its channel binding.
pub(crate) async fn connect(
    addr: &str,
    daemon: &PublicIdentity,
) -> Result<
    (
        tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
        [u8; 32],
    ),
    ClientError,
> {
    let config = client_config(daemon)?;
    let s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    // Raw public keys name no host: the name is sent (SNI) and not checked.
    let name = ServerName::try_from("conclave-daemon").expect("a valid DNS name");
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, s)
        .await
        .map_err(|e| ClientError::Io(format!("TLS with {addr}: {e}")))?;
    let mut binding = [0u8; 32];
    tls.get_ref()
        .1
        .export_keying_material(
            &mut binding,
            conclave_wire::client::TLS_EXPORTER_LABEL,
            None,
        )
        .map_err(|e| ClientError::Io(format!("TLS with {addr}: {e}")))?;
    Ok((tls, binding))
}
