//! The HTTP authentication hook: for credentials no other method knows, Braid POSTs
//! `{"clientid": ..., "username": ..., "password": ...}` to `auth.http_url` and expects
//! `200` with `{"result": "allow" | "deny", "acl": {"publish": [...], "subscribe": [...]}}`
//! (`acl` optional). Anything else (another status, a bad body, no answer within
//! `auth.http_timeout_ms`) denies. Plain `http://` only, through hyper's HTTP/1.1 client
//! (hyper-util's), one connection per request (`Connection: close`, none kept idle).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::header::{CONNECTION, CONTENT_TYPE};
use hyper::{StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

use super::jwt::AclClaim;

/// Largest reply read from the hook.
const MAX_REPLY: usize = 64 * 1024;

/// Where the hook is and how long it may take.
#[derive(Debug, Clone)]
pub struct HttpHook {
    uri: Uri,
    timeout: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
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
        let uri: Uri = url.parse().map_err(|e| format!("{url:?}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{url:?}: only http:// URLs are supported"));
        }
        match uri.host() {
            Some(host) if !host.is_empty() => {}
            _ => return Err(format!("{url:?}: no host")),
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(connector);
        Ok(HttpHook { uri, timeout, client })
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
        let request = hyper::Request::post(self.uri.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(CONNECTION, "close")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                let what = if e.is_connect() { "connect" } else { "request" };
                format!("{what}: {}", causes(&e))
            })?;
            let status = response.status();
            let reply = Limited::new(response.into_body(), MAX_REPLY).collect().await.map_err(|e| {
                match e.is::<LengthLimitError>() {
                    true => format!("reply longer than {MAX_REPLY} bytes"),
                    false => format!("read: {}", causes(&*e)),
                }
            })?;
            Ok::<_, String>((status, reply.to_bytes()))
        };
        let (status, reply) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {} ms", self.timeout.as_millis()))??;
        parse_reply(status, &reply)
    }
}

/// `e` and the errors under it, as `e: cause: cause`.
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Checks a response: status 200 and a JSON [`Reply`] body (hyper has decoded a chunked one).
fn parse_reply(status: StatusCode, body: &[u8]) -> Result<Reply, String> {
    if status != StatusCode::OK {
        return Err(format!("HTTP status {status}"));
    }
    let reply: Reply = serde_json::from_slice(body).map_err(|e| format!("bad JSON reply: {e}"))?;
    match reply.result.as_str() {
        "allow" | "deny" => Ok(reply),
        other => Err(format!("result {other:?}: expected allow or deny")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn urls() {
        let h = HttpHook::new("http://127.0.0.1:8080/auth", Duration::from_secs(1)).unwrap();
        assert_eq!((h.uri.host(), h.uri.port_u16(), h.uri.path()), (Some("127.0.0.1"), Some(8080), "/auth"));
        let h = HttpHook::new("http://auth.local", Duration::from_secs(1)).unwrap();
        assert_eq!((h.uri.host(), h.uri.port_u16(), h.uri.path()), (Some("auth.local"), None, "/"));
        assert!(HttpHook::new("https://x/", Duration::from_secs(1)).unwrap_err().contains("only http://"));
        assert!(HttpHook::new("auth.local/x", Duration::from_secs(1)).is_err());
        assert!(HttpHook::new("http://", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn replies() {
        let ok = parse_reply(StatusCode::OK, b"{\"result\":\"allow\"}").unwrap();
        assert_eq!(ok.result, "allow");
        let err = parse_reply(StatusCode::INTERNAL_SERVER_ERROR, b"").unwrap_err();
        assert_eq!(err, "HTTP status 500 Internal Server Error");
        assert!(parse_reply(StatusCode::OK, b"not json").is_err());
        assert!(parse_reply(StatusCode::OK, b"{\"result\":\"maybe\"}").is_err());
        let acl =
            parse_reply(StatusCode::OK, b"{\"result\":\"allow\",\"acl\":{\"publish\":[\"a/#\"]}}").unwrap();
        assert_eq!(acl.acl.unwrap().publish, vec!["a/#".to_string()]);
    }

    /// A hook that answers every request with `reply` (raw HTTP), once per connection.
    async fn hook(reply: &'static [u8]) -> HttpHook {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/auth", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0; 1024];
                    while !request.ends_with(b"}") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&request);
                    assert!(text.starts_with("POST /auth HTTP/1.1\r\n"), "{text}");
                    assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
                    let _ = s.write_all(reply).await;
                });
            }
        });
        HttpHook::new(&url, Duration::from_secs(5)).unwrap()
    }

    #[tokio::test]
    async fn a_chunked_reply_is_read_whole_and_a_long_one_refused() {
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"res\r\nc\r\nult\":\"deny\"}\r\n0\r\n\r\n";
        let reply = hook(chunked).await.ask("c1", Some("u"), Some(b"p")).await.unwrap();
        assert_eq!(reply.result, "deny");
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n";
        let long: &'static [u8] = format!("{head}{}", " ".repeat(70_000)).into_bytes().leak();
        let err = hook(long).await.ask("c1", None, None).await.unwrap_err();
        assert_eq!(err, format!("reply longer than {MAX_REPLY} bytes"));
        let refused = hook(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(refused.ask("c1", None, None).await.unwrap_err(), "HTTP status 403 Forbidden");
    }

    #[tokio::test]
    async fn no_listener_is_a_connect_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let h = HttpHook::new(&format!("http://127.0.0.1:{port}/auth"), Duration::from_secs(5)).unwrap();
        let err = h.ask("c1", None, None).await.unwrap_err();
        assert!(err.starts_with("connect: "), "{err}");
    }
}
