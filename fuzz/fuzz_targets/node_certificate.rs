//! A peer's certificate as the transport parses it after the handshake: the shoal identity URI
//! (`NodeIdentity::from_cert`) and the validity/serial (`CertInfo::from_der`). Also the PEM
//! parsers used on every certificate and key file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_transport::certs::{self, NodeIdentity};
use shoal_transport::tls::CertInfo;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = NodeIdentity::from_cert(data) {
        assert!(id.uri().starts_with(certs::IDENTITY_SCHEME));
    }
    let _ = CertInfo::from_der(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = certs::parse_certs(text, "fuzz");
        let _ = certs::parse_key(text, "fuzz");
    }
});
