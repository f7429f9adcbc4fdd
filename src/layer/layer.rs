use std::sync::Arc;

use tower_layer::Layer;

use super::RateLimit;
use crate::config::Config;
use crate::limiter::Limiter;
use crate::store::{MemoryStore, RedisStore, Store, StoreError};

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
        match &config.redis {
            Some(r) => {
                let store =
                    RedisStore::connect(&r.url, r.pool_size, config.deadline, r.connect_timeout)
                        .await?;
                Ok(Self::with_store(&config, Arc::new(store)))
            }
            None => Ok(Self::in_memory(&config)),
        }
    }

    /// The layer on in-process buckets only, whatever the configuration
    /// says of Redis. Needs no runtime.
    #[must_use]
    pub fn in_memory(config: &Config) -> Self {
        let store = Arc::new(MemoryStore::new(config.memory_max_keys));
        Self {
            limiter: Arc::new(Limiter::new(config, store, true)),
        }
    }

    /// The layer on a store of your own (or a [`RedisStore`] you built).
    /// Its failures follow each route's `on_redis_error` policy.
    #[must_use]
    pub fn with_store(config: &Config, store: Arc<dyn Store>) -> Self {
        Self {
            limiter: Arc::new(Limiter::new(config, store, false)),
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
