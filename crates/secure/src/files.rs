//! The files a secure member needs: its identity (the Ed25519 secret, private to its owner) and
//! the trust directory (who may take part, by public key). TOML both; `conclave keygen` writes
//! them.
//!
//! ```text
//! # identity file                          # trust directory
//! name = "alice"                           [members]
//! ed25519_seed = "<64 hex digits>"         alice = "ed25519:<64 hex digits>"
//! public = "ed25519:<64 hex digits>"       "bob#d2" = "ed25519:<64 hex digits>"
//! ```
//!
//! A directory entry under a private name (`alice`) serves that name on every daemon; one under a
//! qualified name (`bob#d2`) on that daemon only.

pub use conclave_crypto::identity_file::{parse_public_text, public_text, FileError, IdentityFile};
use conclave_crypto::PublicIdentity;
use conclave_gka::Directory;
use std::collections::BTreeMap;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DirectoryToml {
    #[serde(default)]
    members: BTreeMap<String, String>,
}

/// A trust directory file's text: one entry a member.
pub fn directory_text(entries: &[(String, PublicIdentity)]) -> String {
    let mut s = String::from(
        "# Conclave trust directory: who may take part in secure groups.\n[members]\n",
    );
    for (name, key) in entries {
        s.push_str(&format!("{name:?} = \"{}\"\n", public_text(key)));
    }
    s
}

pub fn parse_directory(text: &str) -> Result<Directory, FileError> {
    let t: DirectoryToml = toml::from_str(text).map_err(|e| FileError::Toml(e.to_string()))?;
    let mut d = Directory::new();
    for (name, key) in t.members {
        let public = parse_public_text(&name, &key)?;
        d.insert(name, public);
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    #[test]
    fn directories_round_trip_and_bad_ones_are_clear_errors() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        let id = IdentityFile::generate("alice", &mut rng);

        let dir =
            parse_directory(&directory_text(&[("alice".into(), id.identity().public())])).unwrap();
        let sig = id.identity().sign(b"m").unwrap();
        dir.get("alice#d3").unwrap().verify(b"m", &sig).unwrap();
        assert!(dir.get("bob#d1").is_none());

        for (text, needle) in [
            ("[members]\nalice = \"rsa:00\"\n", "ed25519:"),
            ("[members]\nalice = \"ed25519:00\"\n", "32 bytes"),
            ("[people]\n", "unknown field"),
        ] {
            let e = parse_directory(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
