//! What a limit counts by ([`KeySource`]) and what it finds in a request
//! (`Extracted`): the key material a store key is then built from.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use http::{HeaderMap, HeaderName};

use super::client_ip::{ClientIpRules, canonical};
use super::custom::CustomKeys;
use super::extracted::Extracted;
use super::store_key::{KeyMaterial, Kind};
use crate::RequestRef;

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
/// header), `"ip+account"`, `"ip+account:<header>"` and `"custom:<name>"`
/// (a key the application computes, see [`Custom`](Self::Custom)).
///
/// Two sources never share a bucket, even for equal values: the kind of
/// key is part of its store key (`{h#…}`, `{a:…}`, `{c#…}`), as is the
/// limit's name.
///
/// ```
/// use fleetlimit::configuration::KeySource;
///
/// assert_eq!("header:x-api-key".parse::<KeySource>()?, KeySource::header("x-api-key"));
/// assert_eq!("ip".parse::<KeySource>()?, KeySource::ClientIp);
/// assert_eq!("custom:tenant".parse::<KeySource>()?, KeySource::Custom("tenant".into()));
/// assert!("cookie:session".parse::<KeySource>().is_err());
/// assert!("custom:".parse::<KeySource>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// One bucket for every request.
    Global,
    /// The client IP: the TCP peer (`ConnectInfo`), or behind trusted
    /// proxies the forwarded address (see [`ConfigBuilder::trusted_proxies`](crate::ConfigBuilder::trusted_proxies)); IPv6 grouped
    /// by prefix (`/64` by default).
    ClientIp,
    /// The value of a request header, such as an API key.
    Header(HeaderName),
    /// The [`Account`] extension, else the given header if any.
    Account(Option<HeaderName>),
    /// Client IP and account together (e.g. sign-in attempts).
    IpAndAccount(Option<HeaderName>),
    /// A key the application computes from the request: the
    /// function registered under this name with
    /// [`RateLimitLayerBuilder::key_fn`](crate::layer::RateLimitLayerBuilder::key_fn)
    /// (a tenant from a verified token's claims, a path parameter...).
    /// The name is 1 to 64 letters, digits, `-`, `_` or `.`; a layer built
    /// without an extractor of that name is an error
    /// ([`BuildError::Config`](crate::BuildError::Config)).
    ///
    /// The extractor answers a key (stored like an API key: a keyed
    /// digest in Redis, so reading key names confirms no guessed value),
    /// no key (the limit's `on_missing`), or an invalid key (`400`).
    Custom(String),
}

impl KeySource {
    /// A header key, e.g. `KeySource::header("x-api-key")`. Panics on an
    /// invalid header name.
    #[must_use]
    pub fn header(name: &str) -> Self {
        Self::Header(HeaderName::from_str(name).expect("valid header name"))
    }

    /// A custom key, e.g. `KeySource::custom("tenant")`: the
    /// [`Custom`](Self::Custom) variant (its name is checked when the
    /// configuration is built).
    #[must_use]
    pub fn custom(name: impl Into<String>) -> Self {
        Self::Custom(name.into())
    }

    /// Whether this source needs the client IP.
    pub(crate) fn needs_ip(&self) -> bool {
        matches!(self, Self::ClientIp | Self::IpAndAccount(_))
    }

    /// This source's key material in a request, or why there is none (no
    /// header, no account...). An empty header counts as missing, so "no
    /// key" can never become a shared bucket. Custom keys are asked of
    /// `custom`.
    #[inline]
    pub(crate) fn extract<'a>(
        &self,
        req: &RequestRef<'a>,
        ip: Option<IpAddr>,
        custom: &CustomKeys,
    ) -> Extracted<'a> {
        let (headers, extensions) = (req.headers(), req.extensions());
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
                Extracted::Found(KeyMaterial::ip_account(ip.to_string(), acct))
            }
            Self::Custom(name) => custom.extract(name, req),
        }
    }

    /// The key material of a caller whose key value is `value` (an API key,
    /// an account, an IP, `ip|account`), as the admin tools take it. IPs are
    /// canonicalised and grouped by `rules`, as the request path does before
    /// it extracts a key, so the admin tools reach the keys requests use.
    pub(crate) fn material_for(&self, value: &str, rules: &ClientIpRules) -> KeyMaterial<'static> {
        let grouped = |ip: &str| {
            ip.parse::<IpAddr>()
                .ok()
                .map(|ip| rules.group(canonical(ip)).to_string())
        };
        let owned = |kind, v: &str| KeyMaterial::owned(kind, v.as_bytes().to_vec());
        match self {
            Self::Global => owned(Kind::Global, "all"),
            Self::ClientIp => match grouped(value) {
                Some(ip) => KeyMaterial::owned(Kind::Ip, ip.into_bytes()),
                None => owned(Kind::Ip, value),
            },
            Self::Header(_) => owned(Kind::Header, value),
            Self::Account(_) => owned(Kind::Account, value),
            // `ip|account`, the IP grouped as `extract` receives it.
            Self::IpAndAccount(_) => match value.split_once('|') {
                Some((ip, acct)) => KeyMaterial::ip_account(
                    grouped(ip).unwrap_or_else(|| ip.to_owned()),
                    acct.as_bytes(),
                ),
                None => owned(Kind::IpAccount, value),
            },
            Self::Custom(_) => owned(Kind::Custom, value),
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
            Self::Custom(name) => format!("custom key {name:?}"),
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
            Self::Custom(name) => write!(f, "custom:{name}"),
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
            Some(("custom", name)) => {
                check_custom_name(name).map_err(|e| format!("{e} (in key {s:?})"))?;
                Ok(Self::Custom(name.to_owned()))
            }
            Some(_) => Err(bad_key(s)),
        }
    }
}

fn bad_key(s: &str) -> String {
    format!(
        "unknown key source {s:?}; expected \"global\", \"ip\", \"header:<name>\", \
         \"account\", \"account:<header>\", \"ip+account\", \"ip+account:<header>\" \
         or \"custom:<name>\""
    )
}

/// A name that ends up inside Redis keys (a limit's, a plan's, a custom
/// key's): 1 to 64 letters, digits, `-`, `_` or `.`, so never `:`, `{` or
/// `}`.
pub(crate) fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// A custom key's name: what a limit name may be, so it reads the same in
/// the file, in code and in errors.
pub(crate) fn check_custom_name(name: &str) -> Result<(), String> {
    if is_name(name) {
        Ok(())
    } else {
        Err(format!(
            "custom key name {name:?} must be 1 to 64 characters of letters, digits, '-', '_' or '.'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::extract::connect_info::ConnectInfo;
    use http::HeaderValue;

    use super::*;
    use crate::key::KeySecret;

    fn ext(peer: &str) -> http::Extensions {
        let mut e = http::Extensions::new();
        e.insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        e
    }

    #[test]
    fn admin_keys_are_the_keys_requests_use() {
        let r = ClientIpRules {
            ipv6_prefix: 48,
            ..ClientIpRules::default()
        };
        let ip = r.client_ip(&HeaderMap::new(), &ext("[2001:db8:1:2::5]:1"));
        let mut h = HeaderMap::new();
        h.insert("x-account", HeaderValue::from_static("acct"));
        h.insert("x-api-key", HeaderValue::from_static("sk_live_X"));
        let mut req = http::Request::new(());
        *req.headers_mut() = h;
        let req = RequestRef::from(&req);
        let cases = [
            (KeySource::ClientIp, "2001:db8:1:2::5"),
            (
                KeySource::IpAndAccount(Some("x-account".parse().unwrap())),
                "2001:db8:1:2::5|acct",
            ),
            (KeySource::ClientIp, "::ffff:1.2.3.4"),
            (KeySource::header("x-api-key"), "sk_live_X"),
        ];
        // (Custom keys: `custom.rs` and tests/custom_keys.rs.)
        for (source, value) in cases {
            let ip = if value.starts_with("::ffff") {
                r.client_ip(&HeaderMap::new(), &ext("[::ffff:1.2.3.4]:1"))
            } else {
                ip
            };
            let Extracted::Found(m) = source.extract(&req, ip, &Default::default()) else {
                panic!("{value}: no key");
            };
            let s = KeySecret::default_for("rl");
            assert_eq!(
                source
                    .material_for(value, &r)
                    .store_key(&crate::key::KeyHead::new("rl", "l"), Some(&s), false)
                    .key,
                m.store_key(&crate::key::KeyHead::new("rl", "l"), Some(&s), false)
                    .key,
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
        assert_eq!(
            "custom:tenant.v2".parse::<KeySource>().unwrap(),
            KeySource::custom("tenant.v2")
        );
        for bad in ["custom:", "custom:a b", "custom:ténant", "custom:a:b"] {
            let e = bad.parse::<KeySource>().unwrap_err();
            assert!(e.contains("custom key name"), "{bad}: {e}");
        }
        assert_eq!(KeySource::custom("t").to_string(), "custom:t");
    }
}
