//! What a plan resolver is: the trait a lookup implements, and its error.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// Why a [`PlanResolver`] could not answer (the database is down, say):
/// distinct from "no plan". The request gets the base numbers, the error
/// is logged (at most once a second), and the key is asked again after a
/// short while (a second, or the cache TTL if shorter).
///
/// Any error converts into it, so `?` works in a resolver.
///
/// ```
/// use fleetlimit::plan::PlanError;
///
/// fn parse(row: &str) -> Result<Option<String>, PlanError> {
///     let tier: u8 = row.parse()?; // a ParseIntError becomes a PlanError
///     Ok((tier > 0).then(|| "pro".to_owned()))
/// }
/// assert_eq!(parse("1").unwrap().as_deref(), Some("pro"));
/// assert!(parse("x").unwrap_err().to_string().contains("invalid digit"));
/// ```
pub struct PlanError(Box<dyn std::error::Error + Send + Sync>);

impl PlanError {
    /// An error with this message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self(message.to_string().into())
    }
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<E> for PlanError {
    fn from(e: E) -> Self {
        Self(e.into())
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Finds a caller's plan by key (API key, account id...). `Ok(None)`: the
/// limit's base numbers; `Err`: the lookup failed (base numbers too, logged,
/// asked again soon).
///
/// An `async fn` or an async closure taking the key as a `String` is a
/// resolver:
///
/// ```
/// # async fn f(cfg: fleetlimit::Config) -> Result<(), fleetlimit::BuildError> {
/// use fleetlimit::plan::PlanError;
/// use fleetlimit::RateLimitLayer;
///
/// async fn plan_of(key: String) -> Result<Option<String>, PlanError> {
///     // e.g. SELECT plan FROM api_keys WHERE key = $1
///     Ok(key.starts_with("pro_").then(|| "pro".to_owned()))
/// }
///
/// let layer = RateLimitLayer::new(cfg).plan_resolver(plan_of).await?;
/// # drop(layer); Ok(()) }
/// ```
///
/// or implement the trait on a type of your own:
///
/// ```
/// use std::future::Future;
/// use std::pin::Pin;
/// use fleetlimit::plan::{PlanError, PlanResolver};
///
/// struct FromDatabase;
///
/// impl PlanResolver for FromDatabase {
///     fn resolve<'a>(
///         &'a self,
///         key: &'a str,
///     ) -> Pin<Box<dyn Future<Output = Result<Option<String>, PlanError>> + Send + 'a>> {
///         Box::pin(async move { Ok(key.starts_with("pro_").then(|| "pro".to_owned())) })
///     }
/// }
/// ```
pub trait PlanResolver: Send + Sync + 'static {
    /// The plan of the caller with this key: `Ok(None)` for the base
    /// numbers, or why it could not say. Boxed, so that the layer holds
    /// any resolver.
    fn resolve<'a>(
        &'a self,
        key: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<String>, PlanError>> + Send + 'a>>;
}

/// An `async fn(String) -> Result<Option<String>, PlanError>`, or a closure
/// returning such a future.
impl<F, Fut> PlanResolver for F
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<String>, PlanError>> + Send + 'static,
{
    fn resolve<'a>(
        &'a self,
        key: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<String>, PlanError>> + Send + 'a>> {
        Box::pin(self(key.to_owned()))
    }
}
