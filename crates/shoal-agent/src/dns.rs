//! DNS on the agent (hickory-server), UDP and TCP on one address; opt-in (`[dns] listen`,
//! e.g. `127.0.0.1:8600`, Consul's DNS port), loopback unless `allow_non_loopback`.
//!
//! **Why opt-in.** Several agents share a host in development and tests, and a fixed default
//! port would make every second agent fail to start; a production unit enables it with one
//! line. Like the Consul port it has no peer credentials (anyone on the host can read), so it
//! is refused while `[access] reads = "granted"`.
//!
//! **Names** (case-insensitive), under `[dns] domain` (default `shoal`):
//!
//! | name | types | answer |
//! | --- | --- | --- |
//! | `<service>.<port>.<namespace>.service.<domain>` | SRV | one per routable endpoint: priority 0 same zone, 1 same region, 2 other; weight = the record's weight; port; target `<hex ip>.addr.<domain>` (its A/AAAA in the additional section) |
//! | same | A / AAAA | the routable endpoints' addresses, same zone first |
//! | `<hex ip>.addr.<domain>` | A / AAAA | the address it encodes (8 hex digits IPv4, 32 IPv6) |
//!
//! Only routable endpoints (READY, health passing, owner up, not locally ejected) are ever
//! answered. **NXDOMAIN** when the name cannot exist (bad shape) or the service has no endpoint
//! that is not EXPIRED; **NODATA** (NOERROR, no answer, SOA in the authority section) when the
//! service exists but has no routable endpoint or none of the asked type. Names outside the
//! domain are REFUSED (the agent is not a resolver). TTL `[dns] ttl_s` (default 0: every
//! lookup sees the current view, as Consul's default; at most 60). UDP answers are limited to
//! the client's EDNS payload size but never more than [`UDP_MAX_BYTES`] (1,232, whatever the
//! client advertises; our OPT record advertises 1,232 too), or 512 bytes without EDNS
//! (RFC 1035); what does not fit is dropped and TC set, so the client retries over TCP, which
//! carries everything. The cap keeps a spoofed ~75-byte query from drawing a ~4 KB reply at
//! a third party when the port is reachable beyond loopback.
//! Answers per name are capped at [`MAX_ANSWERS`]. Counted in
//! `shoal_dns_queries_total{rcode}`, `rcode` the DNS mnemonic ([`rcode_label`]: `NOERROR`,
//! `NXDOMAIN`, `REFUSED`, `FORMERR`, ...); a message that decodes but is not a query (a
//! response, another opcode) is answered FORMERR and counted in
//! `shoal_rejected_inputs_total{source="dns",reason="not_a_query"}`. The sockets, the TCP connection cap and the counting of
//! packets that do not decode are in [`crate::dns_io`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Header, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_server::authority::MessageResponseBuilder;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use serde::Deserialize;
use shoal_catalog::view::{EndpointState, EndpointView};
use shoal_proto::ServiceKey;

use crate::state::Shared;

/// Most records answered for one name.
pub const MAX_ANSWERS: usize = 64;
/// Largest configurable TTL, s.
pub const MAX_TTL_S: u32 = 60;
/// UDP answer size without EDNS (RFC 1035 section 4.2.1), bytes.
pub const UDP_NO_EDNS_BYTES: usize = 512;
/// Largest UDP answer, OPT record included, whatever EDNS payload size the client advertises,
/// bytes; also the payload size our OPT record advertises. 1,232 is the DNS Flag Day 2020
/// recommendation (<https://www.dnsflagday.net/2020/>: fits a 1,280-byte IPv6 minimum MTU
/// without fragmentation) and the default of Unbound and CoreDNS. Why a cap: answers sized to a
/// client's 4,096 turn a ~75-byte query with a spoofed source into a ~3.6 KB reply at someone
/// else (amplification); larger answers go over TCP (TC set), which a spoofed source cannot
/// complete.
pub const UDP_MAX_BYTES: u16 = 1_232;
/// Bytes of our OPT record with no options: root name 1, type 2, class 2, TTL 4, RDLENGTH 2.
const OPT_RECORD_BYTES: usize = 11;

/// `[dns]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsConfig {
    /// UDP + TCP address (e.g. `127.0.0.1:8600`); unset = off.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Allow a non-loopback `listen`.
    #[serde(default)]
    pub allow_non_loopback: bool,
    /// Domain the names live under (no trailing dot).
    #[serde(default = "default_domain")]
    pub domain: String,
    /// TTL of every answer, s (0..=60).
    #[serde(default)]
    pub ttl_s: u32,
    /// Most open TCP connections (default
    /// [`DEFAULT_MAX_TCP_CONNECTIONS`](crate::dns_io::DEFAULT_MAX_TCP_CONNECTIONS), at least
    /// 1); past it a connection is closed at accept (`crate::dns_io`).
    #[serde(default = "default_max_tcp_connections")]
    pub max_tcp_connections: usize,
}

fn default_max_tcp_connections() -> usize {
    crate::dns_io::DEFAULT_MAX_TCP_CONNECTIONS
}

fn default_domain() -> String {
    "shoal".into()
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            listen: None,
            allow_non_loopback: false,
            domain: default_domain(),
            ttl_s: 0,
            max_tcp_connections: default_max_tcp_connections(),
        }
    }
}

/// Checks `[dns]`.
///
/// # Errors
/// `(field, problem)` for the first bad setting.
pub fn validate(
    cfg: &DnsConfig,
    reads: crate::access::ReadAccess,
) -> Result<(), (&'static str, String)> {
    crate::consul::validate_read_port("dns.listen", cfg.listen, cfg.allow_non_loopback, reads)?;
    if cfg.max_tcp_connections == 0 {
        return Err(("dns.max_tcp_connections", "must be at least 1".into()));
    }
    if cfg.ttl_s > MAX_TTL_S {
        return Err(("dns.ttl_s", format!("must be at most {MAX_TTL_S}")));
    }
    let d = cfg.domain.trim_end_matches('.');
    if d.is_empty() || Name::from_ascii(format!("{d}.")).is_err() {
        return Err((
            "dns.domain",
            format!("`{}` is not a domain name", cfg.domain),
        ));
    }
    Ok(())
}

/// What a query name means.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `<service>.<port>.<namespace>.service.<domain>`.
    Service(ServiceKey),
    /// `<hex ip>.addr.<domain>`.
    Addr(IpAddr),
    /// Under the domain but cannot exist.
    NoSuchName,
    /// Not under the domain.
    Foreign,
}

/// Parses a lowercase FQDN (`a.b.` form) against `domain` (`shoal.`).
fn parse_name(fqdn: &str, domain: &str) -> Target {
    let fqdn = fqdn.to_ascii_lowercase();
    let Some(rest) = fqdn.strip_suffix(domain) else {
        return Target::Foreign;
    };
    let Some(rest) = rest.strip_suffix('.') else {
        return if rest.is_empty() {
            Target::NoSuchName
        } else {
            Target::Foreign
        };
    };
    let labels: Vec<&str> = rest.split('.').collect();
    match labels.as_slice() {
        [svc, port, ns, "service"] => ServiceKey::new(ns, svc, port)
            .map(Target::Service)
            .unwrap_or(Target::NoSuchName),
        [hex, "addr"] => parse_hex_ip(hex).map_or(Target::NoSuchName, Target::Addr),
        _ => Target::NoSuchName,
    }
}

fn parse_hex_ip(hex: &str) -> Option<IpAddr> {
    match hex.len() {
        8 => u32::from_str_radix(hex, 16)
            .ok()
            .map(|v| IpAddr::V4(Ipv4Addr::from(v))),
        32 => u128::from_str_radix(hex, 16)
            .ok()
            .map(|v| IpAddr::V6(Ipv6Addr::from(v))),
        _ => None,
    }
}

fn hex_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v) => format!("{:08x}", u32::from(v)),
        IpAddr::V6(v) => format!("{:032x}", u128::from(v)),
    }
}

/// The SRV priority of an endpoint: 0 same zone, 1 same region, 2 elsewhere.
fn tier(shared: &Shared, e: &EndpointView) -> u16 {
    if e.region == shared.cfg.region && e.endpoint.zone == shared.cfg.zone {
        0
    } else if e.region == shared.cfg.region {
        1
    } else {
        2
    }
}

/// The agent's DNS request handler.
pub struct DnsHandler {
    shared: Arc<Shared>,
    /// `shoal.`
    domain: String,
    ttl: u32,
}

/// Records of one answer.
#[derive(Default)]
struct Answer {
    code: Option<ResponseCode>,
    answers: Vec<Record>,
    additionals: Vec<Record>,
    soa: Vec<Record>,
}

impl DnsHandler {
    /// A handler over `shared`'s view with `[dns]` settings.
    pub fn new(shared: Arc<Shared>) -> Self {
        let d = &shared.cfg.raw.dns;
        let domain = format!("{}.", d.domain.trim_end_matches('.').to_ascii_lowercase());
        let ttl = d.ttl_s;
        Self {
            shared,
            domain,
            ttl,
        }
    }

    fn name(&self, s: &str) -> Option<Name> {
        Name::from_ascii(s).ok()
    }

    fn addr_record(&self, name: Name, ip: IpAddr) -> Record {
        let rdata = match ip {
            IpAddr::V4(v) => RData::A(A(v)),
            IpAddr::V6(v) => RData::AAAA(AAAA(v)),
        };
        Record::from_rdata(name, self.ttl, rdata)
    }

    fn soa(&self) -> Vec<Record> {
        let (Some(zone), Some(ns), Some(rname)) = (
            self.name(&self.domain),
            self.name(&format!("ns.{}", self.domain)),
            self.name(&format!("hostmaster.{}", self.domain)),
        ) else {
            return Vec::new();
        };
        // Serial: the low 32 bits of the view index (it grows with every change).
        let serial = (self.shared.index.current() & 0xffff_ffff) as u32;
        let soa = SOA::new(ns, rname, serial, 3600, 600, 86_400, self.ttl);
        vec![Record::from_rdata(zone, self.ttl, RData::SOA(soa))]
    }

    fn nodata(&self) -> Answer {
        Answer {
            soa: self.soa(),
            ..Answer::default()
        }
    }

    fn nxdomain(&self) -> Answer {
        Answer {
            code: Some(ResponseCode::NXDomain),
            soa: self.soa(),
            ..Answer::default()
        }
    }

    fn lookup(&self, qname: &Name, qtype: RecordType) -> Answer {
        match parse_name(&qname.to_ascii(), &self.domain) {
            Target::Foreign => Answer {
                code: Some(ResponseCode::Refused),
                ..Answer::default()
            },
            Target::NoSuchName => self.nxdomain(),
            Target::Addr(ip) => {
                let fits = matches!(
                    (qtype, ip),
                    (RecordType::A, IpAddr::V4(_)) | (RecordType::AAAA, IpAddr::V6(_))
                );
                if !fits {
                    return self.nodata();
                }
                Answer {
                    answers: vec![self.addr_record(qname.clone(), ip)],
                    ..Answer::default()
                }
            }
            Target::Service(key) => self.service(qname, qtype, &key),
        }
    }

    fn service(&self, qname: &Name, qtype: RecordType, key: &ServiceKey) -> Answer {
        let view: Vec<EndpointView> = crate::api::service_view(&self.shared, key)
            .0
            .into_iter()
            .map(|(e, _)| e)
            .filter(|e| e.state != EndpointState::Expired)
            .collect();
        if view.is_empty() {
            return self.nxdomain();
        }
        let mut routable: Vec<(u16, &EndpointView)> = view
            .iter()
            .filter(|e| e.routable)
            .map(|e| (tier(&self.shared, e), e))
            .collect();
        routable.sort_by_key(|(t, e)| (*t, e.instance.clone()));
        routable.truncate(MAX_ANSWERS);
        let mut a = Answer::default();
        match qtype {
            RecordType::SRV => {
                for (t, e) in &routable {
                    let ip = e.endpoint.address.ip();
                    let Some(target) = self.name(&format!("{}.addr.{}", hex_ip(ip), self.domain))
                    else {
                        continue;
                    };
                    let weight = u16::try_from(e.endpoint.weight).unwrap_or(u16::MAX);
                    let srv = SRV::new(*t, weight, e.endpoint.address.port(), target.clone());
                    a.answers
                        .push(Record::from_rdata(qname.clone(), self.ttl, RData::SRV(srv)));
                    a.additionals.push(self.addr_record(target, ip));
                }
            }
            RecordType::A | RecordType::AAAA => {
                let mut seen = Vec::new();
                for (_, e) in &routable {
                    let ip = e.endpoint.address.ip();
                    let fits = (qtype == RecordType::A) == ip.is_ipv4();
                    if fits && !seen.contains(&ip) {
                        seen.push(ip);
                        a.answers.push(self.addr_record(qname.clone(), ip));
                    }
                }
            }
            _ => {}
        }
        if a.answers.is_empty() {
            return self.nodata();
        }
        a
    }
}

/// Drops additionals, then answers, until the encoded answer fits `max` bytes; returns whether
/// anything was dropped (the TC bit).
fn fit_udp(header: &Header, request: &Request, a: &mut Answer, max: usize) -> bool {
    let size = |a: &Answer| {
        let mut m = Message::new();
        m.set_header(*header);
        for q in request.queries() {
            m.add_query(q.original().clone());
        }
        m.add_answers(a.answers.iter().cloned());
        m.add_additionals(a.additionals.iter().cloned());
        m.add_name_servers(a.soa.iter().cloned());
        m.to_vec().map_or(usize::MAX, |v| v.len())
    };
    let mut cut = false;
    while size(a) > max {
        cut = true;
        if a.additionals.pop().is_none() && a.answers.pop().is_none() {
            a.soa.clear();
            break;
        }
    }
    cut
}

/// The UDP answer limit for a request with EDNS `edns`, OPT record excluded, bytes: the
/// client's payload size (RFC 6891: below 512 counts as 512) capped at [`UDP_MAX_BYTES`], less
/// our OPT record; [`UDP_NO_EDNS_BYTES`] without EDNS.
fn udp_limit(edns: Option<&hickory_proto::op::Edns>) -> usize {
    match edns {
        Some(e) => usize::from(e.max_payload().clamp(512, UDP_MAX_BYTES)) - OPT_RECORD_BYTES,
        None => UDP_NO_EDNS_BYTES,
    }
}

#[async_trait::async_trait]
impl RequestHandler for DnsHandler {
    async fn handle_request<R: ResponseHandler>(
        &self,
        request: &Request,
        response_handle: R,
    ) -> ResponseInfo {
        respond(request, response_handle, |name, ty| self.lookup(name, ty)).await
    }
}

/// Answers `request` with what `lookup` finds for its question: FORMERR for what is not a
/// standard query, and on UDP only what fits [`udp_limit`] (TC set when anything was dropped).
async fn respond<R: ResponseHandler>(
    request: &Request,
    mut response_handle: R,
    lookup: impl FnOnce(&Name, RecordType) -> Answer + Send,
) -> ResponseInfo {
    let mut builder = MessageResponseBuilder::from_message_request(request);
    // Answer EDNS with EDNS (RFC 6891), advertising the payload size we accept and keep to
    // (hickory also takes it as the encoder's limit for the UDP answer).
    if request.edns().is_some() {
        let mut ours = hickory_proto::op::Edns::new();
        ours.set_max_payload(UDP_MAX_BYTES);
        builder.edns(ours);
    }
    let udp_max = udp_limit(request.edns());
    let mut header = Header::response_from_request(request.header());
    header.set_authoritative(true);
    header.set_recursion_available(false);
    let info = match request.request_info() {
        Ok(i)
            if request.op_code() == OpCode::Query
                && request.message_type() == MessageType::Query =>
        {
            i
        }
        _ => {
            static NOT_A_QUERY_LOG: shoal_transport::log_every::LogEvery =
                shoal_transport::log_every::LogEvery::new();
            crate::metrics::rejected("dns", "not_a_query");
            if let Some(held) = NOT_A_QUERY_LOG.check() {
                tracing::warn!(src = %request.src(), op_code = ?request.op_code(),
                    not_logged_since_last = held,
                    "DNS message that is not a standard query answered FORMERR (logged once a minute)");
            }
            metrics::counter!("shoal_dns_queries_total", "rcode" => "FORMERR").increment(1);
            let r = builder.error_msg(request.header(), ResponseCode::FormErr);
            return send(&mut response_handle, r, request.header()).await;
        }
    };
    let mut a = lookup(&info.query.name().into(), info.query.query_type());
    if let Some(code) = a.code {
        header.set_response_code(code);
    }
    if info.protocol == hickory_proto::xfer::Protocol::Udp {
        // hickory would cap EDNS-less UDP answers at 4,096 bytes (RFC 1035 says 512) and
        // cut at a record boundary itself; cutting here drops every additional record (the
        // SRV targets' addresses) before any answer, keeps whole records, and sets TC so the
        // client asks again over TCP.
        if fit_udp(&header, request, &mut a, udp_max) {
            header.set_truncated(true);
        }
    }
    let code = header.response_code();
    metrics::counter!("shoal_dns_queries_total", "rcode" => rcode_label(code)).increment(1);
    let r = builder.build(
        header,
        a.answers.iter(),
        std::iter::empty(),
        a.soa.iter(),
        a.additionals.iter(),
    );
    send(&mut response_handle, r, &header).await
}

async fn send<'a, R: ResponseHandler>(
    handle: &mut R,
    r: hickory_server::authority::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    header: &Header,
) -> ResponseInfo {
    match handle.send_response(r).await {
        Ok(info) => info,
        Err(e) => {
            tracing::debug!(error = %e, "DNS answer not sent");
            let mut h = *header;
            h.set_response_code(ResponseCode::ServFail);
            h.into()
        }
    }
}

/// Binds UDP and TCP on `[dns] listen` and serves until the task is aborted.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(
    shared: Arc<Shared>,
    addr: SocketAddr,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let udp = tokio::net::UdpSocket::bind(addr).await?;
    let tcp = tokio::net::TcpListener::bind(udp.local_addr()?).await?;
    let max_tcp = shared.cfg.raw.dns.max_tcp_connections;
    tracing::warn!(%addr, max_tcp_connections = max_tcp,
        "DNS listening (UDP + TCP): anyone who can reach it can read routable endpoints");
    let handler = Arc::new(DnsHandler::new(shared));
    Ok(tokio::spawn(crate::dns_io::run(udp, tcp, handler, max_tcp)))
}

/// The `rcode` label of `shoal_dns_queries_total`: the DNS mnemonic (RFC 1035 / IANA:
/// `NOERROR`, `FORMERR`, `SERVFAIL`, `NXDOMAIN`, `NOTIMP`, `REFUSED`, ...), one style for every
/// code; hickory's `to_str` gives prose ("Non-Existent Domain") beside our own `FORMERR`.
pub fn rcode_label(code: ResponseCode) -> &'static str {
    match code {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::NotImp => "NOTIMP",
        ResponseCode::Refused => "REFUSED",
        ResponseCode::YXDomain => "YXDOMAIN",
        ResponseCode::YXRRSet => "YXRRSET",
        ResponseCode::NXRRSet => "NXRRSET",
        ResponseCode::NotAuth => "NOTAUTH",
        ResponseCode::NotZone => "NOTZONE",
        ResponseCode::BADVERS | ResponseCode::BADSIG => "BADVERS",
        ResponseCode::BADKEY => "BADKEY",
        ResponseCode::BADTIME => "BADTIME",
        ResponseCode::BADMODE => "BADMODE",
        ResponseCode::BADNAME => "BADNAME",
        ResponseCode::BADALG => "BADALG",
        ResponseCode::BADTRUNC => "BADTRUNC",
        ResponseCode::BADCOOKIE => "BADCOOKIE",
        ResponseCode::Unknown(_) => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns, Query};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bound on every wait for the server (never reached when it works).
    const WAIT: Duration = Duration::from_secs(10);
    /// Endpoints of the big service: ~1.8 KB of SRV + A records, more than [`UDP_MAX_BYTES`]
    /// and less than a 4,096-byte EDNS buffer.
    const BIG: u8 = 40;

    /// Answers every query through [`respond`] (the agent's sizing and TC logic) with `BIG`
    /// SRV records and their addresses, as [`DnsHandler::service`] builds them.
    struct BigService;

    fn big_answer(qname: &Name) -> Answer {
        let mut a = Answer::default();
        for i in 1..=BIG {
            let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 1, i));
            let target = Name::from_ascii(format!("{}.addr.shoal.", hex_ip(ip))).unwrap();
            let srv = SRV::new(0, 100, 9000, target.clone());
            a.answers
                .push(Record::from_rdata(qname.clone(), 0, RData::SRV(srv)));
            a.additionals.push(Record::from_rdata(
                target,
                0,
                RData::A(A(Ipv4Addr::new(127, 0, 1, i))),
            ));
        }
        a
    }

    #[async_trait::async_trait]
    impl RequestHandler for BigService {
        async fn handle_request<R: ResponseHandler>(
            &self,
            request: &Request,
            response_handle: R,
        ) -> ResponseInfo {
            respond(request, response_handle, |name, _| big_answer(name)).await
        }
    }

    fn query(edns_payload: Option<u16>) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(7);
        m.set_message_type(MessageType::Query);
        m.add_query(Query::query(
            Name::from_ascii("big.http.prod.service.shoal.").unwrap(),
            RecordType::SRV,
        ));
        if let Some(p) = edns_payload {
            let mut e = Edns::new();
            e.set_max_payload(p);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    /// A query with EDNS 4,096 for an answer of ~1.8 KB: over UDP at most 1,232 bytes with TC
    /// set (it used to come whole, sized to the client's buffer); over TCP every record.
    #[tokio::test]
    async fn udp_answers_are_capped_at_1232_bytes_whatever_the_client_advertises() {
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        let tcp = tokio::net::TcpListener::bind(addr).await.unwrap();
        let server = tokio::spawn(crate::dns_io::run(udp, tcp, Arc::new(BigService), 4));

        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.connect(addr).await.unwrap();
        let mut buf = vec![0u8; 65_535];
        for (advertised, limit) in [
            (Some(4_096), usize::from(UDP_MAX_BYTES)),
            (Some(1_232), usize::from(UDP_MAX_BYTES)),
            (Some(600), 600),
            (None, UDP_NO_EDNS_BYTES),
        ] {
            sock.send(&query(advertised)).await.unwrap();
            let n = tokio::time::timeout(WAIT, sock.recv(&mut buf))
                .await
                .expect("a UDP answer within the bound")
                .unwrap();
            assert!(n <= limit, "EDNS {advertised:?}: {n} bytes > {limit}");
            let m = Message::from_vec(&buf[..n]).unwrap();
            assert!(m.truncated(), "EDNS {advertised:?}: TC not set");
            assert!(!m.answers().is_empty(), "EDNS {advertised:?}: no answer");
            // Additionals go first, then answers.
            assert!(
                m.answers().len() + m.additionals().len() < 2 * usize::from(BIG),
                "EDNS {advertised:?}: nothing dropped"
            );
            assert_eq!(
                m.extensions().as_ref().map(Edns::max_payload),
                advertised.map(|_| UDP_MAX_BYTES),
                "EDNS {advertised:?}: the OPT record we advertise"
            );
        }

        // The same question over TCP: everything, not truncated.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let q = query(Some(4_096));
        let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        s.write_all(&framed).await.unwrap();
        let mut len = [0u8; 2];
        tokio::time::timeout(WAIT, s.read_exact(&mut len))
            .await
            .expect("a TCP answer within the bound")
            .unwrap();
        let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut body).await.unwrap();
        assert!(
            body.len() > usize::from(UDP_MAX_BYTES),
            "{} bytes",
            body.len()
        );
        let m = Message::from_vec(&body).unwrap();
        assert!(!m.truncated());
        assert_eq!(m.answers().len(), usize::from(BIG));
        assert_eq!(m.additionals().len(), usize::from(BIG));
        server.abort();
    }

    #[test]
    fn rcode_labels_are_dns_mnemonics() {
        for (code, label) in [
            (ResponseCode::NoError, "NOERROR"),
            (ResponseCode::FormErr, "FORMERR"),
            (ResponseCode::ServFail, "SERVFAIL"),
            (ResponseCode::NXDomain, "NXDOMAIN"),
            (ResponseCode::NotImp, "NOTIMP"),
            (ResponseCode::Refused, "REFUSED"),
        ] {
            assert_eq!(rcode_label(code), label);
        }
        // Every label of one style: upper case, no spaces.
        for n in 0..=24u16 {
            let l = rcode_label(ResponseCode::from(0, n as u8));
            assert!(l.chars().all(|c| c.is_ascii_uppercase()), "{n}: {l}");
        }
    }

    #[test]
    fn names() {
        let d = "shoal.";
        let k = ServiceKey::new("prod", "web", "http").unwrap();
        assert_eq!(
            parse_name("web.http.prod.service.shoal.", d),
            Target::Service(k.clone())
        );
        assert_eq!(
            parse_name("WEB.Http.prod.service.SHOAL.", d),
            Target::Service(k)
        );
        assert_eq!(
            parse_name("7f000001.addr.shoal.", d),
            Target::Addr("127.0.0.1".parse().unwrap())
        );
        assert_eq!(parse_name("web.prod.service.shoal.", d), Target::NoSuchName);
        assert_eq!(
            parse_name("x_y.http.prod.service.shoal.", d),
            Target::NoSuchName
        );
        assert_eq!(parse_name("shoal.", d), Target::NoSuchName);
        assert_eq!(parse_name("example.com.", d), Target::Foreign);
        assert_eq!(parse_name("notshoal.", d), Target::Foreign);
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(parse_hex_ip(&hex_ip(v6)), Some(v6));
    }
}
