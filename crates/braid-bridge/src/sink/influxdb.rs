//! The `influxdb` sink: a batch's outputs as one line-protocol body (one point each, the
//! `line` template filled from it), to InfluxDB 1.x's `/write?db=` or 2.x's `/api/v2/write`.
//! 2xx is success for the whole batch; 4xx a refusal (a malformed point: counted, not written
//! again; InfluxDB keeps the batch's other points, and each is written again alone to tell
//! which it refused); anything else is written again.

use braid_broker::config::SinkConfig;
use braid_rules::Template;
use reqwest::header::AUTHORIZATION;

use super::{Output, Written};

/// An InfluxDB target.
pub(super) struct Influxdb {
    client: reqwest::Client,
    /// The write endpoint with its query (database or org and bucket, precision).
    endpoint: reqwest::Url,
    token: Option<String>,
    line: Template,
}

impl Influxdb {
    pub(super) fn new(config: &SinkConfig) -> Result<Influxdb, String> {
        let base = reqwest::Url::parse(&config.url).map_err(|e| format!("url: {e}"))?;
        let precision = ("precision", config.precision.as_str());
        let endpoint = match config.database.is_empty() {
            false => base.join("write").map(|mut u| {
                u.query_pairs_mut().append_pair("db", &config.database).append_pair(precision.0, precision.1);
                u
            }),
            true => base.join("api/v2/write").map(|mut u| {
                u.query_pairs_mut()
                    .append_pair("org", &config.org)
                    .append_pair("bucket", &config.bucket)
                    .append_pair(precision.0, precision.1);
                u
            }),
        };
        let endpoint = endpoint.map_err(|e| format!("url: {e}"))?;
        let line = Template::parse(&config.line).map_err(|e| format!("line: {e}"))?;
        let token = (!config.token.is_empty()).then(|| format!("Token {}", config.token));
        Ok(Influxdb { client: super::http_client(config)?, endpoint, token, line })
    }

    pub(super) async fn write(&mut self, batch: &[&Output]) -> Vec<Written> {
        let lines: Vec<String> = batch.iter().map(|o| self.line.render(o)).collect();
        match self.post(lines.join("\n")).await {
            // InfluxDB keeps the points it could parse ("partial write"): each line again on
            // its own tells which it refused (a point written twice overwrites itself).
            Written::Refused(_) if lines.len() > 1 => {
                let mut written = Vec::with_capacity(lines.len());
                for line in lines {
                    written.push(self.post(line).await);
                }
                written
            }
            w => batch.iter().map(|_| w.clone()).collect(),
        }
    }

    /// Posts `body` (points in line protocol): what became of them.
    async fn post(&self, body: String) -> Written {
        let mut request = self.client.post(self.endpoint.clone()).body(body);
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, token);
        }
        match request.send().await {
            Ok(r) => {
                let status = r.status();
                match Written::from_status(status) {
                    Written::Refused(_) => {
                        let text = r.text().await.unwrap_or_default();
                        Written::Refused(format!("{status}: {}", text.trim()))
                    }
                    w => w,
                }
            }
            Err(e) => Written::Failed(super::http::without_url(e)),
        }
    }
}
