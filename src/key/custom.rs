//! Keys the application computes: a limit keyed `custom:<name>` asks the
//! function registered under that name
//! ([`RateLimitLayerBuilder::key_fn`](crate::layer::RateLimitLayerBuilder::key_fn)),
//! which answers a [`KeyAnswer`].

use std::borrow::Cow;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::extracted::Extracted;
use super::store_key::{KeyMaterial, Kind};
use crate::RequestRef;

/// What a [key function](crate::layer::RateLimitLayerBuilder::key_fn) found
/// in a request.
///
/// Build it from the key itself (`&str`, `String`, `&[u8]`, `Vec<u8>`,
/// `Cow<str>`) with `.into()`, or from an `Option` of one, `None` being
/// [`Missing`](Self::Missing):
///
/// ```
/// use fleetlimit::{KeyAnswer, RequestRef};
///
/// #[derive(Clone)]
/// struct Tenant(String);
///
/// // The tenant an auth layer put in the extensions; none: `on_missing`.
/// fn tenant<'r>(req: &RequestRef<'r>) -> KeyAnswer<'r> {
///     req.extensions().get::<Tenant>().map(|t| t.0.as_str()).into()
/// }
///
/// let mut req = http::Request::new(());
/// assert!(matches!(tenant(&RequestRef::from(&req)), KeyAnswer::Missing));
/// req.extensions_mut().insert(Tenant("acme".into()));
/// assert!(matches!(tenant(&RequestRef::from(&req)), KeyAnswer::Key(k) if &*k == b"acme"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub enum KeyAnswer<'r> {
    /// Count the request under this key. Any bytes, of any length: like
    /// every key value it is stored as a digest when long or unprintable,
    /// and always as a keyed digest in Redis. An empty key is
    /// [`Missing`](Self::Missing), so "no key" never becomes a shared
    /// bucket.
    Key(Cow<'r, [u8]>),
    /// The request carries no key: the limit's `on_missing` applies, as for
    /// a missing header (`401`, or counted by client IP).
    Missing,
    /// The request carries a key that is not valid (a malformed tenant id):
    /// `400 Bad Request`, problem type `urn:fleetlimit:invalid-key`
    /// ([`RefusalReason::InvalidKey`](crate::RefusalReason::InvalidKey)).
    Invalid,
}

impl KeyAnswer<'_> {
    /// The same answer, owning its key.
    #[must_use]
    pub fn into_owned(self) -> KeyAnswer<'static> {
        match self {
            Self::Key(k) => KeyAnswer::Key(Cow::Owned(k.into_owned())),
            Self::Missing => KeyAnswer::Missing,
            Self::Invalid => KeyAnswer::Invalid,
        }
    }
}

impl fmt::Debug for KeyAnswer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // A key may be a secret (a tenant's token): its length only.
            Self::Key(k) => write!(f, "Key(<{} bytes>)", k.len()),
            Self::Missing => f.write_str("Missing"),
            Self::Invalid => f.write_str("Invalid"),
        }
    }
}

impl<'r> From<&'r str> for KeyAnswer<'r> {
    fn from(k: &'r str) -> Self {
        Self::Key(Cow::Borrowed(k.as_bytes()))
    }
}

impl From<String> for KeyAnswer<'_> {
    fn from(k: String) -> Self {
        Self::Key(Cow::Owned(k.into_bytes()))
    }
}

impl<'r> From<&'r String> for KeyAnswer<'r> {
    fn from(k: &'r String) -> Self {
        Self::from(k.as_str())
    }
}

impl<'r> From<Cow<'r, str>> for KeyAnswer<'r> {
    fn from(k: Cow<'r, str>) -> Self {
        match k {
            Cow::Borrowed(k) => Self::from(k),
            Cow::Owned(k) => Self::from(k),
        }
    }
}

impl<'r> From<&'r [u8]> for KeyAnswer<'r> {
    fn from(k: &'r [u8]) -> Self {
        Self::Key(Cow::Borrowed(k))
    }
}

impl From<Vec<u8>> for KeyAnswer<'_> {
    fn from(k: Vec<u8>) -> Self {
        Self::Key(Cow::Owned(k))
    }
}

impl<'r> From<Cow<'r, [u8]>> for KeyAnswer<'r> {
    fn from(k: Cow<'r, [u8]>) -> Self {
        Self::Key(k)
    }
}

/// `None` is [`KeyAnswer::Missing`].
impl<'r, T: Into<KeyAnswer<'r>>> From<Option<T>> for KeyAnswer<'r> {
    fn from(k: Option<T>) -> Self {
        k.map_or(Self::Missing, Into::into)
    }
}

/// Finds the key of a limit keyed `custom:<name>` in a request: a closure
/// registered with
/// [`key_fn`](crate::layer::RateLimitLayerBuilder::key_fn) (whose
/// documentation says how it must behave). A trait so the layer holds one
/// `Arc<dyn KeyExtractor>` per name.
pub(crate) trait KeyExtractor: Send + Sync + 'static {
    /// The request's key for the limits keyed by this extractor's name.
    fn extract<'r>(&self, req: &RequestRef<'r>) -> KeyAnswer<'r>;
}

/// A closure or function from the request to its key.
impl<F> KeyExtractor for F
where
    F: for<'r> Fn(&RequestRef<'r>) -> KeyAnswer<'r> + Send + Sync + 'static,
{
    fn extract<'r>(&self, req: &RequestRef<'r>) -> KeyAnswer<'r> {
        self(req)
    }
}

/// One layer's extractors by name: a handful at most, looked up by a scan
/// (cheaper than hashing the name per request).
#[derive(Clone, Default)]
pub(crate) struct CustomKeys(Box<[Named]>);

/// An extractor and the name limits ask for it by.
type Named = (Arc<str>, Arc<dyn KeyExtractor>);

impl CustomKeys {
    pub(crate) fn new(by_name: impl IntoIterator<Item = Named>) -> Self {
        Self(by_name.into_iter().collect())
    }

    pub(crate) fn get(&self, name: &str) -> Option<&dyn KeyExtractor> {
        self.0.iter().find(|(n, _)| &**n == name).map(|(_, e)| &**e)
    }

    /// The key of `name` in `req`. An extractor that panics is
    /// [`Extracted::Failed`]: refused, never counted under some default. (A
    /// configuration names only registered extractors: the layer checks it
    /// when built and at every reload; one missing all the same fails the
    /// same way.)
    pub(crate) fn extract<'r>(&self, name: &str, req: &RequestRef<'r>) -> Extracted<'r> {
        let Some(extractor) = self.get(name) else {
            return Extracted::Failed;
        };
        // The request is only read, and nothing of ours is left half
        // changed by an unwinding extractor.
        match catch_unwind(AssertUnwindSafe(|| extractor.extract(req))) {
            Ok(KeyAnswer::Key(k)) if k.is_empty() => Extracted::Missing,
            Ok(KeyAnswer::Key(k)) => Extracted::Found(KeyMaterial::from_cow(Kind::Custom, k)),
            Ok(KeyAnswer::Missing) => Extracted::Missing,
            Ok(KeyAnswer::Invalid) => Extracted::Invalid,
            Err(_) => Extracted::Failed,
        }
    }
}

impl fmt::Debug for CustomKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(n, _)| n))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant<'r>(req: &RequestRef<'r>) -> KeyAnswer<'r> {
        match req.headers().get("x-tenant") {
            Some(v) if v == "bad" => KeyAnswer::Invalid,
            Some(v) if v == "boom" => panic!("extractor bug"),
            v => v.map(|v| v.as_bytes()).into(),
        }
    }

    fn keys() -> CustomKeys {
        CustomKeys::new([(
            Arc::from("tenant"),
            Arc::new(tenant) as Arc<dyn KeyExtractor>,
        )])
    }

    fn answer(tenant: Option<&str>, name: &str) -> String {
        let mut req = http::Request::new(());
        if let Some(t) = tenant {
            req.headers_mut().insert("x-tenant", t.parse().unwrap());
        }
        format!("{:?}", keys().extract(name, &RequestRef::from(&req)))
    }

    #[test]
    fn answers_become_key_material_or_refusals() {
        let a = answer(Some("acme"), "tenant");
        assert!(a.starts_with("Found(") && a.contains("Custom"), "{a}");
        assert_eq!(answer(None, "tenant"), "Missing");
        assert_eq!(answer(Some(""), "tenant"), "Missing");
        assert_eq!(answer(Some("bad"), "tenant"), "Invalid");
        assert_eq!(answer(Some("boom"), "tenant"), "Failed");
        assert_eq!(answer(Some("acme"), "other"), "Failed");
    }

    // The removed `KeyExtractor` example: the tenant is the host's first
    // label; no host is missing, a host without one is invalid.
    #[test]
    fn a_subdomain_extractor_finds_the_tenant() {
        struct Subdomain;
        impl KeyExtractor for Subdomain {
            fn extract<'r>(&self, req: &RequestRef<'r>) -> KeyAnswer<'r> {
                let Some(host) = req.headers().get("host") else {
                    return KeyAnswer::Missing;
                };
                match host.to_str().ok().and_then(|h| h.split_once('.')) {
                    Some((tenant, _)) if !tenant.is_empty() => tenant.into(),
                    _ => KeyAnswer::Invalid,
                }
            }
        }
        let answer = |host: Option<&str>| {
            let mut req = http::Request::new(());
            if let Some(h) = host {
                req.headers_mut().insert("host", h.parse().unwrap());
            }
            Subdomain.extract(&RequestRef::from(&req)).into_owned()
        };
        assert_eq!(
            answer(Some("acme.api.example.com")),
            KeyAnswer::from("acme")
        );
        assert_eq!(answer(None), KeyAnswer::Missing);
        assert_eq!(answer(Some("localhost")), KeyAnswer::Invalid);
        assert_eq!(answer(Some(".example.com")), KeyAnswer::Invalid);
    }
}
