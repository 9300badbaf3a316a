//! The WebSocket handshake for MQTT over WebSocket: the configured path, and the `mqtt` or
//! `mqttv3.1` subprotocol.
//!
//! Like EMQX (and unlike Mosquitto, which requires one), a handshake that offers no
//! subprotocol is accepted, for simple tools that omit it. A handshake that offers
//! subprotocols but neither `mqtt` nor `mqttv3.1` is refused with 400, and a wrong path with
//! 404. The first offer Braid speaks, in the client's order, is echoed.

use tokio::io::{AsyncRead, AsyncWrite};

use braid_proto::tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use braid_proto::tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use braid_proto::WsStream;

use crate::config::Config;

/// The subprotocols Braid speaks: MQTT 3.1.1 and 5.0 use `mqtt`, MQTT 3.1 `mqttv3.1`.
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// Largest WebSocket frame or message accepted: a whole MQTT packet must fit, and at least
/// 16 MiB so several packets fit in one message.
fn max_message(config: &Config) -> usize {
    (config.mqtt.max_packet_size as usize + 5).max(16 << 20)
}

/// What the client's `Sec-WebSocket-Protocol` headers ask for: `Ok(None)` for no offer,
/// `Ok(Some(p))` for the first offer Braid speaks, `Err` when nothing offered is MQTT.
fn pick_subprotocol(request: &Request) -> Result<Option<&'static str>, ()> {
    let mut offered = false;
    for value in request.headers().get_all("sec-websocket-protocol") {
        for offer in value.to_str().unwrap_or("").split(',').map(str::trim).filter(|o| !o.is_empty()) {
            offered = true;
            if let Some(p) = SUBPROTOCOLS.iter().find(|p| p.eq_ignore_ascii_case(offer)) {
                return Ok(Some(p));
            }
        }
    }
    if offered {
        Err(())
    } else {
        Ok(None)
    }
}

fn refusal(status: StatusCode, why: String) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(why));
    *response.status_mut() = status;
    response
}

/// Runs the server side of the handshake on `stream`; `Err` says why it failed.
pub(super) async fn accept<S>(stream: S, config: &Config) -> Result<WsStream<S>, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let path = config.listeners.ws_path.as_str();
    // The callback's types are tungstenite's.
    #[allow(clippy::result_large_err)]
    let check = |request: &Request, mut response: Response| {
        if request.uri().path() != path {
            let why = format!("no MQTT endpoint at {}; use {path}", request.uri().path());
            return Err(refusal(StatusCode::NOT_FOUND, why));
        }
        match pick_subprotocol(request) {
            Ok(Some(p)) => {
                response.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_static(p));
                Ok(response)
            }
            Ok(None) => Ok(response),
            Err(()) => Err(refusal(StatusCode::BAD_REQUEST, "subprotocol must be mqtt or mqttv3.1".into())),
        }
    };
    WsStream::accept(stream, check, max_message(config)).await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(protocols: &[&str]) -> Request {
        let mut r = Request::builder().uri("/mqtt");
        for p in protocols {
            r = r.header("Sec-WebSocket-Protocol", *p);
        }
        r.body(()).unwrap()
    }

    #[test]
    fn subprotocol_is_the_first_mqtt_offer() {
        assert_eq!(pick_subprotocol(&request(&[])), Ok(None));
        assert_eq!(pick_subprotocol(&request(&["mqtt"])), Ok(Some("mqtt")));
        assert_eq!(pick_subprotocol(&request(&["chat, mqttv3.1, mqtt"])), Ok(Some("mqttv3.1")));
        assert_eq!(pick_subprotocol(&request(&["chat", "MQTT"])), Ok(Some("mqtt")));
        assert_eq!(pick_subprotocol(&request(&["chat"])), Err(()));
    }
}
