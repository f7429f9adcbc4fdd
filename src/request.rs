//! A borrowed view of a request, for user callbacks that must not depend on
//! the body type.

use http::{Extensions, HeaderMap, Method, Request, Uri};

/// The parts of a request a [cost function](crate::layer::RateLimitLayerBuilder::cost_fn)
/// or a [key function](crate::layer::RateLimitLayerBuilder::key_fn) can look at (`RequestRef::from(&request)`
/// makes one, e.g. to test them).
///
/// ```
/// use fleetlimit::RequestRef;
///
/// // A cost function: a bulk request costs one unit per item it names.
/// fn cost(req: &RequestRef<'_>) -> u32 {
///     req.headers()
///         .get("x-items")
///         .and_then(|v| v.to_str().ok()?.parse().ok())
///         .unwrap_or(1)
/// }
/// # let _ = cost;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RequestRef<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a, B> From<&'a Request<B>> for RequestRef<'a> {
    fn from(req: &'a Request<B>) -> Self {
        Self::new(req)
    }
}

impl<'a> RequestRef<'a> {
    pub(crate) fn new<B>(req: &'a Request<B>) -> Self {
        Self {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// The method.
    #[must_use]
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The URI (path and query).
    #[must_use]
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The headers.
    #[must_use]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (e.g. what an auth layer inserted).
    #[must_use]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}
