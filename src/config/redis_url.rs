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
    // fred's own text may quote the URL or a part of it: scrubbed too.
    #[cfg(feature = "redis")]
    fred::types::config::Config::from_url(&plain_url).map_err(|e| {
        format!(
            "bad Redis URL {shown:?}: {}",
            scrub(&scrub(e.details(), &plain_url), url)
        )
    })?;
    Ok(Target { plain_url, tls })
}

/// `url` with its credentials hidden: the password (or a lone user name,
/// which may be a password written without its `:`), the user information
/// of a Sentinel `node=` parameter, and the values of query parameters
/// that look like secrets (`sentinelPassword`, tokens...). A value that
/// does not parse as a URL with a host (a password pasted where the URL
/// goes) keeps only its scheme: `redis://<unparseable URL>`, or
/// `<unparseable URL>` without one.
///
/// ```
/// use fleetlimit::redact_url;
///
/// assert_eq!(redact_url("redis://app:s3cret@db:6379/0"), "redis://app:***@db:6379/0");
/// assert_eq!(redact_url("Sup3rSecret"), "<unparseable URL>");
/// assert_eq!(redact_url("redis://u:s3cret@db:port"), "redis://<unparseable URL>");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    let Ok(mut u) = Url::parse(url) else {
        return unparseable(url);
    };
    // Without `//` (`u:pw@h` reads as scheme `u`) the parts say nothing
    // about where a secret is.
    if u.cannot_be_a_base() {
        return unparseable(url);
    }
    let has_userinfo = !u.username().is_empty() || u.password().is_some();
    if u.host().is_none() && has_userinfo {
        return unparseable(url);
    }
    if u.password().is_some() {
        if u.set_password(Some(HIDDEN)).is_err() {
            return unparseable(url);
        }
    } else if !u.username().is_empty() && u.set_username(HIDDEN).is_err() {
        return unparseable(url);
    }
    if let Some(q) = u.query() {
        let q = redact_query(q);
        u.set_query(Some(&q));
    }
    u.to_string()
}

/// What is shown of a value that is not a URL: its scheme, if it starts
/// with one.
fn unparseable(text: &str) -> String {
    match text.split_once("://") {
        Some((scheme, _))
            if scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            format!("{scheme}://<unparseable URL>")
        }
        _ => "<unparseable URL>".into(),
    }
}

/// `a=1&sentinelPassword=x&node=u:p@h:1` → `a=1&sentinelPassword=***&node=***@h:1`,
/// the rest as written.
fn redact_query(q: &str) -> String {
    q.split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if is_secret(k) => format!("{k}={HIDDEN}"),
            Some((k, v)) => match node_userinfo(v) {
                Some(info) => format!("{k}={HIDDEN}@{}", &v[info.len()..]),
                None => pair.to_owned(),
            },
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The user information of a query value written as `userinfo@host…`
/// (a Sentinel `node=`), `@` or its percent-encoding included, if any.
fn node_userinfo(v: &str) -> Option<&str> {
    let at = v.rfind('@').map(|i| i + 1);
    let encoded = v.to_ascii_lowercase().rfind("%40").map(|i| i + 3);
    let end = at.max(encoded)?;
    Some(&v[..end])
}

fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "secret", "token", "auth", "key", "credential"]
        .iter()
        .any(|s| name.contains(s))
}

/// The secrets `url` carries, as written and percent-decoded: what
/// [`redact_url`] hides, for text of another's (a dependency's error) that
/// may quote them. All of the URL after its scheme when it does not parse.
fn secrets(url: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |s: &str| {
        let decoded = percent_decode(s);
        for v in [s.to_owned(), decoded] {
            if !v.is_empty() && !out.contains(&v) {
                out.push(v);
            }
        }
    };
    match Url::parse(url) {
        Ok(u) if !u.cannot_be_a_base() && (u.host().is_some() || u.username().is_empty()) => {
            if let Some(p) = u.password() {
                add(p);
            } else if !u.username().is_empty() {
                add(u.username());
            }
            for pair in u.query().unwrap_or("").split('&') {
                if let Some((k, v)) = pair.split_once('=') {
                    if is_secret(k) {
                        add(v);
                    } else if let Some(info) = node_userinfo(v) {
                        let info = info.trim_end_matches('@');
                        let info = info.strip_suffix("%40").unwrap_or(info);
                        add(info);
                        if let Some((_, pw)) = percent_decode(info).split_once(':') {
                            add(pw);
                        }
                    }
                }
            }
        }
        _ => {
            add(url);
            if let Some((_, rest)) = url.split_once("://") {
                add(rest);
            }
        }
    }
    // Longest first: a secret inside another is hidden with it.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

/// `text` (a dependency's error about `url`) with every secret of `url`
/// replaced by `***`.
pub(crate) fn scrub(text: &str, url: &str) -> String {
    secrets(url)
        .iter()
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), HIDDEN))
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_owned())
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
            // Not a URL: only the scheme is shown.
            ("redis://u:s3cret@h:notaport", "redis://<unparseable URL>"),
            ("u:s3cret@h", "<unparseable URL>"),
            ("s3cret", "<unparseable URL>"),
            ("redis:s3cret", "<unparseable URL>"),
            // A Sentinel node's userinfo.
            (
                "redis-sentinel://h:1?sentinelServiceName=m&node=u:s3cret@h:2",
                "redis-sentinel://h:1?sentinelServiceName=m&node=***@h:2",
            ),
            (
                "redis-sentinel://h:1?sentinelServiceName=m&node=u%3As3cret%40h:2",
                "redis-sentinel://h:1?sentinelServiceName=m&node=***@h:2",
            ),
            ("x://h?token=s3cret", "x://h?token=***"),
            (
                "redis+unix:///run/redis.sock",
                "redis+unix:///run/redis.sock",
            ),
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

    /// fred's error text about a URL goes through the same redaction.
    #[test]
    fn dependency_errors_are_scrubbed() {
        let url = "redis-sentinel://h:1?sentinelServiceName=m&node=admin:s3cret@h:2";
        let e = check(url, true).unwrap_err();
        assert!(!e.contains("s3cret"), "{e}");
        assert!(scrub("bad node admin:s3cret@h:2", url).contains("***@h:2"));
        assert_eq!(scrub("it was Sup3rSecret", "Sup3rSecret"), "it was ***");
        assert_eq!(
            scrub("x redis://a:pw@h:nope", "redis://a:pw@h:nope"),
            "x ***"
        );
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
