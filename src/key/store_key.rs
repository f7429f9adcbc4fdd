//! The store key: how a caller's key material becomes the name of its
//! bucket, `<prefix>:<limit>:{<kind>:<value>}` or `{<kind>#<digest>}` (see
//! the module guide). The request path builds a [`StoreKey`] once and reads
//! what it was built from (log id, plan key) from its fields; keys read back
//! from Redis by the admin tools are parsed by [`StoreKey::parse`], which
//! sits next to the renderer it must agree with.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::ops::Range;

use sha2::{Digest, Sha256};
use siphasher::sip128::SipHasher24;

/// A key's kind, written as the first part of its hash tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Global,
    Ip,
    Header,
    Account,
    IpAccount,
    /// From the application's extractor (`custom:<name>`).
    Custom,
}

impl Kind {
    const ALL: [Self; 6] = [
        Self::Global,
        Self::Ip,
        Self::Header,
        Self::Account,
        Self::IpAccount,
        Self::Custom,
    ];

    fn tag(self) -> &'static str {
        match self {
            Self::Global => "g",
            Self::Ip => "ip",
            Self::Header => "h",
            Self::Account => "a",
            Self::IpAccount => "ia",
            Self::Custom => "c",
        }
    }

    /// Whether its values may be secrets whose keys in Redis must be a
    /// keyed digest (API keys; custom keys, which may be tokens or ids a
    /// reader of Redis could otherwise confirm by guessing).
    fn keyed(self) -> bool {
        matches!(self, Self::Header | Self::Custom)
    }

    fn from_tag(tag: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.tag() == tag)
    }
}

/// How a key's value is written in its hash tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    /// `{<kind>:<value>}`: at most [`MAX_RAW`] printable ASCII bytes, no
    /// braces.
    Raw,
    /// `{<kind>#<32 lowercase hex>}`: SHA-256 of a long or unsafe value,
    /// or the keyed digest of a header value. `#` versus `:` keeps raw and
    /// hashed forms from colliding.
    Digest,
}

/// Values longer than this are hashed.
const MAX_RAW: usize = 64;

/// Hex digits of a digest in a key (16 bytes).
const DIGEST_HEX: usize = 32;

/// Whether `v` can be written into a key as it is.
fn is_raw(v: &[u8]) -> bool {
    v.len() <= MAX_RAW
        && v.iter()
            .all(|&b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}')
}

/// A key's kind and raw bytes, before encoding.
#[derive(Debug)]
pub(crate) struct KeyMaterial<'a> {
    kind: Kind,
    value: Cow<'a, [u8]>,
    /// Where the part plans are looked up by starts in `value` (after the
    /// IP of an IP + account key).
    plan_at: usize,
}

impl<'a> KeyMaterial<'a> {
    pub(crate) fn new(kind: Kind, value: &'a [u8]) -> Self {
        Self {
            kind,
            value: value.into(),
            plan_at: 0,
        }
    }

    pub(crate) fn from_cow(kind: Kind, value: Cow<'a, [u8]>) -> Self {
        Self {
            kind,
            value,
            plan_at: 0,
        }
    }

    pub(crate) fn owned(kind: Kind, value: Vec<u8>) -> KeyMaterial<'static> {
        KeyMaterial {
            kind,
            value: value.into(),
            plan_at: 0,
        }
    }

    pub(crate) fn ip(ip: IpAddr) -> KeyMaterial<'static> {
        KeyMaterial::owned(Kind::Ip, ip.to_string().into_bytes())
    }

    /// `<ip>|<account>`: an IP never contains `|`, so the value is
    /// unambiguous.
    pub(crate) fn ip_account(ip: String, account: &[u8]) -> KeyMaterial<'static> {
        let mut v = ip.into_bytes();
        v.push(b'|');
        let plan_at = v.len();
        v.extend_from_slice(account);
        KeyMaterial {
            kind: Kind::IpAccount,
            value: v.into(),
            plan_at,
        }
    }

    /// `<prefix>:<limit>:{<kind>:<value>}`, or `{<kind>#<digest>}` when the
    /// value is long or unsafe, and always for a header or custom value when there is
    /// a `secret` to key its digest with (keys bound for Redis; the
    /// in-process store's never leave the process). `with_plan_key`: also
    /// keep the caller identity plans are looked up by (an allocation only
    /// limits with plans need).
    pub(crate) fn store_key(
        &self,
        head: &KeyHead,
        secret: Option<&KeySecret>,
        with_plan_key: bool,
    ) -> StoreKey {
        let mut key = String::with_capacity(head.text.len() + 8 + MAX_RAW);
        let (limit, log_id) = self.write_key(&mut key, head, secret);
        StoreKey {
            key,
            limit,
            log_id,
            plan_key: with_plan_key.then(|| self.plan_key()),
        }
    }

    /// The caller identity plans are looked up by.
    pub(crate) fn plan_key(&self) -> String {
        String::from_utf8_lossy(&self.value[self.plan_at..]).into_owned()
    }

    /// [`store_key`](Self::store_key)'s text, written into `key` (cleared
    /// first: a buffer the caller reuses, so a lone limit on the in-process
    /// store looks its bucket up without a key of its own). Where the
    /// limit's name is in `key`, and the key's log id.
    pub(crate) fn write_key(
        &self,
        key: &mut String,
        head: &KeyHead,
        secret: Option<&KeySecret>,
    ) -> (Range<usize>, LogId) {
        key.clear();
        key.push_str(&head.text);
        key.push_str(self.kind.tag());
        let v = &self.value;
        let value_at = key.len() + 1;
        let encoding = match secret {
            Some(secret) if self.kind.keyed() => {
                key.push('#');
                secret.push_digest(key, self.kind, v);
                Encoding::Digest
            }
            _ if is_raw(v) => {
                key.push(':');
                // Raw bytes are ASCII, so this cannot fail.
                key.push_str(std::str::from_utf8(v).unwrap_or_default());
                Encoding::Raw
            }
            _ => {
                key.push('#');
                push_hex(key, &Sha256::digest(v)[..DIGEST_HEX / 2]);
                Encoding::Digest
            }
        };
        let log_id = LogId::new(self.kind, encoding, value_at..key.len());
        key.push('}');
        (head.limit.clone(), log_id)
    }
}

/// `<prefix>:<limit>:{`, what every store key of one limit starts with:
/// written once, when the limit is built, and copied into each request's
/// key in one piece.
#[derive(Clone, Debug)]
pub(crate) struct KeyHead {
    text: Box<str>,
    /// Where the limit's name is in `text`.
    limit: Range<usize>,
}

impl KeyHead {
    pub(crate) fn new(prefix: &str, limit: &str) -> Self {
        let limit_at = prefix.len() + 1;
        Self {
            text: format!("{prefix}:{limit}:{{").into(),
            limit: limit_at..limit_at + limit.len(),
        }
    }
}

/// A store key and what it was built from.
#[derive(Debug)]
pub(crate) struct StoreKey {
    /// The key as the store uses it, e.g. `rl:per-key:{h#<32 hex>}`.
    pub(crate) key: String,
    /// Where the limit name is in `key`.
    limit: Range<usize>,
    /// Kind, encoding and the value as written (raw or digest).
    log_id: LogId,
    /// The caller identity plans are looked up by: the key's value (for
    /// IP + account, the account); only when it was asked for (the request
    /// path writes keys into its own buffers and asks
    /// [`KeyMaterial::plan_key`]).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) plan_key: Option<String>,
}

impl StoreKey {
    /// A key read back from Redis under `prefix`, if it has the shape
    /// [`KeyMaterial::store_key`] writes (raw or hashed tags, the raw header
    /// values of older versions included); `None` for any other name, such
    /// as another application's key under the same prefix.
    pub(crate) fn parse(prefix: &str, key: &str) -> Option<Self> {
        let rest = key.strip_prefix(prefix)?.strip_prefix(':')?;
        let (name, tag) = rest.split_once(':')?;
        let name_ok = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        let inner = tag.strip_prefix('{')?.strip_suffix('}')?;
        let split = inner.find([':', '#'])?;
        let kind = Kind::from_tag(&inner[..split])?;
        let value = &inner[split + 1..];
        let encoding = if inner.as_bytes()[split] == b'#' {
            Encoding::Digest
        } else {
            Encoding::Raw
        };
        let value_ok = match encoding {
            Encoding::Digest => {
                value.len() == DIGEST_HEX
                    && value
                        .bytes()
                        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            }
            Encoding::Raw => !value.is_empty() && is_raw(value.as_bytes()),
        };
        if !name_ok || !value_ok {
            return None;
        }
        let limit_at = prefix.len() + 1;
        let value_at = key.len() - 1 - value.len();
        Some(Self {
            key: key.to_owned(),
            limit: limit_at..limit_at + name.len(),
            log_id: LogId::new(kind, encoding, value_at..key.len() - 1),
            plan_key: None,
        })
    }

    /// The limit this key belongs to.
    pub(crate) fn limit(&self) -> &str {
        &self.key[self.limit.clone()]
    }

    /// How this key's caller appears in logs (see [`LogId`]), to be shown
    /// with this key's text.
    pub(crate) fn log_id(&self) -> LogId {
        self.log_id
    }
}

/// How a key's caller appears in logs: IPs as they are, anything that may
/// be a secret (API keys, accounts) as a short digest — the same digest
/// whether the key holds the value raw or hashed, so one caller has one log
/// id. It records what the key was built from and where its value is in the
/// key's text, so nothing is parsed back and nothing copied: a few bytes
/// the request path keeps beside each bucket, shown with the bucket's key
/// ([`of`](Self::of)); the digest of a raw value is computed only when the
/// id is formatted (tracing formats a field only for an enabled event).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogId {
    kind: Kind,
    encoding: Encoding,
    /// Where the value as written (raw bytes, or the digest's hex) is in
    /// the key's text.
    at: u32,
    len: u8,
}

impl LogId {
    fn new(kind: Kind, encoding: Encoding, value: Range<usize>) -> Self {
        Self {
            kind,
            encoding,
            at: u32::try_from(value.start).unwrap_or(u32::MAX),
            len: value.len().min(MAX_RAW) as u8,
        }
    }

    /// This id, shown from `key`: the text of the key it was built with.
    pub(crate) fn of(self, key: &str) -> ShownId<'_> {
        ShownId { id: self, key }
    }
}

/// A [`LogId`] with its key's text, for a log field.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShownId<'k> {
    id: LogId,
    key: &'k str,
}

impl fmt::Display for ShownId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = &self.id;
        let at = id.at as usize;
        let text = self
            .key
            .as_bytes()
            .get(at..at + usize::from(id.len))
            .unwrap_or_default();
        // Raw values and digests are ASCII.
        fn as_str(b: &[u8]) -> &str {
            std::str::from_utf8(b).unwrap_or_default()
        }
        let tag = id.kind.tag();
        match (id.kind, id.encoding) {
            (Kind::Ip | Kind::Global, Encoding::Raw) => f.write_str(as_str(text)),
            // The first 6 bytes of the digest, as for a raw value below.
            (_, Encoding::Digest) => write!(f, "{tag}#{}", as_str(&text[..text.len().min(12)])),
            (_, Encoding::Raw) => {
                let mut s = String::with_capacity(tag.len() + 13);
                s.push_str(tag);
                s.push('#');
                push_hex(&mut s, &Sha256::digest(text)[..6]);
                f.write_str(&s)
            }
        }
    }
}

/// The secret header values (API keys) are hashed with before they become
/// part of a Redis key name (SipHash-2-4, 128 bits, keyed by the secret):
/// whoever reads Redis key names can neither read an API key nor confirm a
/// guessed one without it, and no client can aim at another's bucket
/// without finding a collision of a keyed 128-bit PRF.
///
/// Every instance of a fleet and the `fleetlimit` CLI must use the same
/// secret, or they count one caller in different buckets. Without a
/// configured secret a fixed one derived from the key prefix is used: key
/// names then hold no raw API key, but anyone who knows the prefix can
/// confirm a guess, so it is not secret.
#[derive(Clone)]
pub(crate) struct KeySecret {
    /// Derived once from the secret: one key for header values, one for
    /// custom values (so equal values of the two kinds cannot even be told
    /// equal in Redis).
    header: SipHasher24,
    custom: SipHasher24,
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
        // A secret of any length becomes a 128-bit key per kind, hashed
        // once here (SHA-256 of a domain and the secret) rather than per
        // request: SipHash is the PRF built for short inputs like API keys.
        let key = |domain: &[u8]| {
            let d = Sha256::new()
                .chain_update(domain)
                .chain_update(secret)
                .finalize();
            let mut k = [0; 16];
            k.copy_from_slice(&d[..16]);
            SipHasher24::new_with_key(&k)
        };
        Self {
            header: key(b"fleetlimit header key digest\0"),
            custom: key(b"fleetlimit custom key digest\0"),
            origin,
        }
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

    /// Appends the value's digest: 16 bytes in hex (the length of the
    /// plain SHA-256 digests of long values), under its kind's key.
    fn push_digest(&self, k: &mut String, kind: Kind, value: &[u8]) {
        let sip = if kind == Kind::Custom {
            &self.custom
        } else {
            &self.header
        };
        push_hex(k, &sip.hash(value).as_bytes());
    }

    /// Whether `other` names every header value's bucket as this one does
    /// (the same secret), for a reload, which cannot move buckets.
    pub(crate) fn same_keys_as(&self, other: &Self) -> bool {
        let (mut a, mut b) = (String::new(), String::new());
        self.push_digest(&mut a, Kind::Header, b"fleetlimit: same secret?");
        other.push_digest(&mut b, Kind::Header, b"fleetlimit: same secret?");
        a == b
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

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 0xf)] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl KeyMaterial<'_> {
        fn redis_key(&self, prefix: &str, limit: &str, secret: Option<&KeySecret>) -> String {
            self.store_key(&KeyHead::new(prefix, limit), secret, false)
                .key
        }
    }

    /// The log id of a key read back from Redis under prefix `rl`.
    fn log_id_string(key: &str) -> String {
        {
            let k = StoreKey::parse("rl", key).unwrap();
            k.log_id().of(&k.key).to_string()
        }
    }

    #[test]
    fn built_and_parsed_keys_agree() {
        let s = KeySecret::default_for("rl");
        let long = vec![b'a'; 100];
        let cases = [
            KeyMaterial::new(Kind::Account, b"abc"),
            KeyMaterial::new(Kind::Account, &long),
            KeyMaterial::new(Kind::Header, b"sk_live_X"),
            KeyMaterial::new(Kind::Global, b"all"),
            KeyMaterial::new(Kind::Account, b"x}{y"),
            KeyMaterial::ip("2001:db8::".parse().unwrap()),
            KeyMaterial::ip_account("1.2.3.4".into(), b"acct"),
        ];
        for m in cases {
            for secret in [Some(&s), None] {
                let built = m.store_key(&KeyHead::new("rl", "per-key"), secret, true);
                let parsed = StoreKey::parse("rl", &built.key).expect(&built.key);
                assert_eq!(parsed.key, built.key);
                assert_eq!(parsed.limit(), "per-key");
                assert_eq!(built.limit(), "per-key");
                assert_eq!(
                    parsed.log_id().of(&parsed.key).to_string(),
                    built.log_id().of(&built.key).to_string(),
                    "{}",
                    built.key
                );
            }
        }
        // The plan key: the value, for IP + account the account.
        let ia = KeyMaterial::ip_account("1.2.3.4".into(), b"acct");
        assert_eq!(
            ia.store_key(&KeyHead::new("rl", "l"), Some(&s), true)
                .plan_key
                .as_deref(),
            Some("acct")
        );
        let h = KeyMaterial::new(Kind::Header, b"sk_live_X");
        let k = h.store_key(&KeyHead::new("rl", "l"), Some(&s), true);
        assert_eq!(k.plan_key.as_deref(), Some("sk_live_X"));
        assert_eq!(
            h.store_key(&KeyHead::new("rl", "l"), Some(&s), false)
                .plan_key,
            None
        );
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
        // Custom keys too, under their own kind: a tenant named like an
        // API key is another bucket.
        let c = KeyMaterial::new(Kind::Custom, b"sk_live_SECRET123").redis_key("rl", "l", Some(&s));
        assert!(c.starts_with("rl:l:{c#") && c.len() == k.len(), "{c}");
        assert_ne!(c[8..], k[8..], "another digest, not only another tag");
        let parsed = StoreKey::parse("rl", &c).unwrap();
        assert_eq!(
            parsed.log_id().of(&parsed.key).to_string(),
            format!("c#{}", &c[8..20])
        );
        // Without a secret (the in-process store): the plain encoding.
        let local = KeyMaterial::new(Kind::Header, b"abc").redis_key("rl", "l", None);
        assert_eq!(local, "rl:l:{h:abc}");
    }
}
