//! A minimal HTTP/1.1 client over the agent's unix socket.

use std::path::Path;

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Sends one request; returns the status code and the JSON body (`Null` if empty).
///
/// # Errors
/// Connection or protocol failures (a non-2xx status is not an error).
pub async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, Value)> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| {
            format!(
                "cannot connect to the agent at {} (is it running? --socket / SHOAL_SOCKET)",
                socket.display()
            )
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let bytes = body
        .map(serde_json::to_vec)
        .transpose()?
        .unwrap_or_default();
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "shoal-agent")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    conn.abort();
    let json = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    };
    Ok((status, json))
}
