//! What `explain` found, as data: the report `words.rs` writes out and
//! `--json` serialises. A leaf, so the finder and the writer both read it.

/// What `explain` found (`Admin::explain`); `Display` writes the report.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Explanation {
    /// The limit.
    #[serde(serialize_with = "crate::admin::shown::one")]
    pub(crate) limit: String,
    /// The caller as logs and records show it (a digest for API keys).
    #[serde(serialize_with = "crate::admin::shown::one")]
    pub(crate) key_id: String,
    /// The caller's plan: the last recorded one, else its assignment.
    #[serde(serialize_with = "crate::admin::shown::opt")]
    pub(crate) plan: Option<String>,
    /// The contract under that plan, in words.
    pub(crate) contract: String,
    /// The bucket now, in words: for a global limit, this region's bucket
    /// under its share ([`RegionShare`]).
    pub(crate) state: String,
    /// `region` (decided against the whole limit in each region) or
    /// `global` (one limit across `[regions]`, each region deciding against
    /// its share of it).
    pub(crate) scope: &'static str,
    /// For a global limit: this region's share of the caller's key, and
    /// what it can still admit under it (`None` for a regional limit).
    pub(crate) global: Option<RegionShare>,
    /// Whether the limit records decisions at all.
    pub(crate) recording: bool,
    /// The range read, in ms since the epoch (Redis's clock).
    pub(crate) from_ms: u64,
    /// See `from_ms`.
    pub(crate) to_ms: u64,
    /// The caller's recorded decisions in the range, oldest first.
    pub(crate) decisions: Vec<RecordedDecision>,
}

/// A global limit's share of one key in this region, as `explain` reads
/// it from the region's Redis (`<prefix>:regions:{<limit>}:share`, field:
/// the key), and the key's bucket under that share: the limit's contract
/// is the global policy, this is what this region decides the key against.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct RegionShare {
    /// This instance's region (`[regions] this`).
    #[serde(serialize_with = "crate::admin::shown::one")]
    pub(crate) region: String,
    /// Every region of `[regions.exchange]`, in the configuration's order.
    #[serde(serialize_with = "crate::admin::shown::all")]
    pub(crate) regions: Vec<String>,
    /// This region's share, in parts per million of the limit, as the
    /// limiter reads it.
    pub(crate) ppm: u32,
    /// The same, in percent.
    pub(crate) percent: f64,
    /// Where the share comes from: `split` (none stored: the configured
    /// split), `stored`, `unclaimed` (none stored since this region's
    /// Redis restarted: 0 until the exchange claims it), or `unreadable`
    /// (a stored value that is not a whole number of parts per million:
    /// the limiter reads it as 0).
    pub(crate) source: &'static str,
    /// The stored value, as stored (`None`: none).
    #[serde(serialize_with = "crate::admin::shown::opt")]
    pub(crate) stored: Option<String>,
    /// Per other region: the key's quota in flight to and from it, and
    /// the last exchange with it.
    pub(crate) flights: Vec<crate::admin::quota::Flight>,
    /// The share's burst: the limit's capacity × the share.
    pub(crate) capacity: f64,
    /// The share's refill, per second: the limit's refill × the share.
    pub(crate) refill_per_sec: f64,
    /// Whole requests this region can still admit for the key now.
    pub(crate) remaining: u64,
    /// When the share's bucket is full again, in ms from now (0: full).
    pub(crate) full_in_ms: u64,
}

/// One recorded decision.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct RecordedDecision {
    /// When it was written (Redis's clock), ms since the epoch.
    pub(crate) at_ms: u64,
    /// Admitted (else refused: 429, or 503 for `via = "closed"`).
    pub(crate) allowed: bool,
    /// Whole tokens left after it (`None`: not known).
    pub(crate) remaining: Option<u64>,
    /// This limit had room for the request: a refusal with `Some(true)`
    /// was another limit's (`None`: not known).
    pub(crate) enough: Option<bool>,
    /// Decided without Redis (`local`, `open`, `closed`).
    pub(crate) degraded: bool,
    /// How: `redis`, `remembered`, `lease`, `local`, `open`, `closed`.
    #[serde(serialize_with = "crate::admin::shown::one")]
    pub(crate) via: String,
    /// The caller's plan then.
    #[serde(serialize_with = "crate::admin::shown::opt")]
    pub(crate) plan: Option<String>,
    /// The instance that decided.
    #[serde(serialize_with = "crate::admin::shown::one")]
    pub(crate) instance: String,
}
