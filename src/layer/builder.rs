//! [`RateLimitLayerBuilder`]: a layer with its store, plans, costs, keys,
//! load signal and refusal hook, and the tasks it starts beside requests.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;

use crate::config::Config;
use crate::pipeline::{Extras, Limiter};
use crate::plan::PlanResolver;
use crate::reload::{Live, OwnRedis};
#[cfg(feature = "redis")]
use crate::store::RedisStore;
use crate::store::{MemoryStore, Store, StoreError};
use crate::{BuildError, RateLimitLayer};
use crate::{KeyAnswer, RequestRef};

impl RateLimitLayer {
    /// The layer on the store the configuration names: Redis when it has a
    /// `[redis]` section (or came from [`Config::try_with_redis_url`]),
    /// otherwise in-process buckets. Await it, or first give it a plan
    /// resolver, computed costs, custom keys, a load signal or a refusal
    /// hook ([`RateLimitLayerBuilder`]).
    ///
    /// A Redis that is down at start-up is not an error: the pool keeps
    /// reconnecting and routes use their failure policy meanwhile. Only an
    /// unusable Redis URL is ([`BuildError::Store`]), and a limit keyed by a
    /// custom key no [`key_fn`](RateLimitLayerBuilder::key_fn) was given
    /// for ([`BuildError::Config`], checked before anything connects).
    ///
    /// ```
    /// use fleetlimit::{Config, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cfg = Config::builder().build()?;
    /// let layer = RateLimitLayer::new(cfg.clone()).await?;
    /// let with_plans = RateLimitLayer::new(cfg)
    ///     .plan_resolver(|_key: String| async { Ok(Some("pro".to_owned())) })
    ///     .await?;
    /// # let _ = (layer, with_plans);
    /// # Ok(()) }
    /// ```
    // The builder awaits into the layer: `RateLimitLayer::new(cfg).await`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(config: Config) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            config,
            store: None,
            extras: Extras::none(),
        }
    }

    /// The layer on a store of your own, or on a [`MemoryStore`] or
    /// [`RedisStore`](crate::store::RedisStore) you made, whatever the
    /// configuration says of Redis: await it, after the builder's other
    /// settings if any. Its failures follow each route's `on_redis_error`
    /// policy. It starts no task beside requests (no reset listener:
    /// `fleetlimit reset` reaches its refused-key cache only at each
    /// refusal's `Retry-After`; build with [`new`](Self::new) for
    /// fleet-wide resets), so it needs no runtime of tokio's: a
    /// [`MemoryStore`] given here is the in-process store, decided on
    /// directly.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use fleetlimit::store::MemoryStore;
    /// use fleetlimit::{Config, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cfg = Config::builder().build()?;
    /// let layer = RateLimitLayer::with_store(cfg, Arc::new(MemoryStore::new(10_000))).await?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn with_store(config: Config, store: Arc<dyn Store>) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            store: Some(store),
            ..Self::new(config)
        }
    }
}

/// A [`RateLimitLayer`] being made ([`RateLimitLayer::new`],
/// [`RateLimitLayer::with_store`]), with a plan resolver, computed costs,
/// custom keys, a load signal or a refusal hook: await it for the layer.
#[must_use = "await it for the layer"]
pub struct RateLimitLayerBuilder {
    config: Config,
    store: Option<Arc<dyn Store>>,
    extras: Extras,
}

impl std::fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("config", &self.config)
            .field("store", &self.store)
            .field("resolver", &self.extras.resolver.is_some())
            .field("cost_fns", &self.extras.cost_fns.keys().collect::<Vec<_>>())
            .field("key_fns", &self.extras.key_fns.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl RateLimitLayerBuilder {
    /// Look callers' plans up with `resolver` (cached per key for the
    /// configuration's `[plan_cache] ttl`).
    pub fn plan_resolver(mut self, resolver: impl PlanResolver) -> Self {
        self.extras.resolver = Some(Arc::new(resolver));
        self
    }

    /// Compute the cost of requests to the route `path` (an axum route
    /// template, as in the configuration) instead of its fixed `cost`. A
    /// cost above a limit's capacity is answered `413` without charging
    /// anything; a cost of 0 counts as 1 (a request is never free, or a
    /// client could pick a cost that is never refused).
    ///
    /// ```
    /// # use fleetlimit::{Config, RateLimitLayer};
    /// # async fn f(cfg: Config) -> Result<(), fleetlimit::BuildError> {
    /// let layer = RateLimitLayer::new(cfg)
    ///     .cost_fn("/search", |req| {
    ///         // ?pages=N costs N.
    ///         req.uri()
    ///             .query()
    ///             .and_then(|q| q.strip_prefix("pages="))
    ///             .and_then(|n| n.parse().ok())
    ///             .unwrap_or(1)
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn cost_fn<F>(mut self, path: impl Into<String>, f: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> u32 + Send + Sync + 'static,
    {
        self.extras.cost_fns.insert(path.into(), Arc::new(f));
        self
    }

    /// Compute the key of limits keyed `custom:<name>` with `f` (a closure
    /// or a function; an extractor type of your own is called from a
    /// closure): from the request's method, URI, headers and extensions, the key, [`KeyAnswer::Missing`]
    /// (the limit's `on_missing`: `401`, or counted by client IP) or
    /// [`KeyAnswer::Invalid`] (`400`).
    ///
    /// It runs synchronously in the layer's `call`, before anything is
    /// counted: keep it quick, and let an authentication layer in front of
    /// the limiter do the slow work (verify the token, put its claims in
    /// the extensions). If it panics, the request is answered `503`
    /// ([`RefusalReason::KeyUnavailable`](crate::RefusalReason::KeyUnavailable)),
    /// never admitted uncounted, and an ERROR line is logged (one a second
    /// per limit). Registering a name twice keeps the last; a name no
    /// limit uses is logged (WARN) when the layer is built.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use fleetlimit::{Config, KeyAnswer, RateLimitLayer, RequestRef};
    /// use tower::ServiceExt;
    ///
    /// /// What the authentication layer found in the caller's token.
    /// #[derive(Clone)]
    /// struct Tenant(String);
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cfg = Config::from_toml_str(r#"
    ///     [limits.per-tenant]
    ///     key = "custom:tenant"
    ///     capacity = 1
    ///     refill = "1/min"
    ///
    ///     [default]
    ///     limits = ["per-tenant"]
    /// "#)?;
    /// let layer = RateLimitLayer::new(cfg)
    ///     .key_fn("tenant", |req: &RequestRef<'_>| -> KeyAnswer<'_> {
    ///         req.extensions().get::<Tenant>().map(|t| t.0.clone()).into()
    ///     })
    ///     .await?;
    /// let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
    ///
    /// let req = |tenant: &str| {
    ///     let mut r = http::Request::get("/").body(axum::body::Body::empty()).unwrap();
    ///     r.extensions_mut().insert(Tenant(tenant.into()));
    ///     r
    /// };
    /// assert_eq!(app.clone().oneshot(req("acme")).await?.status(), 200);
    /// assert_eq!(app.clone().oneshot(req("acme")).await?.status(), 429);
    /// assert_eq!(app.clone().oneshot(req("globex")).await?.status(), 200);
    /// // No tenant: `on_missing = "reject"`, the default.
    /// let anonymous = http::Request::get("/").body(axum::body::Body::empty())?;
    /// assert_eq!(app.clone().oneshot(anonymous).await?.status(), 401);
    /// # Ok(()) }
    /// ```
    pub fn key_fn<F>(mut self, name: impl Into<String>, f: F) -> Self
    where
        F: for<'r> Fn(&RequestRef<'r>) -> KeyAnswer<'r> + Send + Sync + 'static,
    {
        let name: String = name.into();
        self.extras.key_fns.insert(name.into(), Arc::new(f));
        self
    }

    /// The application's load signal for `[shedding]`: the load of the
    /// resource the layer protects, as the application sees it (for
    /// example the search cluster's queue depth ÷ what it can hold), `1.0`
    /// saturated, `0.0` idle, above `1.0` overloaded. It is read on every
    /// request, so it must be cheap: an atomic the application updates
    /// elsewhere, not a network call. A value that is not a number counts
    /// as `0.0`. Without `[shedding]` in the configuration it is never
    /// read.
    ///
    /// ```
    /// # use std::sync::atomic::{AtomicU32, Ordering};
    /// # use std::sync::Arc;
    /// # use fleetlimit::shed::SheddingConfig;
    /// # use fleetlimit::{Config, RateLimitLayer};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cfg = Config::builder().shedding(SheddingConfig::default()).build()?;
    /// // Kept up to date by the code that calls the search cluster.
    /// let queued = Arc::new(AtomicU32::new(0));
    /// let seen = Arc::clone(&queued);
    /// let layer = RateLimitLayer::new(cfg)
    ///     .load_signal(move || f64::from(seen.load(Ordering::Relaxed)) / 500.0)
    ///     .await?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn load_signal(mut self, signal: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.extras.load_signal = Some(Arc::new(signal));
        self
    }

    /// Reshapes every refusal the layer answers (status, headers, body):
    /// a limit exceeded (`429`), the limiter unavailable (`503`, `closed`),
    /// a missing key (`401`), a cost too high (`413`), no client address
    /// (`503`), a shed request (`503`), and a
    /// [`ChallengeRequired`](crate::ChallengeRequired) a handler answers.
    /// The hook gets a [`Refusal`](crate::Refusal): the
    /// [`reason`](crate::RefusalReason), limit, `Retry-After`, remaining and
    /// the default answer (an RFC 9457 problem, see docs/configuration.md),
    /// and returns the response to send.
    ///
    /// It runs on the request path, synchronously: keep it quick. If it
    /// panics, the default answer is sent (and an ERROR line logged, one a
    /// second); what it returns is sent as it is.
    ///
    /// ```
    /// use fleetlimit::{Config, RateLimitLayer, RefusalReason};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::new(Config::builder().build()?)
    ///     .on_refusal(|r| {
    ///         let status = r.default_response().status();
    ///         match r.reason() {
    ///             RefusalReason::LimitExceeded => http::Response::builder()
    ///                 .status(status)
    ///                 .header("retry-after", r.retry_after().map_or(1, |d| d.as_secs()))
    ///                 .body(bytes::Bytes::from_static(b"slow down"))
    ///                 .unwrap_or_default(),
    ///             _ => r.into_default_response(),
    ///         }
    ///     })
    ///     .await?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn on_refusal<F>(mut self, hook: F) -> Self
    where
        F: Fn(crate::Refusal) -> http::Response<bytes::Bytes> + Send + Sync + 'static,
    {
        self.extras.on_refusal = Some(Arc::new(hook));
        self
    }

    /// Connects (see [`RateLimitLayer::new`]) and builds the layer. On
    /// the configuration's Redis it also starts the reset listener (a connection of its own,
    /// subscribed to `<key_prefix>:reset`, so `fleetlimit reset` reaches
    /// this instance's refused-key cache and leases), and with
    /// `[fleet] discover = true` the heartbeat task, and with `[shedding]`
    /// the task reading the fleet-wide shedding signal
    /// (`<key_prefix>:shed:{fleet}`); all end by themselves when the last
    /// clone of the layer is dropped.
    ///
    /// Fails with [`BuildError::Config`] when a limit is keyed by a custom
    /// key no [`key_fn`](Self::key_fn) was registered for (checked before
    /// anything connects), with [`BuildError::Store`] on an unusable Redis
    /// URL.
    async fn build(self) -> Result<RateLimitLayer, BuildError> {
        let cfg = self.config;
        check(&cfg, &self.extras)?;
        cfg.check_global_store(self.store.is_none() && cfg.redis.is_some())?;
        #[cfg(feature = "redis")]
        let mut redis = None;
        let store: Arc<dyn Store> = match (self.store, &cfg.redis) {
            (Some(s), _) => s,
            #[cfg(feature = "redis")]
            (None, Some(_)) => {
                let s = RedisStore::connect(&cfg).await?;
                redis = Some(s.clone());
                Arc::new(s)
            }
            // Never reached: a configuration on Redis is refused in this
            // build when it is made (`build`, `try_with_redis_url`).
            #[cfg(not(feature = "redis"))]
            (None, Some(r)) => {
                let why = crate::config::redis_url::check(&r.url, false).err();
                return Err(StoreError::Unavailable(why.unwrap_or_default()).into());
            }
            (None, None) => Arc::new(MemoryStore::new(cfg.memory_max_keys)),
        };
        // One id per layer: the fleet's heartbeat and the decision records
        // name the instance alike.
        #[cfg(feature = "redis")]
        let own = redis.map(|store| OwnRedis {
            store,
            instance: crate::fleet::instance_id().into(),
        });
        #[cfg(not(feature = "redis"))]
        let own: Option<OwnRedis> = None;
        let live = assemble(&cfg, store, self.extras, own.clone());
        #[cfg(feature = "redis")]
        if let Some(own) = own {
            start_redis_tasks(&cfg, own, &live).await?;
        }
        Ok(RateLimitLayer { live })
    }
}

impl IntoFuture for RateLimitLayerBuilder {
    type Output = Result<RateLimitLayer, BuildError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.build())
    }
}

/// What a layer's configuration is checked against what it was given,
/// before anything connects: a limit keyed by a custom key needs its
/// extractor.
fn check(cfg: &Config, extras: &Extras) -> Result<(), BuildError> {
    cfg.check_custom_keys(|name| extras.key_fns.contains_key(name))?;
    for name in extras.key_fns.keys() {
        if !cfg.uses_custom_key(name) {
            tracing::warn!(
                target: "fleetlimit",
                name = &**name,
                "a key extractor is registered under {name:?}, but no limit is keyed by \"custom:{name}\""
            );
        }
    }
    Ok(())
}

/// The layer's running state on `store`, for a configuration [`check`]ed
/// with the same `extras`: the in-process store (however it was given)
/// decides at once; a reload is held to the same check.
pub(super) fn assemble(
    cfg: &Config,
    store: Arc<dyn Store>,
    mut extras: Extras,
    own: Option<OwnRedis>,
) -> Arc<Live> {
    extras.recorder = crate::reload::start_recorder(cfg, own.as_ref());
    let limiter = Limiter::new(cfg, store, extras);
    Live::new(limiter, cfg.clone(), own)
}

/// The tasks a layer on the configuration's Redis runs beside requests: the
/// reset listener (reaching whichever configuration runs), the fleet-wide
/// shedding signal and the heartbeat.
#[cfg(feature = "redis")]
async fn start_redis_tasks(
    cfg: &Config,
    own: OwnRedis,
    live: &Arc<Live>,
) -> Result<(), StoreError> {
    let core = live.core();
    if let Some(r) = &cfg.redis {
        let ready =
            crate::reset::start(r, &cfg.key_prefix, Arc::downgrade(live), core.stop_signal())?;
        // With Redis up, resets reach this instance once it is built;
        // with Redis down, the listener subscribes when it can (and
        // forgets what it remembered then).
        if fred::interfaces::ClientLike::is_connected(own.store.pool()) {
            let _ = tokio::time::timeout(r.connect_timeout, ready).await;
        }
    }
    if let Some(shedder) = core.shedder() {
        shedder.start_fleet_signal(own.store.pool().clone(), cfg.shed_fleet_key());
    }
    if let Some(rt) = &core.regions {
        let pool = own.store.pool().clone();
        let (prefix, instance) = (Arc::clone(&cfg.key_prefix), Arc::clone(&own.instance));
        crate::region::start(rt, pool, prefix, instance).await;
    }
    if let Some(hb) = cfg.heartbeat {
        let key = cfg.heartbeat_key();
        let fleet = Arc::downgrade(core.fleet_handle());
        crate::fleet::start(own.store, fleet, key, hb, own.instance);
    }
    Ok(())
}
