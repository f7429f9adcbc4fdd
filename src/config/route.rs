//! A route's policy, as `[[routes]]` and `[default]` write it and as code
//! builds it; `validate/route.rs` checks it and compiles it into a
//! `route::Policy`.

use http::Method;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::de as text;
use super::limit::Mode;
use crate::route::FailurePolicy;
use crate::shed::Priority;

/// A route policy for [`ConfigBuilder::route`](super::ConfigBuilder::route).
///
/// ```
/// use http::Method;
/// use fleetlimit::configuration::{FailurePolicy, RouteConfig};
///
/// // POST /upload counts 10 units against both limits, all or nothing, and
/// // answers 503 when Redis cannot decide.
/// let upload = RouteConfig::new(["per-key", "per-ip"])
///     .methods([Method::POST])
///     .cost(10)
///     .on_redis_error(FailurePolicy::Closed);
/// # let _ = upload;
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[must_use]
pub struct RouteConfig {
    /// The route template (`[[routes]]`; empty for the default).
    pub(super) path: String,
    /// Only these methods (`None`: all).
    #[serde(default, deserialize_with = "text::methods")]
    pub(super) methods: Option<Vec<Method>>,
    pub(super) limits: Vec<String>,
    /// Units each request takes (`None`: 1).
    pub(super) cost: Option<u32>,
    /// `None`: `open`.
    pub(super) on_redis_error: Option<FailurePolicy>,
    #[serde(default)]
    pub(super) mode: Mode,
    #[serde(default)]
    pub(super) refund: bool,
    /// When its requests are shed (`[shedding]`).
    #[serde(default)]
    pub(super) priority: Priority,
}

impl RouteConfig {
    /// The limits (by name) every request of the route is counted against.
    pub fn new<I, S>(limits: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            path: String::new(),
            methods: None,
            limits: limits.into_iter().map(Into::into).collect(),
            cost: None,
            on_redis_error: None,
            mode: Mode::default(),
            refund: false,
            priority: Priority::default(),
        }
    }

    /// Units each request takes (default 1).
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = Some(cost);
        self
    }

    /// Only these methods (default: all).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// What to do when Redis fails (default `open`).
    pub fn on_redis_error(mut self, policy: FailurePolicy) -> Self {
        self.on_redis_error = Some(policy);
        self
    }

    /// Shadow mode for the whole route: count and log, never refuse.
    pub fn shadow(mut self) -> Self {
        self.mode = Mode::Shadow;
        self
    }

    /// Admitted requests carry a [`Refund`](crate::Refund) handle in their
    /// extensions, so the handler can give back units it did not need
    /// (`refund = true` in TOML). Off by default: the handle costs every
    /// request an allocation and an extension insert.
    pub fn refund(mut self) -> Self {
        self.refund = true;
        self
    }

    /// How early the route's requests are shed when the backend is
    /// saturated (`priority` in TOML; default [`Priority::Normal`]; only
    /// with [`ConfigBuilder::shedding`](super::ConfigBuilder::shedding)).
    /// A route with no limits and a priority is still shed.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }
}

/// `[default]`: a route's policy without a path or methods (the derived
/// [`RouteConfig`] takes both, as `[[routes]]` do). Unknown fields are
/// refused at their key, with the fields `[default]` takes.
pub(super) fn default_route<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<RouteConfig>, D::Error> {
    #[derive(Deserialize)]
    #[serde(field_identifier, rename_all = "snake_case")]
    enum Field {
        Limits,
        Cost,
        OnRedisError,
        Mode,
        Refund,
        Priority,
    }
    const FIELDS: &[&str] = &[
        "limits",
        "cost",
        "on_redis_error",
        "mode",
        "refund",
        "priority",
    ];
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = RouteConfig;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("struct RouteConfig")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RouteConfig, A::Error> {
            let mut r = RouteConfig::new(Vec::<String>::new());
            let mut limits = None;
            while let Some(field) = m.next_key()? {
                match field {
                    Field::Limits => limits = Some(m.next_value()?),
                    Field::Cost => r.cost = Some(m.next_value()?),
                    Field::OnRedisError => r.on_redis_error = Some(m.next_value()?),
                    Field::Mode => r.mode = m.next_value()?,
                    Field::Refund => r.refund = m.next_value()?,
                    Field::Priority => r.priority = m.next_value()?,
                }
            }
            r.limits = limits.ok_or_else(|| de::Error::missing_field("limits"))?;
            Ok(r)
        }
    }
    d.deserialize_struct("RouteConfig", FIELDS, V).map(Some)
}
