//! Redis URLs: which schemes are accepted, whether one asks for TLS, and
//! the one function that hides their credentials wherever a URL is shown
//! (logs, `describe()`, errors, the CLI).

use url::Url;

/// The schemes fleetlimit connects with. A `rediss` scheme is TLS.
pub(crate) const SCHEMES: [&str; 7] = [
    "redis",
    "rediss",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
    "redis+unix",
];

/// What replaces a secret in a shown URL.
const HIDDEN: &str = "***";

/// A Redis URL that passed [`check`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// The URL with a plaintext scheme, for fred's parser: TLS is set up by
    /// the store itself (roots and CA file), not by fred's defaults.
    pub(crate) plain_url: String,
    /// The scheme asks for TLS (`rediss…`).
    pub(crate) tls: bool,
}

/// Checks `url` the way the store will use it: an accepted scheme, TLS
/// only when `tls_built` (never a silent plaintext connection), and
/// everything fred needs (host, port, database, sentinel service). The
/// error text shows the URL redacted.
pub(crate) fn check(url: &str, tls_built: bool) -> Result<Target, String> {
    let shown = redact_url(url);
    let parsed =
        Url::parse(url).map_err(|e| format!("cannot read the Redis URL {shown:?}: {e}"))?;
    let scheme = parsed.scheme();
    if !SCHEMES.contains(&scheme) {
        let accepted: Vec<String> = SCHEMES.iter().map(|s| format!("{s}://")).collect();
        return Err(format!(
            "unsupported Redis URL scheme \"{scheme}://\" in {shown:?}; accepted: {}",
            accepted.join(", ")
        ));
    }
    let tls = scheme.starts_with("rediss");
    if tls && !tls_built {
        return Err(format!(
            "{shown:?} asks for TLS, but this build of fleetlimit has no TLS support \
             (build it with the cargo feature `tls`); refusing to connect in plaintext"
        ));
    }
    let plain_url = if tls {
        let mut plain = parsed.clone();
        plain
            .set_scheme(&scheme.replacen("rediss", "redis", 1))
            .map_err(|()| format!("cannot read the Redis URL {shown:?}"))?;
        plain.to_string()
    } else {
        url.to_owned()
    };
    if !cfg!(feature = "redis") {
        return Err(format!(
            "{shown:?}: this build of fleetlimit has no Redis support \
             (build it with the cargo feature `redis`, on by default)"
        ));
    }
    #[cfg(feature = "redis")]
    fred::types::config::Config::from_url(&plain_url)
        .map_err(|e| format!("bad Redis URL {shown:?}: {}", e.details()))?;
    Ok(Target { plain_url, tls })
}

/// `url` with its credentials hidden: the password (or a lone user name,
/// which may be a password written without its `:`) and the values of
/// query parameters that look like secrets (`sentinelPassword`, tokens...).
/// A URL that does not parse loses everything before its last `@`.
///
/// ```
/// assert_eq!(
///     fleetlimit::redact_url("redis://app:s3cret@db:6379/0"),
///     "redis://app:***@db:6379/0"
/// );
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    // Without a host (`u:pw@h` reads as scheme `u`) the URL parser's
    // parts say nothing about where a secret is.
    let Ok(mut u) = Url::parse(url).and_then(|u| match u.host() {
        Some(_) => Ok(u),
        None => Err(url::ParseError::EmptyHost),
    }) else {
        return redact_text(url);
    };
    if u.password().is_some() {
        if u.set_password(Some(HIDDEN)).is_err() {
            return redact_text(url);
        }
    } else if !u.username().is_empty() && u.set_username(HIDDEN).is_err() {
        return redact_text(url);
    }
    if let Some(q) = u.query() {
        let q = redact_query(q);
        u.set_query(Some(&q));
    }
    u.to_string()
}

/// The fallback for text that is not a URL: hide all of a possible
/// userinfo, and secret-looking query values.
fn redact_text(text: &str) -> String {
    let (scheme, rest) = match text.find("://") {
        Some(i) => text.split_at(i + 3),
        None => ("", text),
    };
    let rest = match rest.rfind('@') {
        Some(i) => format!("{HIDDEN}{}", &rest[i..]),
        None => rest.to_owned(),
    };
    match rest.split_once('?') {
        Some((head, q)) => format!("{scheme}{head}?{}", redact_query(q)),
        None => format!("{scheme}{rest}"),
    }
}

/// `a=1&sentinelPassword=x` → `a=1&sentinelPassword=***`, the rest as written.
fn redact_query(q: &str) -> String {
    q.split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if is_secret(k) => format!("{k}={HIDDEN}"),
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "secret", "token", "auth", "key", "credential"]
        .iter()
        .any(|s| name.contains(s))
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_hidden() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:s3cret@h:1", "redis://:***@h:1"),
            ("redis://app:s3cret@h:1/2", "redis://app:***@h:1/2"),
            // A lone user name may be a password written without its ':'.
            ("rediss://s3cret@h:1", "rediss://***@h:1"),
            (
                "redis-sentinel://u:s3cret@h:1?sentinelServiceName=m&sentinelPassword=s3cret&node=h:2",
                "redis-sentinel://u:***@h:1?sentinelServiceName=m&sentinelPassword=***&node=h:2",
            ),
            // Not a URL: everything before the last '@' goes.
            ("redis://u:s3cret@h:notaport", "redis://***@h:notaport"),
            ("u:s3cret@h", "***@h"),
            ("x://h?token=s3cret", "x://h?token=***"),
            ("redis+unix:///run/redis.sock", "redis+unix:///run/redis.sock"),
            (
                "redis+unix://u:s3cret@localhost/run/redis.sock",
                "redis+unix://u:***@localhost/run/redis.sock",
            ),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("s3cret"));
        }
    }

    #[test]
    fn schemes_and_tls() {
        for s in SCHEMES {
            let url = if s.ends_with("sentinel") {
                format!("{s}://h:26379?sentinelServiceName=m")
            } else if s.ends_with("unix") {
                format!("{s}:///run/redis.sock")
            } else {
                format!("{s}://h:6379")
            };
            let t = check(&url, true).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(t.tls, s.starts_with("rediss"));
            assert!(t.plain_url.starts_with("redis") && !t.plain_url.starts_with("rediss"));
            assert_eq!(t.plain_url.len() + usize::from(t.tls), url.len());
        }
        let e = check("notaurl://x", true).unwrap_err();
        assert!(
            e.contains("unsupported Redis URL scheme \"notaurl://\""),
            "{e}"
        );
        assert!(e.contains("accepted: redis://, rediss://"), "{e}");
        assert!(check("redis://h:notaport", true).is_err());
        assert!(
            check("redis-sentinel://h:1", true).is_err(),
            "no service name"
        );
    }

    /// Built without the `tls` feature, a `rediss` URL is refused: never
    /// a plaintext connection to a server meant to be reached over TLS.
    #[test]
    fn without_tls_support_rediss_is_refused() {
        for url in [
            "rediss://:s3cret@h:6380",
            "rediss-cluster://h:6380",
            "rediss-sentinel://h:1?sentinelServiceName=m",
        ] {
            let e = check(url, false).unwrap_err();
            assert!(e.contains("no TLS support"), "{e}");
            assert!(e.contains("refusing to connect in plaintext"), "{e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
        assert!(check("redis://h:6379", false).is_ok());
    }
}
