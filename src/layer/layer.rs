use std::collections::HashMap;
use std::sync::Arc;

use tower_layer::Layer;

use super::RateLimit;
use crate::config::Config;
use crate::limiter::{Extras, Limiter};
use crate::plan::PlanResolver;
use crate::store::{MemoryStore, RedisStore, Store, StoreError};
use crate::RequestRef;

/// Applies [`RateLimit`] to a service. Cheap to clone: every clone shares
/// one store and one set of local buckets.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    limiter: Arc<Limiter>,
}

impl RateLimitLayer {
    /// Builds the layer on the store the configuration names: Redis when it
    /// has a `[redis]` section (or [`Config::with_redis_url`]), otherwise
    /// in-process buckets.
    ///
    /// A Redis that is down at start-up is not an error: the pool keeps
    /// reconnecting and routes use their failure policy meanwhile. Only an
    /// unusable Redis URL is.
    pub async fn new(config: Config) -> Result<Self, StoreError> {
        Self::builder(config).build().await
    }

    /// A builder for a plan resolver, computed costs or a store of your own.
    pub fn builder(config: Config) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            config,
            store: None,
            extras: Extras {
                resolver: None,
                cost_fns: HashMap::new(),
            },
        }
    }

    /// The layer on in-process buckets only, whatever the configuration
    /// says of Redis. Needs no runtime.
    #[must_use]
    pub fn in_memory(config: &Config) -> Self {
        let store = Arc::new(MemoryStore::new(config.memory_max_keys));
        Self {
            limiter: Arc::new(Limiter::new(config, store, true, Extras::none())),
        }
    }

    /// The layer on a store of your own (or a [`RedisStore`] you built).
    /// Its failures follow each route's `on_redis_error` policy.
    #[must_use]
    pub fn with_store(config: &Config, store: Arc<dyn Store>) -> Self {
        Self {
            limiter: Arc::new(Limiter::new(config, store, false, Extras::none())),
        }
    }

    /// The store deciding requests.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn Store> {
        self.limiter.store()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.limiter))
    }
}

/// Builds a [`RateLimitLayer`] with a plan resolver, computed costs or a
/// store of your own.
#[must_use]
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
            .finish()
    }
}

impl RateLimitLayerBuilder {
    /// Decide on this store instead of the one the configuration names.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Look callers' plans up with `resolver` (cached per key for the
    /// configuration's `[plan_cache] ttl`).
    pub fn plan_resolver(mut self, resolver: impl PlanResolver) -> Self {
        self.extras.resolver = Some(Arc::new(resolver));
        self
    }

    /// Compute the cost of requests to the route `path` (an axum route
    /// template, as in the configuration) instead of its fixed `cost`. A
    /// cost above a limit's capacity is answered `413` without charging
    /// anything.
    ///
    /// ```
    /// # use fleetlimit::{Config, RateLimitLayer};
    /// # async fn f(cfg: Config) -> Result<(), fleetlimit::store::StoreError> {
    /// let layer = RateLimitLayer::builder(cfg)
    ///     .cost_fn("/search", |req| {
    ///         // ?pages=N costs N.
    ///         req.uri()
    ///             .query()
    ///             .and_then(|q| q.strip_prefix("pages="))
    ///             .and_then(|n| n.parse().ok())
    ///             .unwrap_or(1)
    ///     })
    ///     .build()
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

    /// Connects (see [`RateLimitLayer::new`]) and builds the layer.
    pub async fn build(self) -> Result<RateLimitLayer, StoreError> {
        let cfg = self.config;
        let (store, local): (Arc<dyn Store>, bool) = match (self.store, &cfg.redis) {
            (Some(s), _) => (s, false),
            (None, Some(r)) => (
                Arc::new(
                    RedisStore::connect(&r.url, r.pool_size, cfg.deadline, r.connect_timeout)
                        .await?,
                ),
                false,
            ),
            (None, None) => (Arc::new(MemoryStore::new(cfg.memory_max_keys)), true),
        };
        Ok(RateLimitLayer {
            limiter: Arc::new(Limiter::new(&cfg, store, local, self.extras)),
        })
    }
}
