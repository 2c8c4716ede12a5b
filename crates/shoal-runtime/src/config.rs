//! The configuration pieces both daemons' files share, so the agent's `agent.toml` and the
//! authority's `authority.toml` read them with one type and one error each:
//!
//! * [`TlsSection`]: the `[tls]` section (region CA, node certificate, private key), paths
//!   resolved against the config file's directory ([`TlsSection::resolve`]); the authority's
//!   `[[failover.remote_regions]]` carry one each as `tls = { ... }`;
//! * public keys written as hex ([`parse_public_key`], [`parse_public_keys`]): the agent's
//!   `[trust] authority_keys`, both files' `[failover] policy_keys`;
//! * the hex codec itself ([`to_hex`], [`from_hex`]), also used for key files.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use shoal_proto::{TrustedKeys, VerifyingKey};
use shoal_transport::tls::TlsPaths;

/// `[tls]`: PEM files, relative paths meaning relative to the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The region CA certificate.
    pub ca: PathBuf,
    /// This node's certificate, issued by that CA.
    pub cert: PathBuf,
    /// Its private key (refused at start when readable by group or others).
    pub key: PathBuf,
}

impl TlsSection {
    /// Makes every relative path relative to `base` (the config file's directory).
    pub fn resolve(&mut self, base: &Path) {
        for p in [&mut self.ca, &mut self.cert, &mut self.key] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }

    /// The paths as the transport reads (and re-reads on reload) them.
    pub fn paths(&self) -> TlsPaths {
        TlsPaths {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Parses hex (either case); `None` on odd length or a non-hex digit.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Why a configured public key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not hex at all (odd length or a non-hex digit).
    #[error("{0:?} is not hex")]
    NotHex(String),
    /// Hex, but not 32 bytes.
    #[error("{0:?} must be 32 bytes (64 hex characters)")]
    Length(String),
    /// 32 bytes that are not an ed25519 public key.
    #[error("{key:?} is not an ed25519 public key: {reason}")]
    NotAKey {
        /// The key as written.
        key: String,
        /// What ed25519 said.
        reason: String,
    },
}

/// Parses one ed25519 public key written as 64 hex characters (surrounding blanks ignored).
///
/// # Errors
/// [`KeyError`] naming the key as written.
pub fn parse_public_key(s: &str) -> Result<VerifyingKey, KeyError> {
    let bytes = from_hex(s.trim()).ok_or_else(|| KeyError::NotHex(s.to_owned()))?;
    let arr: [u8; 32] = bytes
        .try_into()
        .map_err(|_| KeyError::Length(s.to_owned()))?;
    VerifyingKey::from_bytes(arr).map_err(|e| KeyError::NotAKey {
        key: s.to_owned(),
        reason: e.to_string(),
    })
}

/// Parses a list of hex public keys into a trusted set.
///
/// # Errors
/// The first key [`parse_public_key`] refuses.
pub fn parse_public_keys(keys: &[String]) -> Result<TrustedKeys, KeyError> {
    let mut out = TrustedKeys::new();
    for k in keys {
        out.insert(parse_public_key(k)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::SigningKey;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xfe, 0xff];
        assert_eq!(to_hex(&bytes), "00017f80feff");
        assert_eq!(from_hex("00017F80FEff").as_deref(), Some(&bytes[..]));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("é0"), None);
    }

    #[test]
    fn public_keys_parse_and_each_refusal_names_the_key() {
        let k = SigningKey::from_seed([7; 32]).verifying_key();
        let hex = to_hex(&k.to_bytes());
        assert_eq!(parse_public_key(&format!(" {hex}\n")), Ok(k));
        assert_eq!(
            parse_public_keys(&[hex.clone(), hex.clone()])
                .unwrap()
                .len(),
            1
        );
        assert_eq!(parse_public_key("xy"), Err(KeyError::NotHex("xy".into())));
        assert_eq!(
            parse_public_key("abcd"),
            Err(KeyError::Length("abcd".into()))
        );
        // Some 32-byte strings are not points of the curve (about half of all y coordinates).
        let not_a_point = (0u8..=255)
            .map(|b| to_hex(&[b; 32]))
            .find(|h| matches!(parse_public_key(h), Err(KeyError::NotAKey { .. })));
        assert!(not_a_point.is_some(), "every [b; 32] decoded as a point");
        assert!(parse_public_keys(&[hex, "xy".into()]).is_err());
    }

    #[test]
    fn relative_tls_paths_resolve_against_the_config_directory() {
        let mut t = TlsSection {
            ca: "ca.pem".into(),
            cert: "/abs/node.pem".into(),
            key: "keys/node-key.pem".into(),
        };
        t.resolve(Path::new("/etc/shoal"));
        assert_eq!(t.ca, PathBuf::from("/etc/shoal/ca.pem"));
        assert_eq!(t.cert, PathBuf::from("/abs/node.pem"));
        assert_eq!(t.paths().key, PathBuf::from("/etc/shoal/keys/node-key.pem"));
    }
}
