//! Identifiers: validated names, instance and node ids, and the counters that order records.
//!
//! Every string identifier is validated on construction *and* on deserialisation
//! (`#[serde(try_from = "String")]`), so a decoded message can never carry an identifier that
//! the constructor would refuse. Limits are chosen so that a record with four labels stays
//! under 256 bytes on the wire (see `benches/` in `shoal-catalog`).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Why a string was refused as an identifier. Nothing is constructed on error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The string is empty or longer than the limit for this kind of identifier.
    #[error("{kind} must be 1..={max} bytes long, got {len}")]
    Length {
        /// Which identifier kind was being built, e.g. `"service name"`.
        kind: &'static str,
        /// The maximum length in bytes.
        max: usize,
        /// The length that was offered.
        len: usize,
    },
    /// The string contains a byte outside the allowed charset, or starts/ends with `-`.
    #[error("{kind} {value:?} has an invalid character (allowed: {allowed})")]
    Charset {
        /// Which identifier kind was being built.
        kind: &'static str,
        /// The offending value (already length-checked, so at most 128 bytes).
        value: String,
        /// Human-readable description of the allowed charset.
        allowed: &'static str,
    },
    /// A service key string was not of the form `namespace/service/port`.
    #[error("service key {0:?} must be namespace/service/port")]
    KeyShape(String),
}

/// Maximum length of a DNS-label-like name (namespace, service, port name, region, zone).
pub const MAX_NAME_BYTES: usize = 63;
/// Maximum length of an instance id.
pub const MAX_INSTANCE_ID_BYTES: usize = 128;
/// Maximum length of a node id.
pub const MAX_NODE_ID_BYTES: usize = 64;
/// Maximum length of a version string.
pub const MAX_VERSION_BYTES: usize = 64;

fn check_len(kind: &'static str, s: &str, max: usize) -> Result<(), IdError> {
    if s.is_empty() || s.len() > max {
        return Err(IdError::Length {
            kind,
            max,
            len: s.len(),
        });
    }
    Ok(())
}

/// RFC 1123 label rules, lowercase only: `[a-z0-9-]`, not starting or ending with `-`.
fn check_label(kind: &'static str, s: &str) -> Result<(), IdError> {
    check_len(kind, s, MAX_NAME_BYTES)?;
    let ok_chars = s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok_chars || s.starts_with('-') || s.ends_with('-') {
        return Err(IdError::Charset {
            kind,
            value: s.to_owned(),
            allowed: "lowercase a-z, 0-9 and '-', not at either end",
        });
    }
    Ok(())
}

/// `[A-Za-z0-9._:-]`: what Kubernetes pod names, UUIDs and host names need.
fn check_token(kind: &'static str, s: &str, max: usize) -> Result<(), IdError> {
    check_len(kind, s, max)?;
    let ok = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if !ok {
        return Err(IdError::Charset {
            kind,
            value: s.to_owned(),
            allowed: "A-Z, a-z, 0-9, '.', '_', ':' and '-'",
        });
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident, $kind:literal, $check:expr) => {
        $(#[$meta])*
        ///
        /// Cheap to clone: the validated string is shared (`Arc<str>`), so the many maps and
        /// indexes that key by it (and thousands of simulated agents) share one copy.
        #[derive(Clone, PartialEq, Eq, Hash)]
        pub struct $name(Arc<str>);

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $name {
            /// By the string. Two handles to one shared string are equal without reading it
            /// (catalog maps compare keys cloned from the same record most of the time).
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                if Arc::ptr_eq(&self.0, &other.0) {
                    return std::cmp::Ordering::Equal;
                }
                self.0.cmp(&other.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // Visits a borrowed &str where the format allows (postcard does), so decoding an
                // id costs one allocation, not two.
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($kind)
                    }
                    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<$name, E> {
                        let check: fn(&str) -> Result<(), IdError> = $check;
                        check(s).map_err(E::custom)?;
                        Ok($name(Arc::from(s)))
                    }
                }
                d.deserialize_str(V)
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl $name {
            /// Validates and wraps `s`.
            ///
            /// # Errors
            /// [`IdError`] if the length or charset is not allowed.
            pub fn new(s: impl Into<String>) -> Result<Self, IdError> {
                let s = s.into();
                let check: fn(&str) -> Result<(), IdError> = $check;
                check(&s)?;
                Ok(Self(Arc::from(s)))
            }

            /// The validated string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0.to_string()
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", $kind, self.0)
            }
        }
    };
}

string_id!(
    /// A DNS-label-like name: 1..=63 bytes of `[a-z0-9-]`, not starting or ending with `-`.
    /// Used for namespaces, service names and port names.
    Name,
    "Name",
    |s| check_label("name", s)
);
string_id!(
    /// A region name, e.g. `eu-west`. Same rules as [`Name`].
    Region,
    "Region",
    |s| check_label("region", s)
);
string_id!(
    /// A zone name inside a region, e.g. `eu-west-a`. Same rules as [`Name`].
    Zone,
    "Zone",
    |s| check_label("zone", s)
);
string_id!(
    /// Stable id of one service instance (a pod, a VM process): 1..=128 bytes of
    /// `[A-Za-z0-9._:-]`. Stable across restarts; restarts are told apart by [`Generation`].
    InstanceId,
    "InstanceId",
    |s| check_token("instance id", s, MAX_INSTANCE_ID_BYTES)
);
string_id!(
    /// Id of a node (one machine, one agent): 1..=64 bytes of `[A-Za-z0-9._:-]`.
    NodeId,
    "NodeId",
    |s| check_token("node id", s, MAX_NODE_ID_BYTES)
);
string_id!(
    /// Software version of an instance, e.g. `1.4.2+build7`: 1..=64 bytes of
    /// `[A-Za-z0-9._:-]` plus `+`.
    Version,
    "Version",
    |s| {
        check_len("version", s, MAX_VERSION_BYTES)?;
        if s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-' | b'+'))
        {
            Ok(())
        } else {
            Err(IdError::Charset {
                kind: "version",
                value: s.to_owned(),
                allowed: "A-Z, a-z, 0-9, '.', '_', ':', '-' and '+'",
            })
        }
    }
);

/// The catalog key of a service port: `namespace/service/port_name`.
///
/// Environments (namespaces) and protocols (port names) never collide: `prod/api/http` and
/// `staging/api/http` and `prod/api/grpc` are three different keys.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceKey {
    /// Environment or tenant, e.g. `prod`.
    pub namespace: Name,
    /// Logical service name, e.g. `payments`.
    pub service: Name,
    /// Named port, e.g. `http` or `grpc`.
    pub port_name: Name,
}

impl ServiceKey {
    /// Builds a key from three strings, validating each as a [`Name`].
    ///
    /// # Errors
    /// [`IdError`] naming the first part that is invalid.
    pub fn new(namespace: &str, service: &str, port_name: &str) -> Result<Self, IdError> {
        Ok(Self {
            namespace: Name::new(namespace)?,
            service: Name::new(service)?,
            port_name: Name::new(port_name)?,
        })
    }
}

impl std::str::FromStr for ServiceKey {
    type Err = IdError;
    /// Parses `namespace/service/port`.
    fn from_str(s: &str) -> Result<Self, IdError> {
        let mut parts = s.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(ns), Some(svc), Some(port), None) => Self::new(ns, svc, port),
            _ => Err(IdError::KeyShape(s.chars().take(200).collect())),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.service, self.port_name)
    }
}

impl fmt::Debug for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceKey({self})")
    }
}

macro_rules! counter {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        pub struct $name(pub u64);

        impl $name {
            /// The value after this one (saturating at `u64::MAX`).
            pub fn next(self) -> Self {
                Self(self.0.saturating_add(1))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

counter!(
    /// Boot generation of an instance (or of an agent): assigned by the region authority,
    /// monotonic per instance id (e.g. the Raft log index of the admission), never from a clock.
    /// A higher generation supersedes every record of lower generations.
    Generation
);
counter!(
    /// Region revision: the authority's monotonic, gap-free counter of accepted transitions.
    /// Revision `n` exists for every `1 <= n <= head`; agents use that to detect gaps.
    Revision
);
counter!(
    /// Per-owner-agent sequence of signed health records, gap-free within one agent boot.
    HealthSeq
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_order_by_string_whether_shared_or_not() {
        use std::cmp::Ordering::{Equal, Greater, Less};
        let a = Name::new("api").unwrap();
        assert_eq!(a.cmp(&a.clone()), Equal);
        assert_eq!(a.cmp(&Name::new("api").unwrap()), Equal);
        assert_eq!(a.cmp(&Name::new("apis").unwrap()), Less);
        assert_eq!(Name::new("b").unwrap().cmp(&a), Greater);
        let k: ServiceKey = "prod/api/http".parse().unwrap();
        let other: ServiceKey = "prod/api/grpc".parse().unwrap();
        assert_eq!(k.cmp(&k.clone()), Equal);
        assert_eq!(k.cmp(&other), Greater);
    }

    #[test]
    fn service_key_parses_and_prints() {
        let k: ServiceKey = "prod/payments/http".parse().unwrap();
        assert_eq!(k.to_string(), "prod/payments/http");
        assert_eq!(k.namespace.as_str(), "prod");
    }

    #[test]
    fn bad_names_are_refused() {
        assert!(matches!(Name::new(""), Err(IdError::Length { .. })));
        assert!(matches!(
            Name::new("a".repeat(64)),
            Err(IdError::Length { .. })
        ));
        assert!(matches!(Name::new("Prod"), Err(IdError::Charset { .. })));
        assert!(matches!(Name::new("-x"), Err(IdError::Charset { .. })));
        assert!(matches!(Name::new("x-"), Err(IdError::Charset { .. })));
        assert!(matches!(Name::new("a/b"), Err(IdError::Charset { .. })));
        assert!(Name::new("a-1").is_ok());
        assert!(matches!(
            "a/b".parse::<ServiceKey>(),
            Err(IdError::KeyShape(_))
        ));
        assert!(matches!(
            "a/b/c/d".parse::<ServiceKey>(),
            Err(IdError::KeyShape(_))
        ));
        assert!(InstanceId::new("pod-7f9c:8080_a.b").is_ok());
        assert!(InstanceId::new("pod 1").is_err());
        assert!(Version::new("1.2.3+g7").is_ok());
    }

    #[test]
    fn deserialising_an_invalid_name_fails() {
        let bytes = postcard::to_allocvec(&"UPPER".to_string()).unwrap();
        assert!(postcard::from_bytes::<Name>(&bytes).is_err());
        let ok = postcard::to_allocvec(&"lower".to_string()).unwrap();
        assert_eq!(postcard::from_bytes::<Name>(&ok).unwrap().as_str(), "lower");
    }
}
