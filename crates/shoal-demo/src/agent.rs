//! A minimal client of the agent's local API: HTTP/1.1 over a unix socket, `Connection: close`
//! (`shoal_runtime::local_api`, shared with the cross-process tests).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// One request; `Err` when the agent is unreachable or the reply is not HTTP.
pub fn call(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<(u16, Value)> {
    Ok(shoal_runtime::local_api::call(
        socket, method, path, body, timeout,
    )?)
}

/// `/v1/services/ns/svc/port` for a `ns/svc/port` key.
pub fn service_path(service: &str) -> String {
    format!("/v1/services/{}", service.trim_matches('/'))
}
