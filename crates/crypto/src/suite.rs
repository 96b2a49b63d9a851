//! Cipher suites: which group and which signature scheme a run uses.

use crate::sign::SigScheme;

/// `Modern` is the default. `Paper` reproduces the 2002 experiments (1024-bit MODP with a 160-bit
/// subgroup, RSA signatures) for measurement only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Suite {
    Modern,
    Paper,
}

impl Suite {
    pub fn sig_scheme(self) -> SigScheme {
        match self {
            Suite::Modern => SigScheme::Ed25519,
            Suite::Paper => SigScheme::Rsa2048,
        }
    }
    pub fn group_name(self) -> &'static str {
        match self {
            Suite::Modern => "ristretto255",
            Suite::Paper => "modp1024-160",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Suite::Modern => "modern",
            Suite::Paper => "paper",
        }
    }
}

impl core::str::FromStr for Suite {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "modern" => Ok(Suite::Modern),
            "paper" => Ok(Suite::Paper),
            other => Err(format!(
                "unknown suite {other:?} (expected modern or paper)"
            )),
        }
    }
}
