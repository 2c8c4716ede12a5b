//! Development certificates for the agent mesh, as `consul tls` makes them.
//!
//! Every region has its own CA. A node certificate is signed by its region's CA and carries the
//! node's identity in two places:
//!
//! | field            | value                                  | used for                         |
//! |------------------|----------------------------------------|----------------------------------|
//! | SAN URI          | `shoal://<region>/node/<node-id>`      | [`NodeIdentity::from_cert`]      |
//! | SAN DNS          | `shoal.<region>` ([`server_name`])     | TLS server-name check on dial    |
//! | SAN IP / DNS     | whatever the operator passes           | humans, other tooling            |
//! | subject CN       | `<node-id>`                            | humans (`openssl x509 -text`)    |
//! | EKU              | serverAuth + clientAuth                | every node both dials and serves |
//!
//! Peers dial each other by socket address, not by host name, so the TLS server name is the fixed
//! `shoal.<region>`: a node of another region (even one signed by a shared CA) fails the name
//! check. The SAN URI is the authoritative identity; the CN is only a copy for humans.
//!
//! There are two layers: [`generate_ca`] / [`generate_node_cert`] work in memory (PEM strings);
//! [`create_ca`] / [`create_node_cert`] write files and refuse to overwrite existing ones unless
//! asked to ([`Overwrite::Replace`], `--force`). Key files are created with mode 0600 by the
//! `open` call itself, in an output directory created 0700 when missing (see [`crate::keyfile`]);
//! a replaced file is swapped in atomically (temp file + rename). Private keys are read with
//! [`read_key_file`], which refuses a key readable by group or others.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, RootCertStore};
use shoal_proto::{NodeId, Region};

pub use crate::keyfile::Overwrite;
use crate::keyfile::{self, KeyFileError};

/// URI scheme of the identity SAN.
pub const IDENTITY_SCHEME: &str = "shoal://";

/// Default lifetime of a CA certificate (5 years, as `consul tls ca create`).
pub const CA_VALIDITY: Duration = Duration::from_secs(5 * 365 * 24 * 3600);
/// Default lifetime of a node certificate (1 year, as `consul tls cert create`).
pub const NODE_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a certificate operation failed. No file is left half-written by a failed `create_*`
/// call except when the error is [`CertError::Write`] on the second of two files (the first one
/// is then named in the error of the next attempt as [`CertError::AlreadyExists`]).
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file that should exist does not.
    #[error("{}: file not found", path.display())]
    NotFound {
        /// The missing file.
        path: PathBuf,
    },
    /// A file exists but could not be read (permissions, not a file, not UTF-8...).
    #[error("{}: cannot read: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The underlying IO error.
        source: std::io::Error,
    },
    /// Refused to overwrite an existing file.
    #[error("{}: already exists, refusing to overwrite (pass --force to replace it)", path.display())]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },
    /// Writing an output file failed.
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying IO error.
        source: std::io::Error,
    },
    /// The input holds no PEM section of the expected kind (certificate or private key).
    #[error("{what}: not PEM or no {expected} in it")]
    NotPem {
        /// What was being parsed (a path or a description such as `"ca certificate"`).
        what: String,
        /// The PEM section kind that was expected.
        expected: &'static str,
    },
    /// The certificate is not signed by the given CA.
    #[error("certificate is not signed by the given CA")]
    WrongCa,
    /// The certificate's validity period has ended.
    #[error("certificate has expired")]
    Expired,
    /// The certificate's validity period has not started yet.
    #[error("certificate is not valid yet")]
    NotYetValid,
    /// The certificate belongs to another region than the one expected.
    #[error("certificate is for region {found:?}, expected {expected}")]
    WrongRegion {
        /// The region we belong to.
        expected: Region,
        /// The region named by the certificate (if it could be parsed).
        found: Option<Region>,
    },
    /// The certificate has no valid `shoal://<region>/node/<node-id>` SAN URI.
    #[error("certificate carries no shoal node identity: {0}")]
    NoIdentity(String),
    /// The certificate could not be parsed or was refused for another reason.
    #[error("invalid certificate: {0}")]
    Invalid(String),
    /// Generating a key or signing a certificate failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A private key file is too open, or a file could not be written or read.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    /// The certificate names another node than the one this process is.
    #[error("certificate is for {found}, expected {expected}")]
    WrongIdentity {
        /// The identity this process has (from its first certificate).
        expected: NodeIdentity,
        /// The identity in the new certificate.
        found: NodeIdentity,
    },
    /// The private key does not belong to the certificate.
    #[error("the private key does not match the certificate")]
    KeyMismatch,
}

/// A certificate and its private key, both PEM-encoded.
#[derive(Clone)]
pub struct CertPair {
    /// The certificate, PEM (`-----BEGIN CERTIFICATE-----`).
    pub cert_pem: String,
    /// The private key, PEM (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for CertPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPair")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Paths of a CA written by [`create_ca`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaFiles {
    /// `<region>-ca.pem`.
    pub cert: PathBuf,
    /// `<region>-ca-key.pem` (mode 0600).
    pub key: PathBuf,
}

/// Paths of a node certificate written by [`create_node_cert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCertFiles {
    /// `<region>-node-<node-id>.pem`.
    pub cert: PathBuf,
    /// `<region>-node-<node-id>-key.pem` (mode 0600).
    pub key: PathBuf,
}

/// Extra subject alternative names for a node certificate (the identity SANs are always added).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraSans {
    /// IP addresses the node is reachable at.
    pub ips: Vec<IpAddr>,
    /// DNS names of the node.
    pub dns: Vec<String>,
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

impl Validity {
    /// Valid from one hour ago (clock skew between machines) for `lifetime`.
    pub fn from_now(lifetime: Duration) -> Self {
        let now = SystemTime::now();
        Self {
            not_before: now - Duration::from_secs(3600),
            not_after: now + lifetime,
        }
    }
}

/// The identity a node certificate carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    /// The node's region.
    pub region: Region,
    /// The node's id.
    pub node_id: NodeId,
}

impl NodeIdentity {
    /// Parses the identity out of a DER certificate's `shoal://<region>/node/<node-id>` SAN URI.
    ///
    /// This does **not** verify the certificate: call it on a certificate that TLS (or
    /// [`verify_node_cert`]) has verified.
    ///
    /// # Errors
    /// [`CertError::Invalid`] if the DER does not parse; [`CertError::NoIdentity`] if there is no
    /// identity URI, more than one, or one whose region or node id is invalid.
    pub fn from_cert(der: &[u8]) -> Result<Self, CertError> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| CertError::Invalid(e.to_string()))?;
        let san = cert
            .subject_alternative_name()
            .map_err(|e| CertError::Invalid(e.to_string()))?
            .ok_or_else(|| CertError::NoIdentity("no subjectAltName extension".into()))?;
        let mut found = None;
        for name in &san.value.general_names {
            let x509_parser::extensions::GeneralName::URI(uri) = name else {
                continue;
            };
            let Some(rest) = uri.strip_prefix(IDENTITY_SCHEME) else {
                continue;
            };
            if found.is_some() {
                return Err(CertError::NoIdentity("more than one shoal:// URI".into()));
            }
            found = Some(parse_identity_path(rest)?);
        }
        found.ok_or_else(|| CertError::NoIdentity("no shoal:// URI in subjectAltName".into()))
    }

    /// The SAN URI for this identity: `shoal://<region>/node/<node-id>`.
    pub fn uri(&self) -> String {
        format!("{IDENTITY_SCHEME}{}/node/{}", self.region, self.node_id)
    }
}

impl std::fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.region, self.node_id)
    }
}

fn parse_identity_path(rest: &str) -> Result<NodeIdentity, CertError> {
    let bad = || CertError::NoIdentity(format!("malformed identity URI shoal://{rest}"));
    let (region, node) = rest.split_once("/node/").ok_or_else(bad)?;
    Ok(NodeIdentity {
        region: Region::new(region).map_err(|e| CertError::NoIdentity(e.to_string()))?,
        node_id: NodeId::new(node).map_err(|e| CertError::NoIdentity(e.to_string()))?,
    })
}

/// The fixed TLS server name of every node of `region`: `shoal.<region>`.
pub fn server_name(region: &Region) -> String {
    format!("shoal.{region}")
}

/// Generates a self-signed CA for `region`, in memory.
///
/// # Errors
/// [`CertError::Generate`] if key generation or signing fails.
pub fn generate_ca(region: &Region, validity: Validity) -> Result<CertPair, CertError> {
    let key = KeyPair::generate()?;
    let cert = ca_params(region, validity).self_signed(&key)?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn ca_params(region: &Region, validity: Validity) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("shoal {region} CA"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "shoal");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, validity);
    params
}

fn set_validity(params: &mut CertificateParams, validity: Validity) {
    params.not_before = time::OffsetDateTime::from(validity.not_before);
    params.not_after = time::OffsetDateTime::from(validity.not_after);
}

/// Generates a node certificate for `node` in `region`, signed by `ca`, in memory.
///
/// # Errors
/// [`CertError::NotPem`] if the CA certificate or key is not PEM; [`CertError::Invalid`] if a
/// DNS SAN is not a valid IA5 string; [`CertError::Generate`] if signing fails.
pub fn generate_node_cert(
    ca: &CertPair,
    node: &NodeId,
    region: &Region,
    extra: &ExtraSans,
    validity: Validity,
) -> Result<CertPair, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|_| CertError::NotPem {
        what: "CA key".into(),
        expected: "private key",
    })?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(|_| CertError::NotPem {
        what: "CA certificate".into(),
        expected: "certificate",
    })?;
    let identity = NodeIdentity {
        region: region.clone(),
        node_id: node.clone(),
    };
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, node.as_str());
    params
        .distinguished_name
        .push(DnType::OrganizationName, "shoal");
    let ia5 = |s: String| {
        s.try_into()
            .map_err(|e: rcgen::Error| CertError::Invalid(e.to_string()))
    };
    params.subject_alt_names = vec![
        SanType::URI(ia5(identity.uri())?),
        SanType::DnsName(ia5(server_name(region))?),
    ];
    for ip in &extra.ips {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    for dns in &extra.dns {
        params
            .subject_alt_names
            .push(SanType::DnsName(ia5(dns.clone())?));
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, validity);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Creates `<region>-ca.pem` and `<region>-ca-key.pem` in `out_dir`, valid for [`CA_VALIDITY`],
/// refusing to overwrite either.
///
/// # Errors
/// As [`create_ca_with`] with [`Overwrite::Refuse`].
pub fn create_ca(region: &Region, out_dir: &Path) -> Result<CaFiles, CertError> {
    create_ca_with(region, out_dir, Overwrite::Refuse)
}

/// Creates (or with [`Overwrite::Replace`] atomically replaces) `<region>-ca.pem` and
/// `<region>-ca-key.pem` in `out_dir` (created 0700 when missing). The key is written first,
/// mode 0600.
///
/// # Errors
/// [`CertError::AlreadyExists`] if either file exists and `overwrite` is
/// [`Overwrite::Refuse`] (nothing is written then); [`CertError::Write`] if writing fails;
/// [`CertError::Generate`] if generation fails.
pub fn create_ca_with(
    region: &Region,
    out_dir: &Path,
    overwrite: Overwrite,
) -> Result<CaFiles, CertError> {
    let files = CaFiles {
        cert: out_dir.join(format!("{region}-ca.pem")),
        key: out_dir.join(format!("{region}-ca-key.pem")),
    };
    prepare_out(out_dir, &[&files.cert, &files.key], overwrite)?;
    let pair = generate_ca(region, Validity::from_now(CA_VALIDITY))?;
    write_pair((&files.key, &files.cert), &pair, overwrite)?;
    Ok(files)
}

/// Creates `<region>-node-<node-id>.pem` and `<region>-node-<node-id>-key.pem` in `out_dir`,
/// signed by the CA in `ca`, valid for [`NODE_VALIDITY`], refusing to overwrite either.
///
/// # Errors
/// As [`create_node_cert_with`] with [`Overwrite::Refuse`].
pub fn create_node_cert(
    ca: &CaFiles,
    node: &NodeId,
    region: &Region,
    extra: &ExtraSans,
    out_dir: &Path,
) -> Result<NodeCertFiles, CertError> {
    create_node_cert_with(ca, node, region, extra, out_dir, Overwrite::Refuse)
}

/// As [`create_node_cert`]; with [`Overwrite::Replace`] existing files are replaced atomically,
/// the key first, then the certificate (a reload between the two renames sees a key that does
/// not match the certificate and keeps the old material, see [`crate::tls`]).
///
/// # Errors
/// [`CertError::NotFound`] / [`CertError::Unreadable`] / [`CertError::NotPem`] for the CA files;
/// [`CertError::KeyFile`] if the CA key is readable by group or others;
/// [`CertError::AlreadyExists`] if an output file exists and `overwrite` is
/// [`Overwrite::Refuse`] (nothing is written then); [`CertError::Write`] if writing fails.
pub fn create_node_cert_with(
    ca: &CaFiles,
    node: &NodeId,
    region: &Region,
    extra: &ExtraSans,
    out_dir: &Path,
    overwrite: Overwrite,
) -> Result<NodeCertFiles, CertError> {
    let ca_pair = CertPair {
        cert_pem: read_pem_file(&ca.cert)?,
        key_pem: read_key_file(&ca.key)?,
    };
    let files = NodeCertFiles {
        cert: out_dir.join(format!("{region}-node-{node}.pem")),
        key: out_dir.join(format!("{region}-node-{node}-key.pem")),
    };
    prepare_out(out_dir, &[&files.cert, &files.key], overwrite)?;
    let pair = generate_node_cert(
        &ca_pair,
        node,
        region,
        extra,
        Validity::from_now(NODE_VALIDITY),
    )?;
    write_pair((&files.key, &files.cert), &pair, overwrite)?;
    Ok(files)
}

/// Reads a PEM private key file, refusing one that group or others may read or write (as
/// OpenSSH does), with errors that name the file.
///
/// # Errors
/// [`CertError::KeyFile`] ([`KeyFileError::TooOpen`]) for a too-open file, otherwise as
/// [`read_pem_file`].
pub fn read_key_file(path: &Path) -> Result<String, CertError> {
    match keyfile::check_private(path) {
        Ok(()) => {}
        Err(KeyFileError::NotFound { path }) => return Err(CertError::NotFound { path }),
        Err(e) => return Err(e.into()),
    }
    read_pem_file(path)
}

/// Reads a PEM file into a string, with errors that name the file.
///
/// # Errors
/// [`CertError::NotFound`], [`CertError::Unreadable`], or [`CertError::NotPem`] if the file has
/// no `-----BEGIN` marker at all.
pub fn read_pem_file(path: &Path) -> Result<String, CertError> {
    let unreadable = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::NotFound {
            CertError::NotFound {
                path: path.to_owned(),
            }
        } else {
            CertError::Unreadable {
                path: path.to_owned(),
                source,
            }
        }
    };
    let bytes = keyfile::read_bounded(path, keyfile::MAX_KEY_FILE_BYTES).map_err(unreadable)?;
    let text = String::from_utf8(bytes)
        .map_err(|e| unreadable(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    if !text.contains("-----BEGIN ") {
        return Err(CertError::NotPem {
            what: path.display().to_string(),
            expected: "PEM section",
        });
    }
    Ok(text)
}

/// Checks every output before anything is written: with [`Overwrite::Refuse`] any existing
/// entry at an output path, a dangling symlink included (`O_EXCL` refuses those too), fails the
/// command before the first file is created, and before `out_dir` is created. Existence is
/// judged on the path each output will have once `out_dir` exists
/// ([`keyfile::path_once_created`]): `--out new/..` names files next to `new`, which the
/// kernel cannot see while `new` is missing.
fn prepare_out(out_dir: &Path, paths: &[&Path], overwrite: Overwrite) -> Result<(), CertError> {
    if overwrite == Overwrite::Refuse {
        if let Some(p) = paths
            .iter()
            .find(|p| std::fs::symlink_metadata(keyfile::path_once_created(p)).is_ok())
        {
            return Err(CertError::AlreadyExists {
                path: p.to_path_buf(),
            });
        }
    }
    keyfile::ensure_dir(out_dir)?;
    Ok(())
}

/// Writes a key and its certificate (in that order, see [`create_node_cert_with`]). With
/// [`Overwrite::Refuse`], when the certificate cannot be created (another process made the
/// file after [`prepare_out`] checked) the key just created is removed again, so a failed run
/// leaves nothing behind and can simply be repeated.
fn write_pair(
    files: (&Path, &Path),
    pair: &CertPair,
    overwrite: Overwrite,
) -> Result<(), CertError> {
    let (key, cert) = files;
    write_out(key, &pair.key_pem, keyfile::PRIVATE_FILE_MODE, overwrite)?;
    let written = write_out(cert, &pair.cert_pem, keyfile::PUBLIC_FILE_MODE, overwrite);
    if written.is_err() && overwrite == Overwrite::Refuse {
        let _ = std::fs::remove_file(key);
    }
    written
}

fn write_out(
    path: &Path,
    contents: &str,
    mode: u32,
    overwrite: Overwrite,
) -> Result<(), CertError> {
    keyfile::write_file(path, contents.as_bytes(), mode, overwrite).map_err(|e| match e {
        KeyFileError::Exists { path } => CertError::AlreadyExists { path },
        KeyFileError::Io { path, source } => CertError::Write { path, source },
        other => CertError::KeyFile(other),
    })
}

/// Parses every certificate in a PEM string (leaf first, as TLS wants the chain).
///
/// # Errors
/// [`CertError::NotPem`] naming `what` if there is no certificate.
pub fn parse_certs(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let not_pem = || CertError::NotPem {
        what: what.to_owned(),
        expected: "certificate",
    };
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| not_pem())?;
    if certs.is_empty() {
        return Err(not_pem());
    }
    Ok(certs)
}

/// Parses the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM string.
///
/// # Errors
/// [`CertError::NotPem`] naming `what` if there is no key.
pub fn parse_key(pem: &str, what: &str) -> Result<PrivateKeyDer<'static>, CertError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| CertError::NotPem {
        what: what.to_owned(),
        expected: "private key",
    })
}

/// Checks that `cert_pem` is a node certificate signed by `ca_pem`, currently valid, and for
/// `region`, and returns its identity. The agent calls this at start so that a wrong file is a
/// clear error at boot rather than refused handshakes later.
///
/// # Errors
/// [`CertError::NotPem`], [`CertError::WrongCa`], [`CertError::Expired`],
/// [`CertError::NotYetValid`], [`CertError::WrongRegion`], [`CertError::NoIdentity`] or
/// [`CertError::Invalid`].
pub fn verify_node_cert(
    ca_pem: &str,
    cert_pem: &str,
    region: &Region,
) -> Result<NodeIdentity, CertError> {
    let ca = parse_certs(ca_pem, "CA certificate")?;
    let chain = parse_certs(cert_pem, "node certificate")?;
    let mut roots = RootCertStore::empty();
    for c in ca {
        roots
            .add(c)
            .map_err(|e| CertError::Invalid(format!("CA certificate: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| CertError::Invalid(format!("CA certificate: {e}")))?;
    let identity = NodeIdentity::from_cert(&chain[0])?;
    if &identity.region != region {
        return Err(CertError::WrongRegion {
            expected: region.clone(),
            found: Some(identity.region),
        });
    }
    let name =
        ServerName::try_from(server_name(region)).map_err(|e| CertError::Invalid(e.to_string()))?;
    verifier
        .verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())
        .map_err(|e| map_verify_error(e, region, &identity))?;
    Ok(identity)
}

/// Maps a rustls verification error to the closest [`CertError`].
pub(crate) fn map_verify_error(
    e: rustls::Error,
    region: &Region,
    identity: &NodeIdentity,
) -> CertError {
    match e {
        rustls::Error::InvalidCertificate(ce) => match ce {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => CertError::WrongCa,
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                CertError::Expired
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                CertError::NotYetValid
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                CertError::WrongRegion {
                    expected: region.clone(),
                    found: Some(identity.region.clone()),
                }
            }
            other => CertError::Invalid(format!("{other:?}")),
        },
        other => CertError::Invalid(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(s: &str) -> Region {
        Region::new(s).unwrap()
    }

    fn node(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn a_refused_run_writes_nothing_when_any_output_exists_even_a_dangling_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        // The certificate path is a dangling symlink: `exists()` says no, O_EXCL says yes.
        std::os::unix::fs::symlink(out.join("nowhere"), out.join("dev-ca.pem")).unwrap();
        let err = create_ca_with(&region("dev"), out, Overwrite::Refuse).unwrap_err();
        assert!(
            matches!(&err, CertError::AlreadyExists { path } if path.ends_with("dev-ca.pem")),
            "{err}"
        );
        assert!(
            std::fs::symlink_metadata(out.join("dev-ca-key.pem")).is_err(),
            "the key was written although the certificate was refused"
        );
        std::fs::remove_file(out.join("dev-ca.pem")).unwrap();
        let ca = create_ca_with(&region("dev"), out, Overwrite::Refuse).unwrap();
        // The same for a node certificate.
        std::os::unix::fs::symlink(out.join("nowhere"), out.join("dev-node-n1.pem")).unwrap();
        let err = create_node_cert_with(
            &ca,
            &node("n1"),
            &region("dev"),
            &ExtraSans::default(),
            out,
            Overwrite::Refuse,
        )
        .unwrap_err();
        assert!(matches!(err, CertError::AlreadyExists { .. }), "{err}");
        assert!(std::fs::symlink_metadata(out.join("dev-node-n1-key.pem")).is_err());
    }

    #[test]
    fn node_cert_carries_identity_and_verifies() {
        let ca = generate_ca(&region("eu-west"), Validity::from_now(CA_VALIDITY)).unwrap();
        let extra = ExtraSans {
            ips: vec!["127.0.0.1".parse().unwrap()],
            dns: vec!["node-1.example".into()],
        };
        let pair = generate_node_cert(
            &ca,
            &node("node-1:a_b"),
            &region("eu-west"),
            &extra,
            Validity::from_now(NODE_VALIDITY),
        )
        .unwrap();
        let id = verify_node_cert(&ca.cert_pem, &pair.cert_pem, &region("eu-west")).unwrap();
        assert_eq!(id.region.as_str(), "eu-west");
        assert_eq!(id.node_id.as_str(), "node-1:a_b");
        let der = parse_certs(&pair.cert_pem, "t").unwrap();
        assert_eq!(NodeIdentity::from_cert(&der[0]).unwrap(), id);
        parse_key(&pair.key_pem, "t").unwrap();
    }

    #[test]
    fn wrong_ca_expired_and_wrong_region_are_named() {
        let r = region("a");
        let ca = generate_ca(&r, Validity::from_now(CA_VALIDITY)).unwrap();
        let other = generate_ca(&r, Validity::from_now(CA_VALIDITY)).unwrap();
        let ok = Validity::from_now(NODE_VALIDITY);
        let pair = generate_node_cert(&other, &node("n"), &r, &ExtraSans::default(), ok).unwrap();
        assert!(matches!(
            verify_node_cert(&ca.cert_pem, &pair.cert_pem, &r),
            Err(CertError::WrongCa)
        ));

        let now = SystemTime::now();
        let past = Validity {
            not_before: now - Duration::from_secs(7200),
            not_after: now - Duration::from_secs(3600),
        };
        let pair = generate_node_cert(&ca, &node("n"), &r, &ExtraSans::default(), past).unwrap();
        assert!(matches!(
            verify_node_cert(&ca.cert_pem, &pair.cert_pem, &r),
            Err(CertError::Expired)
        ));

        let pair =
            generate_node_cert(&ca, &node("n"), &region("b"), &ExtraSans::default(), ok).unwrap();
        let err = verify_node_cert(&ca.cert_pem, &pair.cert_pem, &r).unwrap_err();
        assert!(matches!(err, CertError::WrongRegion { .. }), "{err}");
    }

    #[test]
    fn files_are_created_once_with_private_keys() {
        let dir = std::env::temp_dir().join(format!("shoal-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let r = region("us-east");
        let ca = create_ca(&r, &dir).unwrap();
        assert!(ca.cert.ends_with("us-east-ca.pem"));
        assert!(ca.key.ends_with("us-east-ca-key.pem"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&ca.key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(matches!(
            create_ca(&r, &dir),
            Err(CertError::AlreadyExists { .. })
        ));
        let files = create_node_cert(&ca, &node("n1"), &r, &ExtraSans::default(), &dir).unwrap();
        let cert = read_pem_file(&files.cert).unwrap();
        let ca_pem = read_pem_file(&ca.cert).unwrap();
        verify_node_cert(&ca_pem, &cert, &r).unwrap();

        let missing = CaFiles {
            cert: dir.join("nope.pem"),
            key: ca.key.clone(),
        };
        let err =
            create_node_cert(&missing, &node("n2"), &r, &ExtraSans::default(), &dir).unwrap_err();
        assert!(matches!(err, CertError::NotFound { .. }));
        assert!(err.to_string().contains("nope.pem"), "{err}");
        std::fs::write(dir.join("junk.pem"), "hello").unwrap();
        assert!(matches!(
            read_pem_file(&dir.join("junk.pem")),
            Err(CertError::NotPem { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
