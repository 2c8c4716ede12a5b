//! The TLS material a transport presents and trusts, swappable while the transport runs.
//!
//! A [`TlsState`] holds the current *material*: this node's certificate chain and key (as a
//! rustls `CertifiedKey`) and the verifiers built from the CA bundle. The rustls configs of
//! every [`Transport`](crate::transport::Transport) sharing the state do not hold the material
//! themselves; they hold resolvers and verifiers (`ResolvesServerCert`, `ResolvesClientCert`,
//! `ServerCertVerifier`, `ClientCertVerifier`) that read the current material at each handshake.
//! [`TlsState::reload`] builds new material, checks it, and swaps it in with one pointer store:
//!
//! - handshakes that start afterwards present the new certificate and verify peers against the
//!   new CA bundle;
//! - connections already established are not touched (TLS authenticated them once, at their
//!   handshake) and keep running until they close for their own reasons;
//! - material that fails any check is refused, counted, and the old material stays in use.
//!
//! The checks of a reload are those of the first load, plus one: the certificate must chain to
//! the new CA bundle, be valid now, be for this region ([`crate::certs::verify_node_cert`]),
//! the private key must be the certificate's, and the identity (region and node id) must be the
//! one the process started with (a node does not change its name by SIGHUP).

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use shoal_proto::Region;

use crate::certs::{self, CertError, NodeIdentity};

/// PEM strings of a CA bundle, a certificate chain (leaf first) and its private key.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The CA bundle: every certificate in it is a trusted root.
    pub ca_pem: String,
    /// This node's certificate, then any intermediates.
    pub cert_pem: String,
    /// This node's private key.
    pub key_pem: String,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Where the material lives on disk (what a reload reads again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// CA bundle PEM.
    pub ca: PathBuf,
    /// Certificate PEM.
    pub cert: PathBuf,
    /// Private key PEM (refused when readable by group or others).
    pub key: PathBuf,
}

impl TlsPaths {
    /// Reads the three files.
    ///
    /// # Errors
    /// [`CertError`] naming the file that is missing, unreadable, not PEM, or (the key) too
    /// open.
    pub fn load(&self) -> Result<TlsMaterial, CertError> {
        Ok(TlsMaterial {
            ca_pem: certs::read_pem_file(&self.ca)?,
            cert_pem: certs::read_pem_file(&self.cert)?,
            key_pem: certs::read_key_file(&self.key)?,
        })
    }
}

/// What the current certificate is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The identity it carries.
    pub identity: NodeIdentity,
    /// Its serial number, lower-case hex.
    pub serial: String,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

impl CertInfo {
    /// Parses a DER certificate.
    ///
    /// # Errors
    /// [`CertError::Invalid`] / [`CertError::NoIdentity`].
    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        let identity = NodeIdentity::from_cert(der)?;
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| CertError::Invalid(e.to_string()))?;
        let serial = cert
            .tbs_certificate
            .raw_serial()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let at = |t: x509_parser::time::ASN1Time| {
            let secs = t.timestamp();
            if secs >= 0 {
                UNIX_EPOCH + Duration::from_secs(secs as u64)
            } else {
                UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
            }
        };
        let validity = cert.validity();
        Ok(Self {
            identity,
            serial,
            not_before: at(validity.not_before),
            not_after: at(validity.not_after),
        })
    }

    /// Seconds from `now` until `not_after` (negative once expired).
    pub fn seconds_to_expiry(&self, now: SystemTime) -> f64 {
        match self.not_after.duration_since(now) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        }
    }
}

/// Reload outcomes so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReloadCounts {
    /// Reloads that swapped new material in.
    pub ok: u64,
    /// Reloads refused (the old material stayed in use).
    pub failed: u64,
}

struct Current {
    certified: Arc<CertifiedKey>,
    /// Verifies the servers we dial.
    server_verifier: Arc<WebPkiServerVerifier>,
    /// Verifies the clients that dial us.
    client_verifier: Arc<dyn ClientCertVerifier>,
    info: CertInfo,
}

struct Inner {
    region: Region,
    identity: NodeIdentity,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<Current>>,
    ok: AtomicU64,
    failed: AtomicU64,
    /// Secret of the QUIC stateless-reset key, derived from the node key this state was built
    /// with (see [`TlsState::reset_secret`]).
    reset_secret: [u8; 32],
}

/// Swappable TLS material shared by the transports of one process. Cloning shares it.
#[derive(Clone)]
pub struct TlsState {
    inner: Arc<Inner>,
}

impl fmt::Debug for TlsState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsState")
            .field("identity", &self.inner.identity)
            .field("serial", &self.info().serial)
            .finish_non_exhaustive()
    }
}

impl TlsState {
    /// Checks `material` (as [`certs::verify_node_cert`], plus key/certificate match) and
    /// makes it the current material. The certificate's identity becomes this state's identity
    /// for good.
    ///
    /// # Errors
    /// Any [`CertError`] of the checks.
    pub fn new(region: &Region, material: &TlsMaterial) -> Result<Self, CertError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let current = build(region, &provider, material)?;
        let reset_secret = reset_secret(&material.key_pem)?;
        Ok(Self {
            inner: Arc::new(Inner {
                region: region.clone(),
                identity: current.info.identity.clone(),
                provider,
                current: RwLock::new(Arc::new(current)),
                ok: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                reset_secret,
            }),
        })
    }

    /// The secret the QUIC endpoint keys its stateless resets with: SHA-256 over a label and
    /// the node's private key (DER), so every process of this node, across restarts, computes
    /// the same reset tokens. A restarted agent (kill -9, same address) then answers a peer's
    /// packet on the connection its previous process left open with a stateless reset (RFC
    /// 9000 section 10.3) that the peer accepts, and the peer closes that connection at once
    /// instead of sending into it until its idle timeout. Fixed for the life of the state: a
    /// key reloaded with SIGHUP changes it at the next start only. Never leaves the process.
    pub(crate) fn reset_secret(&self) -> [u8; 32] {
        self.inner.reset_secret
    }

    /// Reads the files and calls [`TlsState::new`].
    ///
    /// # Errors
    /// As [`TlsPaths::load`] and [`TlsState::new`].
    pub fn from_files(region: &Region, paths: &TlsPaths) -> Result<Self, CertError> {
        Self::new(region, &paths.load()?)
    }

    /// The region every certificate must be for.
    pub fn region(&self) -> &Region {
        &self.inner.region
    }

    /// The identity every certificate must carry (the first one's).
    pub fn identity(&self) -> &NodeIdentity {
        &self.inner.identity
    }

    /// The current certificate.
    pub fn info(&self) -> CertInfo {
        self.current().info.clone()
    }

    /// Reload outcomes so far.
    pub fn reload_counts(&self) -> ReloadCounts {
        ReloadCounts {
            ok: self.inner.ok.load(Ordering::Relaxed),
            failed: self.inner.failed.load(Ordering::Relaxed),
        }
    }

    /// Replaces the material for every handshake from now on. Connections already open keep
    /// going. On error nothing changes (the old material stays) and the failure is counted.
    ///
    /// # Errors
    /// Any [`CertError`] of the checks, or [`CertError::WrongIdentity`] when the certificate
    /// names another node.
    pub fn reload(&self, material: &TlsMaterial) -> Result<CertInfo, CertError> {
        let built = build(&self.inner.region, &self.inner.provider, material).and_then(|c| {
            if c.info.identity != self.inner.identity {
                return Err(CertError::WrongIdentity {
                    expected: self.inner.identity.clone(),
                    found: c.info.identity,
                });
            }
            Ok(c)
        });
        match built {
            Ok(c) => {
                let info = c.info.clone();
                *self.inner.current.write().expect("tls lock") = Arc::new(c);
                self.inner.ok.fetch_add(1, Ordering::Relaxed);
                Ok(info)
            }
            Err(e) => {
                self.inner.failed.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Reads the files again and [`reload`](TlsState::reload)s them. A file that cannot be read
    /// counts as a failed reload too.
    ///
    /// # Errors
    /// As [`TlsPaths::load`] and [`TlsState::reload`].
    pub fn reload_files(&self, paths: &TlsPaths) -> Result<CertInfo, CertError> {
        match paths.load() {
            Ok(m) => self.reload(&m),
            Err(e) => {
                self.inner.failed.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn current(&self) -> Arc<Current> {
        self.inner.current.read().expect("tls lock").clone()
    }

    pub(crate) fn provider(&self) -> Arc<CryptoProvider> {
        self.inner.provider.clone()
    }

    pub(crate) fn dynamic(&self) -> Arc<Dynamic> {
        Arc::new(Dynamic(self.clone()))
    }
}

/// See [`TlsState::reset_secret`].
fn reset_secret(key_pem: &str) -> Result<[u8; 32], CertError> {
    let key = certs::parse_key(key_pem, "node key")?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"shoal quic stateless reset v1\0");
    ctx.update(key.secret_der());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    Ok(out)
}

fn build(
    region: &Region,
    provider: &Arc<CryptoProvider>,
    m: &TlsMaterial,
) -> Result<Current, CertError> {
    certs::verify_node_cert(&m.ca_pem, &m.cert_pem, region)?;
    let chain = certs::parse_certs(&m.cert_pem, "node certificate")?;
    let key = certs::parse_key(&m.key_pem, "node key")?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| CertError::Invalid(format!("node key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(CertError::KeyMismatch)
        }
        Err(e) => return Err(CertError::Invalid(format!("node key: {e}"))),
    }
    let info = CertInfo::from_der(
        certified
            .end_entity_cert()
            .map_err(|e| CertError::Invalid(format!("node certificate: {e}")))?,
    )?;
    let mut roots = RootCertStore::empty();
    for ca in certs::parse_certs(&m.ca_pem, "CA certificate")? {
        roots
            .add(ca)
            .map_err(|e| CertError::Invalid(format!("CA certificate: {e}")))?;
    }
    let roots = Arc::new(roots);
    let server_verifier =
        WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| CertError::Invalid(format!("CA certificate: {e}")))?;
    let client_verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| CertError::Invalid(format!("CA certificate: {e}")))?;
    Ok(Current {
        certified: Arc::new(certified),
        server_verifier,
        client_verifier,
        info,
    })
}

/// The resolvers and verifiers handed to rustls: each call reads the current material.
pub(crate) struct Dynamic(TlsState);

impl fmt::Debug for Dynamic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl ResolvesServerCert for Dynamic {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified.clone())
    }
}

impl ResolvesClientCert for Dynamic {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ServerCertVerifier for Dynamic {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0.current().server_verifier.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current()
            .server_verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current()
            .server_verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0
            .inner
            .provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl ClientCertVerifier for Dynamic {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: every node has exactly one certificate to present, so the client needs none,
    /// and the hints of a swappable CA bundle could not be borrowed from `self` anyway.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .current()
            .client_verifier
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current()
            .client_verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .current()
            .client_verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0
            .inner
            .provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Records a TLS material event in the process's metrics recorder, the same names on agents
/// and authority replicas: `shoal_tls_cert_expiry_seconds` (gauge, seconds to the current
/// certificate's notAfter) and `shoal_tls_reloads_total{result="ok"|"error"}`. Pass it to
/// [`spawn_reloader`].
pub fn record_metrics(event: TlsEvent<'_>) {
    let now = std::time::SystemTime::now();
    match event {
        TlsEvent::Current(info) => {
            metrics::gauge!("shoal_tls_cert_expiry_seconds").set(info.seconds_to_expiry(now));
            metrics::counter!("shoal_tls_reloads_total", "result" => "ok").increment(0);
            metrics::counter!("shoal_tls_reloads_total", "result" => "error").increment(0);
        }
        TlsEvent::Reloaded(info) => {
            metrics::gauge!("shoal_tls_cert_expiry_seconds").set(info.seconds_to_expiry(now));
            metrics::counter!("shoal_tls_reloads_total", "result" => "ok").increment(1);
        }
        TlsEvent::Refused(_) => {
            metrics::counter!("shoal_tls_reloads_total", "result" => "error").increment(1);
        }
    }
}

/// What [`spawn_reloader`] reports.
#[derive(Debug)]
pub enum TlsEvent<'a> {
    /// The material in use, at start and then periodically (for an expiry gauge).
    Current(&'a CertInfo),
    /// A reload swapped new material in.
    Reloaded(&'a CertInfo),
    /// A reload was refused; the material in use is unchanged.
    Refused(&'a CertError),
}

/// Spawns the task that reloads `tls` from `paths` on every SIGHUP, logging the outcome
/// (`info` on success, `error` on refusal) and handing it to `report` (metrics). `report` also
/// gets [`TlsEvent::Current`] once at start and every `tick`.
///
/// # Errors
/// The SIGHUP handler cannot be installed.
///
/// # Panics
/// If called outside a tokio runtime.
pub fn spawn_reloader(
    tls: TlsState,
    paths: TlsPaths,
    tick: Duration,
    report: impl Fn(TlsEvent<'_>) + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                r = hup.recv() => {
                    if r.is_none() {
                        return;
                    }
                    match tls.reload_files(&paths) {
                        Ok(info) => {
                            tracing::info!(
                                identity = %info.identity,
                                serial = %info.serial,
                                expires_in_s = info.seconds_to_expiry(SystemTime::now()) as i64,
                                cert = %paths.cert.display(),
                                "SIGHUP: TLS certificate, key and CA bundle reloaded; new connections use them"
                            );
                            report(TlsEvent::Reloaded(&info));
                        }
                        Err(e) => {
                            tracing::error!(
                                error = %e,
                                serial = %tls.info().serial,
                                "SIGHUP: TLS reload refused; keeping the material in use"
                            );
                            report(TlsEvent::Refused(&e));
                        }
                    }
                }
                _ = ticks.tick() => report(TlsEvent::Current(&tls.info())),
            }
        }
    }))
}
