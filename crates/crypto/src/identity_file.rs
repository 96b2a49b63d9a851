//! An identity file: a name and its Ed25519 secret, private to its owner (TOML; `conclave keygen`
//! writes it). Members of secure groups and daemons keep their identities in such files.
//!
//! ```text
//! name = "alice"
//! ed25519_seed = "<64 hex digits>"
//! public = "ed25519:<64 hex digits>"
//! ```

use crate::{CryptoRng, Identity, PublicIdentity, StaticDh};
use zeroize::Zeroizing;

/// Why a file could not be read as an identity or a directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("not valid TOML: {0}")]
    Toml(String),
    #[error("{what}: {why}")]
    Bad { what: String, why: &'static str },
}

/// A member's identity, as its file keeps it. The seed is wiped when this is dropped.
pub struct IdentityFile {
    pub name: String,
    seed: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for IdentityFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdentityFile({:?}, <secret>)", self.name)
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityToml {
    name: String,
    ed25519_seed: String,
    #[allow(dead_code)]
    public: Option<String>,
}

impl IdentityFile {
    /// A new identity for `name`, its seed from `rng` (the system's, outside tests).
    pub fn generate(name: &str, rng: &mut dyn CryptoRng) -> IdentityFile {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(seed.as_mut());
        IdentityFile {
            name: name.to_owned(),
            seed,
        }
    }

    /// The X25519 half of the identity, for a static Diffie-Hellman key (daemon links).
    pub fn static_dh(&self) -> StaticDh {
        StaticDh::from_ed25519_seed(&self.seed)
    }

    pub fn identity(&self) -> Identity {
        Identity::ed25519_from_seed(&self.seed).expect("any 32 bytes are an Ed25519 seed")
    }

    /// The secret key as PKCS#8 v1 DER (RFC 8410), for TLS libraries. Wiped when dropped.
    pub fn pkcs8_der(&self) -> Zeroizing<Vec<u8>> {
        // SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET STRING { OCTET STRING seed } }
        let mut der = Zeroizing::new(Vec::with_capacity(48));
        der.extend_from_slice(&PKCS8_ED25519_PREFIX);
        der.extend_from_slice(self.seed.as_ref());
        der
    }

    /// The public key as a directory lists it (`ed25519:` and 64 hex digits).
    pub fn public_text(&self) -> String {
        public_text(&self.identity().public())
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        format!(
            "# Conclave identity of {name:?}: its secret key. Keep this file to its owner.\n\
             name = {name:?}\ned25519_seed = \"{seed}\"\npublic = \"{public}\"\n",
            name = self.name,
            seed = hex::encode(self.seed.as_ref()),
            public = self.public_text(),
        )
    }

    pub fn parse(text: &str) -> Result<IdentityFile, FileError> {
        // The parser's message only: its full text quotes the offending line, which may hold
        // the secret seed.
        let t: IdentityToml =
            toml::from_str(text).map_err(|e| FileError::Toml(e.message().to_owned()))?;
        let t_seed = Zeroizing::new(t.ed25519_seed);
        let bytes = Zeroizing::new(
            hex::decode(t_seed.as_bytes()).map_err(|_| bad("ed25519_seed", "not hex"))?,
        );
        let seed: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| bad("ed25519_seed", "not 32 bytes"))?;
        if t.name.is_empty() {
            return Err(bad("name", "empty"));
        }
        Ok(IdentityFile {
            name: t.name,
            seed: Zeroizing::new(seed),
        })
    }
}

pub(crate) fn bad(what: &str, why: &'static str) -> FileError {
    FileError::Bad {
        what: what.to_owned(),
        why,
    }
}

const PKCS8_ED25519_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];
const SPKI_ED25519_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// An Ed25519 public key as a SubjectPublicKeyInfo (RFC 8410): what TLS carries as a raw public
/// key (RFC 7250). `None` for a key of another scheme.
pub fn spki_der(p: &PublicIdentity) -> Option<Vec<u8>> {
    let key = p.ed25519_bytes()?;
    let mut der = SPKI_ED25519_PREFIX.to_vec();
    der.extend_from_slice(&key);
    Some(der)
}

/// A public key as a directory or a configuration lists it (`ed25519:` and 64 hex digits).
pub fn public_text(p: &PublicIdentity) -> String {
    match p.ed25519_bytes() {
        Some(b) => format!("ed25519:{}", hex::encode(b)),
        None => "rsa".into(),
    }
}

/// The public key of [`public_text`]'s text; `what` names it in the error.
pub fn parse_public_text(what: &str, text: &str) -> Result<PublicIdentity, FileError> {
    let hex_key = text
        .strip_prefix("ed25519:")
        .ok_or_else(|| bad(what, "a key is \"ed25519:\" and 64 hex digits"))?;
    let bytes: [u8; 32] = hex::decode(hex_key)
        .map_err(|_| bad(what, "the key is not hex"))?
        .try_into()
        .map_err(|_| bad(what, "the key is not 32 bytes"))?;
    PublicIdentity::ed25519_from_bytes(&bytes).map_err(|_| bad(what, "not a valid key"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    #[test]
    fn the_der_encodings_are_the_keys_tls_libraries_read() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        let f = IdentityFile::generate("d1", &mut rng);
        let pair = aws_lc_rs::signature::Ed25519KeyPair::from_pkcs8(&f.pkcs8_der()).unwrap();
        let spki = spki_der(&f.identity().public()).unwrap();
        use aws_lc_rs::signature::KeyPair;
        assert_eq!(&spki[12..], pair.public_key().as_ref());
        assert_eq!(spki.len(), 44);
    }

    #[test]
    fn identity_files_round_trip_and_bad_ones_are_clear_errors() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        let id = IdentityFile::generate("alice", &mut rng);
        let back = IdentityFile::parse(&id.to_text()).unwrap();
        assert_eq!(back.name, "alice");
        assert_eq!(back.public_text(), id.public_text());
        assert!(!format!("{id:?}").contains(&hex::encode(id.seed.as_ref())));
        let public = parse_public_text("alice", &id.public_text()).unwrap();
        assert_eq!(
            public.ed25519_bytes(),
            id.identity().public().ed25519_bytes()
        );
        assert_eq!(
            back.static_dh().ed25519_public(),
            public.ed25519_bytes().unwrap()
        );

        // A broken file does not quote the seed back.
        let broken = format!("name = \"a\"\ned25519_seed = \"{}", hex::encode([7u8; 32]));
        let e = IdentityFile::parse(&broken).unwrap_err().to_string();
        assert!(!e.contains(&hex::encode([7u8; 32])[..16]), "{e}");
        for (text, needle) in [
            ("name = \"a\"\ned25519_seed = \"zz\"\n", "not hex"),
            ("name = \"a\"\ned25519_seed = \"00\"\n", "32 bytes"),
            ("name = \"a\"\n", "missing"),
            (
                "name = \"a\"\ned25519_seed = \"00\"\nother = 1\n",
                "unknown field",
            ),
        ] {
            let e = IdentityFile::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
        for (text, needle) in [
            ("rsa:00", "ed25519:"),
            ("ed25519:zz", "not hex"),
            ("ed25519:00", "32 bytes"),
        ] {
            let e = parse_public_text("k", text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
