//! Query-string parsing (`?state=…&label=dim:value&index=…&wait=…`) and endpoint filters.

use shoal_catalog::view::EndpointState;
use shoal_proto::LabelDimension;

use super::*;

pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Parsed `?…` parameters.
#[derive(Debug, Default)]
pub(super) struct Query {
    pub(super) states: Vec<EndpointState>,
    pub(super) zone: Option<String>,
    pub(super) region: Option<String>,
    pub(super) version: Option<String>,
    pub(super) labels: Vec<(LabelDimension, String)>,
    pub(super) index: Option<u64>,
    pub(super) wait_ms: Option<u64>,
}

pub(super) fn parse_wait(v: &str) -> Option<u64> {
    let v = v.trim();
    if let Some(ms) = v.strip_suffix("ms") {
        return ms.parse().ok();
    }
    if let Some(s) = v.strip_suffix('s') {
        return s.parse::<u64>().ok().map(|s| s.saturating_mul(1000));
    }
    if let Some(m) = v.strip_suffix('m') {
        return m.parse::<u64>().ok().map(|m| m.saturating_mul(60_000));
    }
    v.parse::<u64>().ok().map(|s| s.saturating_mul(1000))
}

pub(super) fn parse_query(raw: Option<String>) -> Result<Query, ApiError> {
    let mut q = Query::default();
    let raw = raw.unwrap_or_default();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v =
            percent_decode(v).ok_or_else(|| ApiError::bad("bad_query", "bad percent-encoding"))?;
        match k {
            "state" => {
                for s in v.split(',') {
                    q.states.push(EndpointState::parse(s).ok_or_else(|| {
                        ApiError::bad("bad_query", format!("unknown state `{s}`"))
                    })?);
                }
            }
            "zone" => q.zone = Some(v),
            "region" => q.region = Some(v),
            "version" => q.version = Some(v),
            "label" => {
                let (dim, val) = v.split_once(':').ok_or_else(|| {
                    ApiError::bad("bad_query", "label selector must be `dimension:value`")
                })?;
                let dim = LabelDimension::parse(dim).ok_or_else(|| {
                    ApiError::bad("bad_query", format!("unknown label dimension `{dim}`"))
                })?;
                q.labels.push((dim, val.to_owned()));
            }
            "index" => {
                q.index = Some(
                    v.parse()
                        .map_err(|_| ApiError::bad("bad_query", "index must be an integer"))?,
                )
            }
            "wait" => {
                q.wait_ms = Some(parse_wait(&v).ok_or_else(|| {
                    ApiError::bad("bad_query", "wait must look like 30s, 500ms or 2m")
                })?)
            }
            _ => {
                return Err(ApiError::bad(
                    "bad_query",
                    format!("unknown parameter `{k}`"),
                ))
            }
        }
    }
    Ok(q)
}

impl Query {
    /// True when an endpoint in `state`, of `region`, with `endpoint`'s spec passes every
    /// filter (borrowed parts: no owned view is built per candidate).
    pub(super) fn matches_parts(
        &self,
        state: EndpointState,
        region: &shoal_proto::Region,
        endpoint: &shoal_proto::EndpointSpec,
    ) -> bool {
        (self.states.is_empty() || self.states.contains(&state))
            && self
                .zone
                .as_deref()
                .is_none_or(|z| endpoint.zone.as_str() == z)
            && self.region.as_deref().is_none_or(|r| region.as_str() == r)
            && self
                .version
                .as_deref()
                .is_none_or(|v| endpoint.version.as_str() == v)
            && self
                .labels
                .iter()
                .all(|(d, v)| endpoint.labels.get(*d) == Some(v.as_str()))
    }

    /// True when nothing filters (every endpoint matches).
    pub(super) fn is_unfiltered(&self) -> bool {
        self.states.is_empty()
            && self.zone.is_none()
            && self.region.is_none()
            && self.version.is_none()
            && self.labels.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing() {
        let q = parse_query(Some(
            "state=ready,DRAINING&label=protocol:http2&index=7&wait=30s&zone=a%2Db".into(),
        ))
        .unwrap();
        assert_eq!(
            q.states,
            vec![EndpointState::Ready, EndpointState::Draining]
        );
        assert_eq!(q.labels, vec![(LabelDimension::Protocol, "http2".into())]);
        assert_eq!((q.index, q.wait_ms), (Some(7), Some(30_000)));
        assert_eq!(q.zone.as_deref(), Some("a-b"));
        assert!(parse_query(Some("label=nope:x".into())).is_err());
        assert!(parse_query(Some("bogus=1".into())).is_err());
        assert!(parse_query(Some("index=x".into())).is_err());
        assert!(parse_query(Some("zone=%zz".into())).is_err());
        assert_eq!(parse_wait("500ms"), Some(500));
        assert_eq!(parse_wait("2m"), Some(120_000));
    }
}
