//! The HTTP authentication hook: for credentials no other method knows, Braid POSTs
//! `{"clientid": ..., "username": ..., "password": ...}` to `auth.http_url` and expects
//! `200` with `{"result": "allow" | "deny", "acl": {"publish": [...], "subscribe": [...]}}`
//! (`acl` optional). Anything else (another status, a bad body, no answer within
//! `auth.http_timeout_ms`) denies. Plain `http://` only: a small HTTP/1.1 client, one
//! connection per request (`Connection: close`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::jwt::AclClaim;

/// Largest reply read from the hook.
const MAX_REPLY: usize = 64 * 1024;

/// Where the hook is and how long it may take.
#[derive(Debug, Clone)]
pub struct HttpHook {
    host: String,
    path: String,
    timeout: Duration,
}

#[derive(Serialize)]
struct Request<'a> {
    clientid: &'a str,
    username: Option<&'a str>,
    password: Option<&'a str>,
}

/// The hook's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Reply {
    /// `allow` or `deny`.
    pub result: String,
    /// Optional ACL for the client.
    #[serde(default)]
    pub acl: Option<AclClaim>,
}

impl HttpHook {
    /// A hook at `url` (`http://host[:port]/path`).
    pub fn new(url: &str, timeout: Duration) -> Result<HttpHook, String> {
        let rest =
            url.strip_prefix("http://").ok_or_else(|| format!("{url:?}: only http:// URLs are supported"))?;
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if host.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        let host = if host.contains(':') { host.to_string() } else { format!("{host}:80") };
        Ok(HttpHook { host, path: path.to_string(), timeout })
    }

    /// Asks the hook; the error says why the answer is not usable (which denies).
    pub async fn ask(
        &self,
        client_id: &str,
        username: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<Reply, String> {
        let password = password.map(String::from_utf8_lossy);
        let body =
            serde_json::to_vec(&Request { clientid: client_id, username, password: password.as_deref() })
                .map_err(|e| e.to_string())?;
        let exchange = async {
            let mut stream = TcpStream::connect(&self.host).await.map_err(|e| format!("connect: {e}"))?;
            let head = format!(
                "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                self.path,
                self.host,
                body.len()
            );
            stream.write_all(head.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
            stream.write_all(&body).await.map_err(|e| format!("write: {e}"))?;
            let mut reply = Vec::new();
            (&mut stream)
                .take(MAX_REPLY as u64 + 1)
                .read_to_end(&mut reply)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if reply.len() > MAX_REPLY {
                return Err(format!("reply longer than {MAX_REPLY} bytes"));
            }
            Ok(reply)
        };
        let reply = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {} ms", self.timeout.as_millis()))??;
        parse_reply(&reply)
    }
}

/// Parses an HTTP/1.x response: status 200 and a JSON [`Reply`] body (plain or chunked).
fn parse_reply(raw: &[u8]) -> Result<Reply, String> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("reply has no HTTP header")?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| "reply header is not text")?;
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    let code = status.split_whitespace().nth(1).unwrap_or("");
    if code != "200" {
        return Err(format!("HTTP status {status:?}"));
    }
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if chunked {
        body = dechunk(&body).ok_or("bad chunked body")?;
    }
    let reply: Reply = serde_json::from_slice(&body).map_err(|e| format!("bad JSON reply: {e}"))?;
    match reply.result.as_str() {
        "allow" | "deny" => Ok(reply),
        other => Err(format!("result {other:?}: expected allow or deny")),
    }
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let h = HttpHook::new("http://127.0.0.1:8080/auth", Duration::from_secs(1)).unwrap();
        assert_eq!((h.host.as_str(), h.path.as_str()), ("127.0.0.1:8080", "/auth"));
        let h = HttpHook::new("http://auth.local", Duration::from_secs(1)).unwrap();
        assert_eq!((h.host.as_str(), h.path.as_str()), ("auth.local:80", "/"));
        assert!(HttpHook::new("https://x/", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn replies() {
        let ok = parse_reply(b"HTTP/1.1 200 OK\r\nContent-Length: 18\r\n\r\n{\"result\":\"allow\"}").unwrap();
        assert_eq!(ok.result, "allow");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"res\r\nc\r\nult\":\"deny\"}\r\n0\r\n\r\n";
        assert_eq!(parse_reply(chunked).unwrap().result, "deny");
        assert!(parse_reply(b"HTTP/1.1 500 Oops\r\n\r\n").unwrap_err().contains("500"));
        assert!(parse_reply(b"HTTP/1.1 200 OK\r\n\r\nnot json").is_err());
        assert!(parse_reply(b"HTTP/1.1 200 OK\r\n\r\n{\"result\":\"maybe\"}").is_err());
        let acl =
            parse_reply(b"HTTP/1.1 200 OK\r\n\r\n{\"result\":\"allow\",\"acl\":{\"publish\":[\"a/#\"]}}")
                .unwrap();
        assert_eq!(acl.acl.unwrap().publish, vec!["a/#".to_string()]);
    }
}
