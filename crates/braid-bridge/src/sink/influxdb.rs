//! The `influxdb` sink: a batch's outputs as one line-protocol body (one point each, the
//! `line` template filled from it), to InfluxDB 1.x's `/write?db=` or 2.x's `/api/v2/write`.
//! 2xx is success for the whole batch; 4xx a refusal (a malformed point: counted, not written
//! again); anything else is written again.

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
        let body: Vec<String> = batch.iter().map(|o| self.line.render(o)).collect();
        let mut request = self.client.post(self.endpoint.clone()).body(body.join("\n"));
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, token);
        }
        let written = match request.send().await {
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
        };
        batch.iter().map(|_| written.clone()).collect()
    }
}
