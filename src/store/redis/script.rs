//! The scripts and how a check runs them: `EVALSHA`, and `EVAL` after a
//! `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`), which also caches the
//! script again, inside the same deadline. Sent as a custom command because
//! fred 10.1's `with_options(..).evalsha(..)` drops the timeout and
//! fail-fast options. Also how fred's errors and the scripts' replies read
//! to the layer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fred::clients::Pool;
use fred::error::Error as FredError;
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};

use tokio::time::Instant;

use super::clock::RedisClock;
use super::cluster::{NodePools, moved_to};
use super::deadline::{Health, Stalls, Stamp, backstop, within};
use super::reply::{
    Answer, WindowEnds, bound, decode, decode_charged, is_noscript, lua_number, map_err,
};
use crate::algorithm::{LEAN, LEAN_CROSS, LEASE, LeanArgs, ONE, SCRIPT};
use crate::store::Outcome;
use crate::store::{Check, StoreError};

/// A script by SHA, and its text for `EVAL` after a `NOSCRIPT`.
pub(crate) struct Script {
    pub(crate) sha: Value,
    pub(crate) text: Value,
}

impl Script {
    fn new(text: &'static str) -> Self {
        Self {
            sha: Value::from(fred::util::sha1_hash(text)),
            text: Value::from(text),
        }
    }
}

/// How long fred waits for a script's answer (its own timeout): the caller
/// waits within its deadline, and an answer it stopped waiting for is
/// still awaited this long, to be settled ([`Inner::settle`]).
pub(crate) const SETTLE_FOR: Duration = Duration::from_secs(10);

/// Most answers awaited after their callers stopped waiting, per store.
const MAX_SETTLING: usize = 1_024;

/// Which script a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    /// lua/token_bucket_lean.lua (single token buckets, coalesced).
    Lean,
    /// The same, flagged `allow-cross-slot-keys`: a Cluster's call across
    /// the slots of one primary, its keys in its arguments (`per_node.rs`).
    LeanCross,
    /// lua/token_bucket_one.lua (a call of one single-token-bucket check;
    /// its numbers packed, see [`LeanArgs::packed`]).
    One,
    /// lua/decide.lua (every other shape).
    Decide,
    /// lua/token_bucket_lease.lua (a hot key's partial lease, `lease.rs`).
    Lease,
}

impl Which {
    /// Its `script` label (feature `metrics`).
    pub(crate) fn metric(self) -> crate::metrics::Script {
        match self {
            // The lean decision either way: one label, one script family.
            Self::Lean | Self::LeanCross | Self::One => crate::metrics::Script::Lean,
            Self::Decide => crate::metrics::Script::Decide,
            Self::Lease => crate::metrics::Script::Lease,
        }
    }
}

/// A script call handed to fred: owned, so it can outlive its caller.
pub(crate) type Sending = std::pin::Pin<Box<dyn std::future::Future<Output = Answer> + Send>>;

/// One answer being settled ([`Inner::settle`]); let go when dropped.
struct Settling(Arc<AtomicUsize>);

impl Settling {
    fn enter(count: &Arc<AtomicUsize>) -> Option<Self> {
        let n = count.fetch_add(1, Ordering::AcqRel);
        let this = Self(Arc::clone(count));
        (n < MAX_SETTLING).then_some(this)
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What every call of a store shares: the scripts, the deadline and the
/// per-call options, where fred runs, and a cluster's pools per primary.
pub(crate) struct Inner {
    /// fred's runtime (see [`IoThread`](super::deadline::IoThread)).
    pub(crate) io: tokio::runtime::Handle,
    pub(crate) stalls: Stalls,
    /// Whether calls answer now (give-backs wait while they do not).
    pub(crate) health: Health,
    /// On a cluster: a pool per primary, which checks go through.
    pub(crate) nodes: Option<NodePools>,
    /// Redis's clock (standalone and Sentinel; a cluster's primaries have
    /// one each, in `nodes`).
    pub(crate) clock: Arc<RedisClock>,
    /// Answers being settled ([`settle`](Self::settle)).
    settling: Arc<AtomicUsize>,
    pub(crate) lean: Script,
    lean_cross: Script,
    one: Script,
    decide: Script,
    lease: Script,
    pub(super) deadline: Duration,
    /// Slots that could not be given back (one WARN a second).
    pub(crate) release_log: crate::log_throttle::Throttle,
    /// Releases that failed, to be sent again (see `release.rs`).
    pub(crate) releases: super::release_queue::Releases,
    pub(super) options: Options,
    /// Script calls, checks and call durations (feature `metrics`).
    pub(crate) metrics: crate::metrics::StoreMetrics,
    /// On a Cluster: whether calls across slots are refused, and the calls
    /// that met a slot on the move (`per_node.rs`).
    pub(crate) cross: super::redirects::CrossSlot,
}

impl Inner {
    pub(crate) fn new(
        io: tokio::runtime::Handle,
        nodes: Option<NodePools>,
        deadline: Duration,
    ) -> Self {
        Self {
            io,
            stalls: Stalls::new(),
            health: Health::new(),
            nodes,
            clock: Arc::new(RedisClock::new()),
            settling: Arc::new(AtomicUsize::new(0)),
            lean: Script::new(LEAN),
            lean_cross: Script::new(LEAN_CROSS),
            one: Script::new(ONE),
            decide: Script::new(SCRIPT),
            lease: Script::new(LEASE),
            deadline,
            release_log: crate::log_throttle::Throttle::default(),
            releases: super::release_queue::Releases::new(),
            metrics: crate::metrics::StoreMetrics::new(),
            cross: super::redirects::CrossSlot::new(),
            options: Options {
                // `within` bounds the caller's wait; this, how long an
                // answer is awaited to be settled.
                timeout: Some(SETTLE_FOR.max(backstop(deadline))),
                fail_fast: true,
                max_attempts: Some(1),
                max_redirections: Some(3),
                ..Options::default()
            },
        }
    }

    fn script(&self, which: Which) -> &Script {
        match which {
            Which::Lean => &self.lean,
            Which::LeanCross => &self.lean_cross,
            Which::One => &self.one,
            Which::Decide => &self.decide,
            Which::Lease => &self.lease,
        }
    }

    /// Sends script `which`: `args` come after the script's SHA or text (a
    /// placeholder at 0), and `args[at]` is the call's "not after" bound,
    /// `give_up` moved onto the clock of the node that runs it. `EVALSHA`,
    /// then `EVAL` after a `NOSCRIPT` (which caches the script again), and
    /// one `MOVED` or `ASK` followed (a slot that moved, or is moving, since
    /// fred's table was read). Owned, so an answer its caller stopped waiting
    /// for can still be settled (see [`settle`](Self::settle)); fred's own
    /// timeout ([`SETTLE_FOR`]) bounds it.
    pub(crate) fn send(
        self: &Arc<Self>,
        pool: &Pool,
        clock: Arc<RedisClock>,
        which: Which,
        args: Vec<Value>,
        at: usize,
        stamp: Stamp,
    ) -> Sending {
        self.send_to(pool, clock, which, args, at, stamp, false)
    }

    /// [`send`](Self::send), preceded by `ASKING` when `asking` (a slot
    /// being imported by that node).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_to(
        self: &Arc<Self>,
        pool: &Pool,
        clock: Arc<RedisClock>,
        which: Which,
        mut args: Vec<Value>,
        at: usize,
        stamp: Stamp,
        asking: bool,
    ) -> Sending {
        let (inner, pool) = (Arc::clone(self), pool.clone());
        Box::pin(async move {
            let (give_up, until) = (stamp.give_up(), stamp.until);
            args[at] = bound(which == Which::One, &args[at], &clock, give_up, until);
            let sent = Instant::now();
            let reply = inner.eval(&pool, which, &mut args, asking).await;
            let redirect = match (&reply, &inner.nodes) {
                (Err(e), Some(nodes)) => redirected(e).map(|(ask, host, port)| {
                    if !ask {
                        // fred's table is behind: read it again (its
                        // checks would all meet this MOVED otherwise).
                        nodes.resync();
                    }
                    (ask, nodes.pool(&host, port))
                }),
                _ => None,
            };
            match redirect {
                None => Answer {
                    reply: reply.map_err(map_err),
                    sent,
                    clock,
                    redirected: None,
                },
                Some((ask, Err(e))) => Answer {
                    reply: Err(e),
                    sent,
                    clock,
                    redirected: Some(if ask { "ASK" } else { "MOVED" }),
                },
                Some((ask, Ok(node))) => {
                    args[at] = bound(which == Which::One, &args[at], &node.clock, give_up, until);
                    let sent = Instant::now();
                    let reply = inner.eval(&node.pool, which, &mut args, ask).await;
                    Answer {
                        reply: reply.map_err(map_err),
                        sent,
                        clock: node.clock,
                        redirected: Some(if ask { "ASK" } else { "MOVED" }),
                    }
                }
            }
        })
    }

    /// `EVALSHA`, and on `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`)
    /// `EVAL` of the same arguments; `EVAL` also caches the script again.
    /// Each after `ASKING` when `asking`.
    async fn eval(
        &self,
        pool: &Pool,
        which: Which,
        args: &mut [Value],
        asking: bool,
    ) -> Result<Value, FredError> {
        let script = self.script(which);
        args[0] = script.sha.clone();
        let evalsha = CustomCommand::new_static("EVALSHA", ClusterHash::FirstKey, false);
        match self.command(pool, evalsha, args, asking).await {
            Err(e) if is_noscript(&e) => {
                args[0] = script.text.clone();
                let eval = CustomCommand::new_static("EVAL", ClusterHash::FirstKey, false);
                self.command(pool, eval, args, asking).await
            }
            other => other,
        }
    }

    /// One command with the store's options; after `ASKING` on the same
    /// connection when `asking` (a pipeline: nothing comes between them).
    async fn command(
        &self,
        pool: &Pool,
        command: CustomCommand,
        args: &[Value],
        asking: bool,
    ) -> Result<Value, FredError> {
        if !asking {
            // The pool picks a connected client (fred's `prefer_connected`).
            return pool
                .with_options(&self.options)
                .custom::<Value, Value>(command, args.to_vec())
                .await;
        }
        let client = pool.next_connected().with_options(&self.options);
        let pipe = fred::clients::Pipeline::from(client);
        let ask = CustomCommand::new_static("ASKING", ClusterHash::FirstKey, false);
        pipe.custom::<Value, Value>(ask, Vec::new()).await?;
        pipe.custom::<Value, Value>(command, args.to_vec()).await?;
        let mut replies = pipe.try_all::<Value>().await;
        replies
            .pop()
            .unwrap_or_else(|| Err(FredError::new(fred::error::ErrorKind::Protocol, "no reply")))
    }

    /// An answer its caller stopped waiting for (`sending`), still awaited
    /// in a task of its own until fred's timeout ([`SETTLE_FOR`]), then
    /// handed to `then`: a check it says was charged is given back there,
    /// so a check given up on changes nothing, also when Redis ran it in
    /// time but its answer came late (a freeze between the script and its
    /// reply). At most [`MAX_SETTLING`] at once; beyond, the answer is not
    /// awaited and its outcome stays unknown (counted).
    pub(crate) fn settle<F>(
        self: &Arc<Self>,
        sending: Sending,
        then: impl FnOnce(Answer) -> F + Send + 'static,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let Some(slot) = Settling::enter(&self.settling) else {
            self.metrics
                .precision(crate::metrics::Precision::Unknown, 1);
            return;
        };
        let task = async move {
            let answer = sending.await;
            then(answer).await;
            drop(slot);
        };
        // On the caller's runtime when there is one; else on fred's own.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(task)),
            Err(_) => drop(self.io.spawn(task)),
        }
    }

    /// EVALSHA of one all-or-nothing check; EVAL when Redis lost the script.
    /// A single token bucket (the common case) runs the lean script. The
    /// call carries `stamp`'s give-up moment on Redis's clock: run later,
    /// it changes nothing and answers `Late`. Waits within the deadline
    /// ([`within`]); an answer that comes later is settled.
    pub(crate) async fn run(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        stamp: Stamp,
    ) -> Result<Outcome, StoreError> {
        let (answer, lean) = self.answer(pool, check, stamp).await?;
        decode(answer, check, lean)
    }

    /// [`run`](Self::run), with the end of each window charged (for a
    /// give-back of it, see `cross_slot.rs`).
    pub(crate) async fn run_charged(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        stamp: Stamp,
    ) -> Result<(Outcome, WindowEnds), StoreError> {
        let (answer, lean) = self.answer(pool, check, stamp).await?;
        decode_charged(answer, check, lean)
    }

    /// The answer of [`run`](Self::run)'s call, to decode.
    async fn answer(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        stamp: Stamp,
    ) -> Result<(Answer, Option<LeanArgs>), StoreError> {
        let n = check.buckets.len();
        let lean = match check.buckets.as_slice() {
            [b] => b.rule.lean_args(check.cost),
            _ => None,
        };
        let which = if lean.is_some() {
            Which::One
        } else {
            Which::Decide
        };
        // EVALSHA sha numkeys key.. not_after, then the lean script's
        // cost×per burst×per, or the general script's cost slot
        // (algorithm p1 p2 shadow)..
        let mut args: Vec<Value> = Vec::with_capacity(5 + 5 * n);
        args.push(Value::Null);
        args.push(Value::Integer(n as i64));
        args.extend(check.buckets.iter().map(|b| Value::from(b.key.as_str())));
        let at = args.len();
        if let Some(lean) = &lean {
            // The bound goes into the packed numbers when sent.
            args.push(lean.packed());
        } else {
            args.push(Value::Null);
            args.push(Value::from(lua_number(check.cost)));
            args.push(Value::from(check.slot.as_deref().unwrap_or("")));
            for b in &check.buckets {
                let (code, p1, p2) = b.rule.script_args();
                args.push(Value::from(code));
                args.push(Value::from(lua_number(p1)));
                args.push(Value::from(lua_number(p2)));
                args.push(Value::from(if b.shadow { "1" } else { "0" }));
            }
        }
        // On a cluster, the primary owning the slot (all the check's keys
        // share it, see `slot_groups`), with its own clock.
        let node;
        let (pool, clock) = match &self.nodes {
            Some(nodes) => {
                let slot = check
                    .buckets
                    .first()
                    .map_or(0, |b| fred::util::redis_keyslot(b.key.as_bytes()));
                node = nodes.for_slot(slot)?;
                (&node.pool, Arc::clone(&node.clock))
            }
            None => (pool, Arc::clone(&self.clock)),
        };
        self.metrics.sent(which.metric(), 1);
        let mut sending = self.send(pool, clock, which, args, at, stamp);
        let waited = within(&mut sending, self.deadline, stamp, &self.io, &self.stalls).await;
        self.health
            .saw(waited.as_ref().is_some_and(|a| a.reply.is_ok()));
        let Some(answer) = waited else {
            let (inner, pool, check) = (Arc::clone(self), pool.clone(), check.clone());
            self.settle(sending, move |answer| async move {
                let decided = decode_charged(answer, &check, lean);
                inner.settled(&pool, &check, decided).await;
            });
            return Err(StoreError::Timeout);
        };
        Ok((answer, lean))
    }

    /// [`run`](Self::run) boxed: a refund giving back a late answer's charge
    /// runs through `run`, whose late answers are settled the same way.
    pub(super) fn run_boxed<'a>(
        self: &'a Arc<Self>,
        pool: &'a Pool,
        check: &'a Check,
        stamp: Stamp,
    ) -> BoxedRun<'a> {
        Box::pin(self.run(pool, check, stamp))
    }

    /// A check's answer that came after its caller stopped waiting: what it
    /// charged is given back (a refund, or its concurrency slot by id).
    async fn settled(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        decided: Result<(Outcome, WindowEnds), StoreError>,
    ) {
        use crate::metrics::Precision;
        let (o, ends) = match decided {
            Ok(o) => o,
            Err(StoreError::Late) => return self.metrics.precision(Precision::LateDiscarded, 1),
            Err(_) => return self.metrics.precision(Precision::Unknown, 1),
        };
        let charged: Vec<usize> = (0..check.buckets.len())
            .filter(|&i| o.allowed && o.limits[i].enough)
            .collect();
        if charged.is_empty() || check.cost <= 0.0 {
            return self.metrics.precision(Precision::SettledUncharged, 1);
        }
        self.metrics.precision(Precision::SettledCharged, 1);
        self.give_back(pool, check, &charged, &ends).await;
    }
    /// The per-check deadline.
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }
}

/// [`Inner::run`]'s future, boxed where a call's settling calls `run`.
type BoxedRun<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome, StoreError>> + Send + 'a>>;

/// The node a `MOVED` or `ASK` error names, and whether it was `ASK`.
fn redirected(e: &FredError) -> Option<(bool, String, u16)> {
    if let Some((host, port)) = moved_to(e) {
        return Some((false, host, port));
    }
    let (host, port) = super::cluster::asked_to(e)?;
    Some((true, host, port))
}
