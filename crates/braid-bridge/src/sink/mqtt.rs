//! The `mqtt` sink: one message per output to another MQTT broker (MQTT 5 over TCP, or TLS
//! with `mqtts://`), its topic and payload templates filled from the output (the payload, by
//! default, the output as JSON), at `qos`, the outputs of a batch in flight at once. A QoS 1 or
//! 2 message is sent once the broker acknowledged it; one the broker refuses (a v5 reason code
//! of 0x80 or above, such as Not authorized) is a refusal; a lost connection writes it again on
//! a new one.

use braid_broker::config::SinkConfig;
use braid_client::{
    Bytes, Client, ClientOptions, Message, Properties, ProtocolVersion, QoS, TlsOptions, Transport,
};
use braid_rules::Template;
use futures_util::future::join_all;

use super::{Output, Written};

/// An MQTT broker as a target.
pub(super) struct Mqtt {
    options: ClientOptions,
    client: Option<Client>,
    topic: Template,
    /// None: the output as JSON.
    payload: Option<Template>,
    qos: QoS,
    retain: bool,
}

impl Mqtt {
    pub(super) fn new(config: &SinkConfig) -> Result<Mqtt, String> {
        let url = url::Url::parse(&config.url).map_err(|e| format!("url: {e}"))?;
        let tls = url.scheme() == "mqtts";
        let host = url.host_str().ok_or("url: no host")?.trim_matches(['[', ']']).to_string();
        let port = url.port().unwrap_or(if tls { 8883 } else { 1883 });
        let mut options = ClientOptions::new(host, port);
        options.version = ProtocolVersion::V5;
        options.client_id = format!("braid-sink-{}", config.name);
        options.connect_timeout = std::time::Duration::from_millis(config.timeout_ms);
        let window = config.batch_size.clamp(1, usize::from(u16::MAX)) as u16;
        (options.receive_maximum, options.max_inflight) = (window, window);
        if !url.username().is_empty() {
            options.username = Some(decoded(url.username()));
            options.password = url.password().map(|p| Bytes::from(decoded(p).into_bytes()));
        }
        if tls {
            let ca_file = (!config.ca_file.is_empty()).then(|| config.ca_file.clone().into());
            options.transport = Transport::Tls(TlsOptions { ca_file, ..Default::default() });
        }
        let qos = match config.qos {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            _ => QoS::ExactlyOnce,
        };
        let payload = match config.body.is_empty() {
            true => None,
            false => Some(Template::parse(&config.body).map_err(|e| format!("body: {e}"))?),
        };
        let topic = Template::parse(&config.topic).map_err(|e| format!("topic: {e}"))?;
        Ok(Mqtt { options, client: None, topic, payload, qos, retain: config.retain })
    }

    pub(super) async fn write(&mut self, batch: &[&Output]) -> Vec<Written> {
        if self.client.is_none() {
            match Client::connect(self.options.clone()).await {
                Ok((client, _)) => self.client = Some(client),
                Err(e) => {
                    return batch.iter().map(|_| Written::Failed(format!("cannot connect: {e}"))).collect()
                }
            }
        }
        let Some(client) = &self.client else { return Vec::new() };
        let sends = batch.iter().map(|output| {
            let payload = match &self.payload {
                Some(t) => t.render(output),
                None => serde_json::Value::Object((*output).clone()).to_string(),
            };
            let msg = Message {
                topic: self.topic.render(output),
                payload: Bytes::from(payload.into_bytes()),
                qos: self.qos,
                retain: self.retain,
                properties: Properties::default(),
            };
            async move {
                let acked = match client.publish(msg).await {
                    Ok(handle) => handle.acked().await,
                    Err(e) => Err(e),
                };
                match acked {
                    Ok(code) if code.is_error() => Written::Refused(format!("the broker answered {code:?}")),
                    Ok(_) => Written::Sent,
                    Err(braid_client::Error::Rejected(code)) => Written::Refused(format!("{code:?}")),
                    Err(e) => Written::Failed(e.to_string()),
                }
            }
        });
        let written = join_all(sends).await;
        if written.iter().any(|w| matches!(w, Written::Failed(_))) {
            if let Some(client) = self.client.take() {
                let _ = client.disconnect(braid_client::ReasonCode::Success).await;
            }
        }
        written
    }
}

/// A user name or password from a URL, percent-decoded.
fn decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}
