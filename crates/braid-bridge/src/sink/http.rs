//! The `http` sink: one request per output, its URL, headers and body templates filled from
//! the output (the body, by default, the output as JSON), the outputs of a batch sent at once
//! over a pool of kept-alive connections. 2xx is success; 4xx a refusal (counted, not sent
//! again; but 408 and 429 are sent again); anything else, a timeout or no connection is sent
//! again.

use braid_broker::config::SinkConfig;
use braid_rules::Template;
use futures_util::future::join_all;
use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::Method;

use super::{Output, Written};

/// An HTTP target.
pub(super) struct Http {
    client: reqwest::Client,
    method: Method,
    url: Template,
    headers: Vec<(HeaderName, Template)>,
    /// None: the output as JSON.
    body: Option<Template>,
}

impl Http {
    pub(super) fn new(config: &SinkConfig) -> Result<Http, String> {
        let method = Method::from_bytes(config.method.as_bytes()).map_err(|e| format!("method: {e}"))?;
        let url = Template::parse(&config.url).map_err(|e| format!("url: {e}"))?;
        let mut headers = Vec::new();
        for (name, value) in &config.headers {
            let header =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("headers.{name}: {e}"))?;
            headers.push((header, Template::parse(value).map_err(|e| format!("headers.{name}: {e}"))?));
        }
        if !headers.iter().any(|(h, _)| *h == CONTENT_TYPE) {
            headers.push((CONTENT_TYPE, Template::parse("application/json").map_err(|e| e.to_string())?));
        }
        let body = match config.body.is_empty() {
            true => None,
            false => Some(Template::parse(&config.body).map_err(|e| format!("body: {e}"))?),
        };
        let client = super::http_client(config)?;
        Ok(Http { client, method, url, headers, body })
    }

    pub(super) async fn write(&mut self, batch: &[&Output]) -> Vec<Written> {
        join_all(batch.iter().map(|output| self.send(output))).await
    }

    async fn send(&self, output: &Output) -> Written {
        let mut request = self.client.request(self.method.clone(), self.url.render(output));
        for (name, value) in &self.headers {
            match HeaderValue::from_str(&value.render(output)) {
                Ok(v) => request = request.header(name, v),
                Err(_) => return Written::Refused(format!("header {name}: not a valid header value")),
            }
        }
        let body = match &self.body {
            Some(t) => t.render(output),
            None => serde_json::Value::Object(output.clone()).to_string(),
        };
        match request.body(body).send().await {
            Ok(r) => Written::from_status(r.status()),
            Err(e) if e.is_builder() => Written::Refused(e.to_string()),
            Err(e) => Written::Failed(without_url(e)),
        }
    }
}

/// A reqwest error's text, with its causes, without the URL it names (it may carry a
/// password).
pub(super) fn without_url(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text = format!("{text}: {c}");
        cause = c.source();
    }
    text
}
