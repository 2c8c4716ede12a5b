//! A blocking client of the agent's local API: one HTTP/1.1 request over the unix socket,
//! `Connection: close`, JSON body. For the demo and the cross-process tests, which want a
//! call without a runtime; the CLI speaks the same API through hyper (`shoal-cli` `http.rs`).

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// Sends `method path` with `body` (JSON text, or none) and returns `(status, JSON body)`; a
/// body that is not JSON reads as `Value::Null`. Chunked replies are de-chunked.
///
/// # Errors
/// The socket cannot be reached, `timeout` passed during a read or write, or the reply is not
/// HTTP (`InvalidData`).
pub fn call(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<(u16, Value)> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    parse_reply(&out)
}

/// Splits a whole HTTP/1.1 reply into its status and JSON body.
///
/// # Errors
/// `InvalidData` when there is no status line or no end of headers.
pub fn parse_reply(bytes: &[u8]) -> io::Result<(u16, Value)> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let text = String::from_utf8_lossy(bytes);
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("not an HTTP reply"))?;
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("truncated HTTP reply"))?;
    let json_text = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Ok((
        status,
        serde_json::from_str(&json_text).unwrap_or(Value::Null),
    ))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_chunked_replies_parse_and_junk_is_refused() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{\"a\":1}\n";
        assert_eq!(
            parse_reply(plain).unwrap(),
            (200, serde_json::json!({"a": 1}))
        );
        let chunked =
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:2}\r\n0\r\n\r\n";
        assert_eq!(
            parse_reply(chunked).unwrap(),
            (404, serde_json::json!({"a": 2}))
        );
        let not_json = b"HTTP/1.1 500 Oops\r\n\r\nplain text";
        assert_eq!(parse_reply(not_json).unwrap(), (500, Value::Null));
        assert_eq!(
            parse_reply(b"garbage").unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert!(parse_reply(b"HTTP/1.1 200 OK\r\nno end").is_err());
    }

    #[test]
    fn a_missing_socket_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let err = call(
            &dir.path().join("none.sock"),
            "GET",
            "/",
            None,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
