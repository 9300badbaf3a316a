//! Send pacing for MQTT over QUIC on policed links, one implementation for braid-client's
//! connections and the broker's.
//!
//! A link that polices packets (a token bucket that drops what exceeds it, like iptables
//! `limit` or a mobile operator's rate cap) and adds almost no delay defeats a window-based
//! congestion controller: acknowledgements come back at once, so every packet after an ACK
//! goes out while the policer has no token left and is dropped, retransmissions included. A
//! small urgent stream then waits for the same lost data again and again (seed 000,
//! `bench/HOL.md`). Pacing datagrams at the rate the link delivers keeps every packet within
//! the policer's budget, and because quinn builds a packet only when the socket takes it, the
//! highest-priority stream's data goes into the next packet that leaves.
//!
//! [`PacedSocket`] wraps the UDP socket with a token bucket ([`Pace`]) in packets per second:
//! one for a client's endpoint, one per peer for a server's ([`PacedSocket::per_peer`]).
//! The governor (wrapping quinn's Cubic, installed by [`Pacing::configure`]) sets a
//! connection's rate from what it sees: off until a quarter of the data sent is lost, then the
//! delivered rate, 10 % higher while losses stay under 2 %, and off again if pacing does not
//! bring the losses down (random loss, not a policer) or the rate outgrows any policer.

mod governor;
mod socket;

use std::sync::Arc;

pub use socket::{Pace, PacedSocket, PeerPace};

/// How a QUIC connection paces the datagrams it sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pacing {
    /// No pacing until heavy loss shows a policer, then at the rate the link delivers.
    #[default]
    Adaptive,
    /// Never paced beyond quinn's own congestion control.
    Off,
    /// At most this many packets per second, always (a link with a known packet budget).
    Fixed(u32),
}

impl Pacing {
    /// The bucket a connection paced this way sends through (`None`: off); for adaptive
    /// pacing, `transport` gets the congestion controller that sets the bucket's rate.
    pub fn configure(self, transport: &mut quinn::TransportConfig) -> Option<Pace> {
        let rate = match self {
            Pacing::Off => return None,
            Pacing::Adaptive => None,
            Pacing::Fixed(n) => Some(f64::from(n.max(1))),
        };
        let pace = Pace::new(rate);
        if self == Pacing::Adaptive {
            transport.congestion_controller_factory(Arc::new(governor::GovernorFactory::new(pace.clone())));
        }
        Some(pace)
    }
}

impl std::str::FromStr for Pacing {
    type Err = String;

    /// `adaptive`, `off`, or a number of packets per second.
    fn from_str(s: &str) -> Result<Pacing, String> {
        match s {
            "adaptive" => Ok(Pacing::Adaptive),
            "off" => Ok(Pacing::Off),
            n => match n.parse::<u32>() {
                Ok(n) if n > 0 => Ok(Pacing::Fixed(n)),
                _ => Err(format!("{s:?}: expected adaptive, off, or packets per second (1 or more)")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_parses_from_the_command_line_words() {
        assert_eq!("adaptive".parse(), Ok(Pacing::Adaptive));
        assert_eq!("off".parse(), Ok(Pacing::Off));
        assert_eq!("25".parse(), Ok(Pacing::Fixed(25)));
        assert!("0".parse::<Pacing>().unwrap_err().contains("packets per second"));
        assert!("fast".parse::<Pacing>().is_err());
    }

    #[test]
    fn off_has_no_bucket_and_fixed_paces_from_the_start() {
        let mut t = quinn::TransportConfig::default();
        assert!(Pacing::Off.configure(&mut t).is_none());
        assert_eq!(Pacing::Fixed(25).configure(&mut t).and_then(|p| p.rate()), Some(25.0));
        assert_eq!(Pacing::Adaptive.configure(&mut t).and_then(|p| p.rate()), None);
    }
}
