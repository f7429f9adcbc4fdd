//! Where a request's key comes from, and how it becomes a Redis key.
//!
//! A limit counts requests per *key*: an API key header, an account, the
//! client's IP address, IP and account together, or one global bucket.
//!
//! The client IP is the TCP peer (`ConnectInfo<SocketAddr>`, axum's
//! `MockConnectInfo<SocketAddr>`, or a plain `SocketAddr` extension for hyper
//! users). `X-Forwarded-For` / `Forwarded` are read **only** when the peer is
//! one of the configured trusted proxies, walking right to left past trusted
//! hops: the first untrusted hop is the client. A client-sent header is never
//! trusted by default. IPv6 addresses are grouped by prefix (`/64` default),
//! since one subscriber usually holds a whole `/64`.
//!
//! Redis keys look like `rl:per-account:{a:bob}`: prefix, limit name, then
//! the key's kind and value inside a hash tag. A value that is long (over 64
//! bytes) or holds anything but printable ASCII other than `{` and `}` is
//! replaced by a SHA-256 digest (`{a#<32 hex>}`), so a client can neither make
//! a huge key nor choose its Redis Cluster slot, and raw and hashed forms can
//! never collide (`:` versus `#`). Header values (API keys) are secrets: they
//! are always stored as a keyed digest, HMAC-SHA256 with the `KeySecret`
//! (`rl:per-key:{h#<32 hex>}`), so reading Redis key names reveals no API key.
//! The digest depends on the value only, so every key of one caller still
//! shares one hash tag, hence one cluster slot.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use axum::extract::connect_info::{ConnectInfo, MockConnectInfo};
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

/// The identity an authentication layer puts in the request extensions, for
/// limits keyed by `"account"` or `"ip+account"`.
///
/// ```
/// # use fleetlimit::Account;
/// # let mut req = http::Request::new(());
/// // In your auth middleware, once the caller is known:
/// req.extensions_mut().insert(Account::new("acct_42"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Account(pub String);

impl Account {
    /// An account id.
    #[must_use]
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }
}

/// What a limit counts by.
///
/// In TOML: `"global"`, `"ip"`, `"header:<name>"`, `"account"` (the
/// [`Account`] extension), `"account:<header>"` (the extension, else that
/// header), `"ip+account"` and `"ip+account:<header>"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// One bucket for every request.
    Global,
    /// The client IP (see the module docs for proxies and IPv6 grouping).
    ClientIp,
    /// The value of a request header, such as an API key.
    Header(HeaderName),
    /// The [`Account`] extension, else the given header if any.
    Account(Option<HeaderName>),
    /// Client IP and account together (e.g. sign-in attempts).
    IpAndAccount(Option<HeaderName>),
}

impl KeySource {
    /// A header key, e.g. `KeySource::header("x-api-key")`. Panics on an
    /// invalid header name.
    #[must_use]
    pub fn header(name: &str) -> Self {
        Self::Header(HeaderName::from_str(name).expect("valid header name"))
    }

    /// Whether this source needs the client IP.
    pub(crate) fn needs_ip(&self) -> bool {
        matches!(self, Self::ClientIp | Self::IpAndAccount(_))
    }

    /// This source's key material in a request, or `None` when the request
    /// does not carry it (no header, no account). An empty header counts as
    /// missing, so "no key" can never become a shared bucket.
    pub(crate) fn extract<'a>(
        &self,
        headers: &'a HeaderMap,
        extensions: &'a http::Extensions,
        ip: Option<IpAddr>,
    ) -> Extracted<'a> {
        match self {
            Self::Global => Extracted::Found(KeyMaterial::new(Kind::Global, b"all")),
            Self::ClientIp => match ip {
                Some(ip) => Extracted::Found(KeyMaterial::ip(ip)),
                None => Extracted::NoClientIp,
            },
            Self::Header(name) => match non_empty(headers, name) {
                Some(v) => Extracted::Found(KeyMaterial::new(Kind::Header, v)),
                None => Extracted::Missing,
            },
            Self::Account(header) => match account(headers, extensions, header.as_ref()) {
                Some(v) => Extracted::Found(KeyMaterial::new(Kind::Account, v)),
                None => Extracted::Missing,
            },
            Self::IpAndAccount(header) => {
                let Some(acct) = account(headers, extensions, header.as_ref()) else {
                    return Extracted::Missing;
                };
                let Some(ip) = ip else {
                    return Extracted::NoClientIp;
                };
                // The IP never contains '|', so the split point is unambiguous.
                let mut v = ip.to_string().into_bytes();
                v.push(b'|');
                v.extend_from_slice(acct);
                Extracted::Found(KeyMaterial::owned(Kind::IpAccount, v))
            }
        }
    }

    /// Where the key comes from, for error messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Global => "global".into(),
            Self::ClientIp => "the client IP".into(),
            Self::Header(h) => format!("header {h}"),
            Self::Account(None) => "the Account extension".into(),
            Self::Account(Some(h)) => format!("the Account extension or header {h}"),
            Self::IpAndAccount(None) => "client IP and the Account extension".into(),
            Self::IpAndAccount(Some(h)) => {
                format!("client IP and the Account extension or header {h}")
            }
        }
    }
}

fn non_empty<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a [u8]> {
    headers
        .get(name)
        .map(|v| v.as_bytes())
        .filter(|v| !v.is_empty())
}

fn account<'a>(
    headers: &'a HeaderMap,
    extensions: &'a http::Extensions,
    header: Option<&HeaderName>,
) -> Option<&'a [u8]> {
    if let Some(Account(a)) = extensions.get::<Account>() {
        if !a.is_empty() {
            return Some(a.as_bytes());
        }
    }
    header.and_then(|h| non_empty(headers, h))
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Global => f.write_str("global"),
            Self::ClientIp => f.write_str("ip"),
            Self::Header(h) => write!(f, "header:{h}"),
            Self::Account(None) => f.write_str("account"),
            Self::Account(Some(h)) => write!(f, "account:{h}"),
            Self::IpAndAccount(None) => f.write_str("ip+account"),
            Self::IpAndAccount(Some(h)) => write!(f, "ip+account:{h}"),
        }
    }
}

impl FromStr for KeySource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let header = |h: &str| {
            HeaderName::from_str(h.trim())
                .map_err(|_| format!("invalid header name {h:?} in key {s:?}"))
        };
        match s.split_once(':') {
            None => match s {
                "global" => Ok(Self::Global),
                "ip" => Ok(Self::ClientIp),
                "account" => Ok(Self::Account(None)),
                "ip+account" => Ok(Self::IpAndAccount(None)),
                _ => Err(bad_key(s)),
            },
            Some(("header", h)) => Ok(Self::Header(header(h)?)),
            Some(("account", h)) => Ok(Self::Account(Some(header(h)?))),
            Some(("ip+account", h)) => Ok(Self::IpAndAccount(Some(header(h)?))),
            Some(_) => Err(bad_key(s)),
        }
    }
}

fn bad_key(s: &str) -> String {
    format!(
        "unknown key source {s:?}; expected \"global\", \"ip\", \"header:<name>\", \
         \"account\", \"account:<header>\", \"ip+account\" or \"ip+account:<header>\""
    )
}

/// What a key source found in a request.
#[derive(Debug)]
pub(crate) enum Extracted<'a> {
    Found(KeyMaterial<'a>),
    /// The request does not carry the key (no header, no account).
    Missing,
    /// The server gave the layer no peer address (a setup problem, not the
    /// client's doing).
    NoClientIp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Global,
    Ip,
    Header,
    Account,
    IpAccount,
}

impl Kind {
    fn tag(self) -> &'static str {
        match self {
            Self::Global => "g",
            Self::Ip => "ip",
            Self::Header => "h",
            Self::Account => "a",
            Self::IpAccount => "ia",
        }
    }
}

/// A key's kind and raw bytes, before encoding.
#[derive(Debug)]
pub(crate) struct KeyMaterial<'a> {
    kind: Kind,
    value: std::borrow::Cow<'a, [u8]>,
}

/// Values longer than this are hashed.
const MAX_RAW: usize = 64;

impl<'a> KeyMaterial<'a> {
    fn new(kind: Kind, value: &'a [u8]) -> Self {
        Self {
            kind,
            value: value.into(),
        }
    }

    fn owned(kind: Kind, value: Vec<u8>) -> KeyMaterial<'static> {
        KeyMaterial {
            kind,
            value: value.into(),
        }
    }

    pub(crate) fn ip(ip: IpAddr) -> KeyMaterial<'static> {
        KeyMaterial::owned(Kind::Ip, ip.to_string().into_bytes())
    }

    /// `<prefix>:<limit>:{<kind>:<value>}`, or `{<kind>#<digest>}` when the
    /// value is long or unsafe, and always for a header value when there is
    /// a `secret` to key its digest with (keys bound for Redis; the
    /// in-process store's never leave the process).
    pub(crate) fn redis_key(
        &self,
        prefix: &str,
        limit: &str,
        secret: Option<&KeySecret>,
    ) -> String {
        let mut k = String::with_capacity(prefix.len() + limit.len() + 8 + MAX_RAW);
        k.push_str(prefix);
        k.push(':');
        k.push_str(limit);
        k.push_str(":{");
        k.push_str(self.kind.tag());
        let v = &self.value;
        if let (Kind::Header, Some(secret)) = (self.kind, secret) {
            k.push('#');
            secret.push_digest(&mut k, v);
            k.push('}');
            return k;
        }
        let safe = v.len() <= MAX_RAW
            && v.iter()
                .all(|&b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}');
        if safe {
            k.push(':');
            // Safe bytes are ASCII, so this cannot fail.
            k.push_str(std::str::from_utf8(v).unwrap_or_default());
        } else {
            k.push('#');
            push_hex(&mut k, &Sha256::digest(v)[..16]);
        }
        k.push('}');
        k
    }

    /// The caller identity plans are looked up by: the key's value (for
    /// IP + account, the account).
    pub(crate) fn plan_key(&self) -> String {
        let v: &[u8] = &self.value;
        let v = match self.kind {
            Kind::IpAccount => v.iter().position(|&b| b == b'|').map_or(v, |i| &v[i + 1..]),
            _ => v,
        };
        String::from_utf8_lossy(v).into_owned()
    }
}

/// The Redis key a limit keyed by `source` uses for a caller whose key value
/// is `value` (an API key, an account, an IP, `ip|account`), as the admin
/// tools need it. IPs are canonicalised and grouped by `rules`, as the
/// request path does before it builds a key.
pub(crate) fn redis_key_for(
    source: &KeySource,
    value: &str,
    rules: &ClientIpRules,
    prefix: &str,
    limit: &str,
    secret: &KeySecret,
) -> String {
    let grouped = |ip: &str| {
        ip.parse::<IpAddr>()
            .ok()
            .map(|ip| rules.group(canonical(ip)).to_string())
    };
    let (kind, value) = match source {
        KeySource::Global => (Kind::Global, "all".to_owned()),
        KeySource::ClientIp => (Kind::Ip, grouped(value).unwrap_or_else(|| value.to_owned())),
        KeySource::Header(_) => (Kind::Header, value.to_owned()),
        KeySource::Account(_) => (Kind::Account, value.to_owned()),
        // `ip|account`, the IP grouped as `extract` receives it.
        KeySource::IpAndAccount(_) => {
            let value = match value.split_once('|') {
                Some((ip, acct)) => {
                    grouped(ip).map_or_else(|| value.to_owned(), |ip| format!("{ip}|{acct}"))
                }
                None => value.to_owned(),
            };
            (Kind::IpAccount, value)
        }
    };
    KeyMaterial::new(kind, value.as_bytes()).redis_key(prefix, limit, Some(secret))
}

/// The secret header values (API keys) are hashed with before they become
/// part of a Redis key name (HMAC-SHA256): whoever reads Redis key names
/// can neither read an API key nor confirm a guessed one without it.
///
/// Every instance of a fleet and the `fleetlimit` CLI must use the same
/// secret, or they count one caller in different buckets. Without a
/// configured secret a fixed one derived from the key prefix is used: key
/// names then hold no raw API key, but anyone who knows the prefix can
/// confirm a guess, so it is not secret.
#[derive(Clone)]
pub(crate) struct KeySecret {
    /// Keyed once; cloned per digest (two SHA-256 states, no re-keying).
    mac: Hmac<Sha256>,
    origin: SecretOrigin,
}

/// Where a [`KeySecret`] came from (what `describe` says; never the secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SecretOrigin {
    /// The built-in one for this key prefix (not secret).
    Default,
    /// The environment variable of this name.
    Env(String),
    /// Given in code ([`ConfigBuilder::key_secret`](crate::config::ConfigBuilder::key_secret)).
    Code,
}

/// A configured secret shorter than this is refused.
pub(crate) const MIN_SECRET_BYTES: usize = 16;

impl KeySecret {
    pub(crate) fn new(secret: &[u8], origin: SecretOrigin) -> Self {
        // HMAC takes a key of any length: this cannot fail.
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        Self { mac, origin }
    }

    /// The built-in secret of `prefix`: fixed and public, but it keeps raw
    /// API keys out of key names, and two prefixes never share digests.
    pub(crate) fn default_for(prefix: &str) -> Self {
        let secret = format!("fleetlimit built-in key secret for prefix {prefix}");
        Self::new(secret.as_bytes(), SecretOrigin::Default)
    }

    pub(crate) fn origin(&self) -> &SecretOrigin {
        &self.origin
    }

    /// Appends the value's digest: 16 bytes of HMAC-SHA256, in hex (the
    /// length of the plain SHA-256 digests of long values).
    fn push_digest(&self, k: &mut String, value: &[u8]) {
        let mut mac = self.mac.clone();
        mac.update(value);
        push_hex(k, &mac.finalize().into_bytes()[..16]);
    }
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret itself.
        f.debug_struct("KeySecret")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// How a Redis key's caller appears in logs, computed from the key only
/// when something is logged: IPs as they are, anything that may be a secret
/// (API keys, accounts) as a short digest — the same digest whether the key
/// holds the value raw or hashed, so one caller has one log id. Lazy: the
/// digest is computed only when the value is formatted (tracing formats a
/// field only for an enabled event).
pub(crate) fn log_id(redis_key: &str) -> LogId<'_> {
    LogId(redis_key)
}

/// See [`log_id`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogId<'a>(&'a str);

impl std::fmt::Display for LogId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&log_id_string(self.0))
    }
}

fn log_id_string(redis_key: &str) -> String {
    let tag = redis_key
        .rfind('{')
        .and_then(|i| redis_key[i + 1..].strip_suffix('}'))
        .unwrap_or(redis_key);
    let split = tag.find([':', '#']).unwrap_or(tag.len());
    let (kind, sep, value) = (
        &tag[..split],
        tag[split..].chars().next(),
        tag.get(split + 1..).unwrap_or(""),
    );
    match (kind, sep) {
        ("ip" | "g", Some(':')) => value.to_owned(),
        (_, Some('#')) => format!("{kind}#{}", &value[..value.len().min(12)]),
        _ => {
            let mut s = format!("{kind}#");
            push_hex(&mut s, &Sha256::digest(value.as_bytes())[..6]);
            s
        }
    }
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 0xf)] as char);
    }
}

/// Which header a trusted proxy writes the client chain into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`
    Forwarded,
}

/// Rules for finding a request's client IP.
#[derive(Clone, Debug)]
pub struct ClientIpRules {
    pub(crate) trusted: Vec<IpNet>,
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

    fn group(&self, ip: IpAddr) -> IpAddr {
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
fn canonical(ip: IpAddr) -> IpAddr {
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

    #[test]
    fn redis_keys_are_bounded_and_unambiguous() {
        let s = KeySecret::default_for("rl");
        let short = KeyMaterial::new(Kind::Account, b"abc");
        assert_eq!(
            short.redis_key("rl", "per-key", Some(&s)),
            "rl:per-key:{a:abc}"
        );
        let long = vec![b'a'; 10 * 1024];
        let k = KeyMaterial::new(Kind::Account, &long).redis_key("rl", "per-key", Some(&s));
        assert!(k.len() < 64, "{k}");
        assert!(k.starts_with("rl:per-key:{a#"));
        let braces = KeyMaterial::new(Kind::Account, b"x}{y").redis_key("rl", "l", Some(&s));
        assert_eq!(braces.matches('{').count(), 1);
        // Same value, different kinds: different buckets.
        let ip = KeyMaterial::new(Kind::Ip, b"1.2.3.4").redis_key("rl", "l", Some(&s));
        let acct = KeyMaterial::new(Kind::Account, b"1.2.3.4").redis_key("rl", "l", Some(&s));
        assert_ne!(ip, acct);
        // One caller, one log id, whether its key is stored raw or hashed.
        assert_eq!(
            log_id_string(&short.redis_key("rl", "l", Some(&s))),
            "a#ba7816bf8f01"
        );
        let hashed = KeyMaterial::new(Kind::Account, &long).redis_key("rl", "l", Some(&s));
        let raw_digest = {
            let mut s = String::from("a#");
            push_hex(&mut s, &Sha256::digest(&long)[..6]);
            s
        };
        assert_eq!(log_id_string(&hashed), raw_digest);
        assert_eq!(log_id_string(&ip), "1.2.3.4");
        assert_eq!(log_id_string("rl:l:{ip:2001:db8::}"), "2001:db8::");
        // A raw key can never spell a hashed one.
        let raw_hashlike = KeyMaterial::new(Kind::Account, b"#0011").redis_key("rl", "l", Some(&s));
        assert!(raw_hashlike.contains("{a:#0011}"));
    }

    #[test]
    fn header_values_are_always_a_keyed_digest() {
        let s = KeySecret::default_for("rl");
        let key = |v: &[u8], s: &KeySecret| {
            KeyMaterial::new(Kind::Header, v).redis_key("rl", "l", Some(s))
        };
        let k = key(b"sk_live_SECRET123", &s);
        assert!(!k.contains("sk_live"), "{k}");
        let tag = k.strip_prefix("rl:l:{h#").and_then(|t| t.strip_suffix('}'));
        assert!(
            tag.is_some_and(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())),
            "{k}"
        );
        // Keyed: another secret, another key; not the plain SHA-256.
        let other = KeySecret::new(b"0123456789abcdef", SecretOrigin::Code);
        assert_ne!(key(b"sk_live_SECRET123", &other), k);
        let mut plain = String::new();
        push_hex(&mut plain, &Sha256::digest(b"sk_live_SECRET123")[..16]);
        assert!(!k.contains(&plain));
        // Deterministic, and the same tag (slot) under every limit.
        assert_eq!(key(b"sk_live_SECRET123", &s), k);
        let tag_of = |k: &str| k[k.find('{').unwrap()..].to_owned();
        let other_limit =
            KeyMaterial::new(Kind::Header, b"sk_live_SECRET123").redis_key("rl", "m", Some(&s));
        assert_eq!(tag_of(&other_limit), tag_of(&k));
        // Another prefix's built-in secret differs.
        assert_ne!(
            tag_of(&key(b"x", &KeySecret::default_for("p"))),
            tag_of(&key(b"x", &s))
        );
        assert!(!format!("{s:?}").contains("built-in key secret"));
        // Without a secret (the in-process store): the plain encoding.
        let local = KeyMaterial::new(Kind::Header, b"abc").redis_key("rl", "l", None);
        assert_eq!(local, "rl:l:{h:abc}");
    }

    #[test]
    fn admin_keys_are_the_keys_requests_use() {
        let mut r = rules(&[], ForwardedHeader::XForwardedFor);
        r.ipv6_prefix = 48;
        let ip = r.client_ip(&HeaderMap::new(), &ext("[2001:db8:1:2::5]:1"));
        let mut h = HeaderMap::new();
        h.insert("x-account", HeaderValue::from_static("acct"));
        h.insert("x-api-key", HeaderValue::from_static("sk_live_X"));
        let no_ext = http::Extensions::new();
        let cases = [
            (KeySource::ClientIp, "2001:db8:1:2::5"),
            (
                KeySource::IpAndAccount(Some("x-account".parse().unwrap())),
                "2001:db8:1:2::5|acct",
            ),
            (KeySource::ClientIp, "::ffff:1.2.3.4"),
            (KeySource::header("x-api-key"), "sk_live_X"),
        ];
        for (source, value) in cases {
            let ip = if value.starts_with("::ffff") {
                r.client_ip(&HeaderMap::new(), &ext("[::ffff:1.2.3.4]:1"))
            } else {
                ip
            };
            let Extracted::Found(m) = source.extract(&h, &no_ext, ip) else {
                panic!("{value}: no key");
            };
            let s = KeySecret::default_for("rl");
            assert_eq!(
                redis_key_for(&source, value, &r, "rl", "l", &s),
                m.redis_key("rl", "l", Some(&s)),
                "{value}"
            );
        }
    }

    #[test]
    fn key_sources_parse() {
        assert_eq!("ip".parse::<KeySource>().unwrap(), KeySource::ClientIp);
        assert_eq!(
            "header:x-api-key".parse::<KeySource>().unwrap(),
            KeySource::header("x-api-key")
        );
        assert!(matches!(
            "account:x-account".parse::<KeySource>().unwrap(),
            KeySource::Account(Some(_))
        ));
        assert!("cookie:sid".parse::<KeySource>().is_err());
        assert!("header:bad header".parse::<KeySource>().is_err());
    }
}
