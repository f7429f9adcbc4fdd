//! What a plan resolver is: the trait a lookup implements.

use std::future::Future;
use std::pin::Pin;

/// Why a [`PlanResolver`] could not answer: any error, boxed (so `?`
/// works in a resolver).
pub(crate) type PlanError = Box<dyn std::error::Error + Send + Sync>;

/// Finds a caller's plan by key (API key, account id...). `Ok(None)`: the
/// limit's base numbers; `Err` (any error, boxed: `?` works): the lookup
/// failed (the database is down, say), which is not "no plan". The request
/// gets the base numbers too, the error is logged (at most once a second),
/// and the key is asked again after a short while (a second, or the cache
/// TTL if shorter).
///
/// An `async fn` or an async closure taking the key as a `String` is a
/// resolver:
///
/// ```
/// # async fn f(cfg: fleetlimit::Config) -> Result<(), fleetlimit::BuildError> {
/// use fleetlimit::RateLimitLayer;
///
/// async fn plan_of(key: String) -> Result<Option<String>, Box<dyn std::error::Error + Send + Sync>> {
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
/// use fleetlimit::plan::PlanResolver;
///
/// type PlanError = Box<dyn std::error::Error + Send + Sync>;
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
    #[allow(clippy::type_complexity)]
    fn resolve<'a>(
        &'a self,
        key: &'a str,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<Option<String>, Box<dyn std::error::Error + Send + Sync>>>
                + Send
                + 'a,
        >,
    >;
}

/// An `async fn(String) -> Result<Option<String>, Box<dyn Error + Send + Sync>>`,
/// or a closure
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
