//! The client IP: the TCP peer, or a forwarded address when the peer is
//! a trusted proxy, grouped by IPv6 prefix (see the module guide).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::extract::connect_info::{ConnectInfo, MockConnectInfo};
use http::HeaderMap;
use ipnet::IpNet;

/// Which header a trusted proxy writes the client chain into (`[client_ip]
/// header` in TOML; [`ConfigBuilder::forwarded_rfc7239`](crate::ConfigBuilder::forwarded_rfc7239)
/// in code).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`
    Forwarded,
}

/// Rules for finding a request's client IP.
/// `[client_ip]` in TOML.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ClientIpRules {
    #[serde(
        rename = "trusted_proxies",
        deserialize_with = "crate::config::de::proxies"
    )]
    pub(crate) trusted: Vec<IpNet>,
    #[serde(
        rename = "forwarded_header",
        deserialize_with = "crate::config::de::forwarded_header"
    )]
    pub(crate) header: ForwardedHeader,
    pub(crate) ipv6_prefix: u8,
}

impl Default for ClientIpRules {
    fn default() -> Self {
        Self {
            trusted: Vec::new(),
            header: ForwardedHeader::XForwardedFor,
            ipv6_prefix: 64,
        }
    }
}

/// At most this many forwarded hops are walked; a longer chain is cut at
/// the last trusted hop seen.
const MAX_HOPS: usize = 32;

impl ClientIpRules {
    /// The client IP, grouped (IPv6 by prefix), or `None` when the server
    /// gave no peer address.
    pub(crate) fn client_ip(&self, headers: &HeaderMap, ext: &http::Extensions) -> Option<IpAddr> {
        let peer = peer_addr(ext)?;
        Some(self.group(self.resolve(peer, headers)))
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// Walks the forwarded chain right to left while hops are trusted. A hop
    /// that does not parse stops the walk at the last trusted hop, so garbage
    /// can never pick a key (it only lands in the proxy's own bucket).
    fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if self.trusted.is_empty() || !self.is_trusted(peer) {
            return peer;
        }
        let mut current = peer;
        let name = match self.header {
            ForwardedHeader::XForwardedFor => {
                http::header::HeaderName::from_static("x-forwarded-for")
            }
            ForwardedHeader::Forwarded => http::header::FORWARDED,
        };
        // Several header lines form one list, in order.
        let mut hops: Vec<&str> = Vec::new();
        for v in headers.get_all(&name) {
            let Ok(v) = v.to_str() else { return current };
            hops.extend(v.split(','));
        }
        for hop in hops.iter().rev().take(MAX_HOPS) {
            let parsed = match self.header {
                ForwardedHeader::XForwardedFor => parse_hop(hop.trim()),
                ForwardedHeader::Forwarded => forwarded_for(hop).and_then(parse_hop),
            };
            let Some(ip) = parsed.map(canonical) else {
                return current;
            };
            if !self.is_trusted(ip) {
                return ip;
            }
            current = ip;
        }
        current
    }

    /// IPv6 addresses by their prefix; IPv4 as they are.
    pub(crate) fn group(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => {
                let bits = u32::from(self.ipv6_prefix.min(128));
                let mask = if bits == 0 {
                    0
                } else {
                    u128::MAX << (128 - bits)
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        }
    }
}

/// The TCP peer, from whichever extension the server put there.
pub(crate) fn peer_addr(ext: &http::Extensions) -> Option<IpAddr> {
    let addr = ext
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
        .or_else(|| ext.get::<MockConnectInfo<SocketAddr>>().map(|c| c.0))
        .or_else(|| ext.get::<SocketAddr>().copied())?;
    Some(canonical(addr.ip()))
}

/// `::ffff:1.2.3.4` is the IPv4 client 1.2.3.4 (dual-stack listeners).
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]` or `[::1]:80`.
fn parse_hop(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    s.strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|r| r.parse().ok())
}

/// The `for=` value of one `Forwarded` element, quotes removed.
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("for")
            .then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ext(peer: &str) -> http::Extensions {
        let mut e = http::Extensions::new();
        e.insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        e
    }

    fn rules(trusted: &[&str], header: ForwardedHeader) -> ClientIpRules {
        ClientIpRules {
            trusted: trusted.iter().map(|t| t.parse().unwrap()).collect(),
            header,
            ipv6_prefix: 64,
        }
    }

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn untrusted_peer_is_the_client_whatever_it_says() {
        let r = rules(&[], ForwardedHeader::XForwardedFor);
        let ip = r.client_ip(&xff("9.9.9.9"), &ext("1.2.3.4:5555")).unwrap();
        assert_eq!(ip.to_string(), "1.2.3.4");
        let r = rules(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let ip = r.client_ip(&xff("9.9.9.9"), &ext("1.2.3.4:5555")).unwrap();
        assert_eq!(ip.to_string(), "1.2.3.4");
    }

    #[test]
    fn walks_right_to_left_past_trusted_hops() {
        let r = rules(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        // The client spoofed 6.6.6.6; the proxies appended the real hops.
        let h = xff("6.6.6.6, 5.5.5.5, 10.0.0.7");
        assert_eq!(
            r.client_ip(&h, &ext("10.0.0.1:1")).unwrap().to_string(),
            "5.5.5.5"
        );
        // Garbage stops the walk at the last trusted hop.
        let h = xff("not-an-ip, 10.0.0.7");
        assert_eq!(
            r.client_ip(&h, &ext("10.0.0.1:1")).unwrap().to_string(),
            "10.0.0.7"
        );
        // No header: the proxy itself.
        assert_eq!(
            r.client_ip(&HeaderMap::new(), &ext("10.0.0.1:1"))
                .unwrap()
                .to_string(),
            "10.0.0.1"
        );
    }

    #[test]
    fn forwarded_header() {
        let r = rules(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        let mut h = HeaderMap::new();
        h.insert(
            http::header::FORWARDED,
            HeaderValue::from_static(
                "for=7.7.7.7, for=\"[2001:db8:cafe:1::17]:4711\";proto=https, for=10.1.1.1",
            ),
        );
        assert_eq!(
            r.client_ip(&h, &ext("10.0.0.1:1")).unwrap().to_string(),
            "2001:db8:cafe:1::"
        );
    }

    #[test]
    fn ipv6_grouped_by_64_and_v4_mapped_unwrapped() {
        let r = rules(&[], ForwardedHeader::XForwardedFor);
        let a = r
            .client_ip(&HeaderMap::new(), &ext("[2001:db8:1:2:aaaa::1]:1"))
            .unwrap();
        let b = r
            .client_ip(&HeaderMap::new(), &ext("[2001:db8:1:2:bbbb::9]:1"))
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "2001:db8:1:2::");
        let v4 = r
            .client_ip(&HeaderMap::new(), &ext("[::ffff:1.2.3.4]:1"))
            .unwrap();
        assert_eq!(v4.to_string(), "1.2.3.4");
    }
}
