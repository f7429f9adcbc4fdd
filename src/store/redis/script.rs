//! The scripts and how a check runs them: `EVALSHA`, and `EVAL` after a
//! `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`), which also caches the
//! script again, inside the same deadline. Sent as a custom command because
//! fred 10.1's `with_options(..).evalsha(..)` drops the timeout and
//! fail-fast options. Also how fred's errors and the scripts' replies read
//! to the layer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};

use tokio::time::Instant;

use super::clock::RedisClock;
use super::cluster::{moved_to, NodePools};
use super::deadline::{backstop, giving_back, within, Health, Stalls, Stamp};
use crate::algorithm::LimitState;
use crate::algorithm::{LeanArgs, LEAN, LEASE, SCRIPT};
use crate::store::Outcome;
use crate::store::{Bucket, Check, StoreError};

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
    /// lua/decide.lua (every other shape).
    Decide,
    /// lua/token_bucket_lease.lua (a hot key's partial lease, `lease.rs`).
    Lease,
}

impl Which {
    /// Its `script` label (feature `metrics`).
    pub(crate) fn metric(self) -> crate::metrics::Script {
        match self {
            Self::Lean => crate::metrics::Script::Lean,
            Self::Decide => crate::metrics::Script::Decide,
            Self::Lease => crate::metrics::Script::Lease,
        }
    }
}

/// A script call's answer: fred's reply, when the call was sent, and the
/// clock of the node that ran it.
pub(crate) struct Answer {
    pub(crate) reply: Result<Value, StoreError>,
    pub(crate) sent: Instant,
    pub(crate) clock: Arc<RedisClock>,
}

impl Answer {
    /// The reply's answers, Redis's clock taken off and learnt ([`timed`]).
    pub(crate) fn items(self) -> Result<Vec<Value>, StoreError> {
        timed(self.reply?, self.sent, &self.clock)
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
    decide: Script,
    lease: Script,
    deadline: Duration,
    /// Slots that could not be given back (one WARN a second).
    pub(crate) release_log: crate::log_throttle::Throttle,
    /// Releases that failed, to be sent again (see `release.rs`).
    pub(crate) releases: super::release_queue::Releases,
    options: Options,
    /// Script calls, checks and call durations (feature `metrics`).
    pub(crate) metrics: crate::metrics::StoreMetrics,
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
            decide: Script::new(SCRIPT),
            lease: Script::new(LEASE),
            deadline,
            release_log: crate::log_throttle::Throttle::default(),
            releases: super::release_queue::Releases::new(),
            metrics: crate::metrics::StoreMetrics::new(),
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
            Which::Decide => &self.decide,
            Which::Lease => &self.lease,
        }
    }

    /// Sends script `which`: `args` come after the script's SHA or text (a
    /// placeholder at 0), and `args[at]` is the call's "not after" bound,
    /// `give_up` moved onto the clock of the node that runs it. `EVALSHA`,
    /// then `EVAL` after a `NOSCRIPT` (which caches the script again), and
    /// one `MOVED` followed. Owned, so an answer its caller stopped waiting
    /// for can still be settled (see [`settle`](Self::settle)); fred's own
    /// timeout ([`SETTLE_FOR`]) bounds it.
    pub(crate) fn send(
        self: &Arc<Self>,
        pool: &Pool,
        clock: Arc<RedisClock>,
        which: Which,
        mut args: Vec<Value>,
        at: usize,
        give_up: Instant,
    ) -> Sending {
        let (inner, pool) = (Arc::clone(self), pool.clone());
        Box::pin(async move {
            args[at] = not_after(&clock, give_up);
            let sent = Instant::now();
            let reply = inner.eval(&pool, which, &mut args).await;
            // The slot moved since fred's table was read: follow it once.
            let moved = match (&reply, &inner.nodes) {
                (Err(e), Some(nodes)) => moved_to(e).map(|(host, port)| nodes.pool(&host, port)),
                _ => None,
            };
            match moved {
                None => Answer {
                    reply: reply.map_err(map_err),
                    sent,
                    clock,
                },
                Some(Err(e)) => Answer {
                    reply: Err(e),
                    sent,
                    clock,
                },
                Some(Ok(node)) => {
                    args[at] = not_after(&node.clock, give_up);
                    let sent = Instant::now();
                    let reply = inner.eval(&node.pool, which, &mut args).await;
                    Answer {
                        reply: reply.map_err(map_err),
                        sent,
                        clock: node.clock,
                    }
                }
            }
        })
    }

    /// `EVALSHA`, and on `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`)
    /// `EVAL` of the same arguments; `EVAL` also caches the script again.
    async fn eval(
        &self,
        pool: &Pool,
        which: Which,
        args: &mut [Value],
    ) -> Result<Value, FredError> {
        let script = self.script(which);
        args[0] = script.sha.clone();
        let evalsha = CustomCommand::new_static("EVALSHA", ClusterHash::FirstKey, false);
        match pool
            .with_options(&self.options)
            .custom::<Value, Value>(evalsha, args.to_vec())
            .await
        {
            Err(e) if is_noscript(&e) => {
                args[0] = script.text.clone();
                let eval = CustomCommand::new_static("EVAL", ClusterHash::FirstKey, false);
                pool.with_options(&self.options)
                    .custom::<Value, Value>(eval, args.to_vec())
                    .await
            }
            other => other,
        }
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
        let n = check.buckets.len();
        let lean = match check.buckets.as_slice() {
            [b] => b.rule.lean_args(check.cost),
            _ => None,
        };
        let which = if lean.is_some() {
            Which::Lean
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
        args.push(Value::Null);
        if let Some(lean) = &lean {
            let (inc, burst) = lean.values();
            args.push(inc);
            args.push(burst);
        } else {
            args.push(Value::from(check.cost.to_string()));
            args.push(Value::from(check.slot.as_deref().unwrap_or("")));
            for b in &check.buckets {
                let (code, p1, p2) = b.rule.script_args();
                args.push(Value::from(code));
                args.push(Value::from(p1.to_string()));
                args.push(Value::from(p2.to_string()));
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
        let mut sending = self.send(pool, clock, which, args, at, stamp.give_up());
        let waited = within(&mut sending, self.deadline, stamp, &self.io, &self.stalls).await;
        self.health
            .saw(waited.as_ref().is_some_and(|a| a.reply.is_ok()));
        let Some(answer) = waited else {
            let (inner, pool, check) = (Arc::clone(self), pool.clone(), check.clone());
            self.settle(sending, move |answer| async move {
                let decided = decode(answer, &check, lean);
                inner.settled(&pool, &check, decided).await;
            });
            return Err(StoreError::Timeout);
        };
        decode(answer, check, lean)
    }

    /// [`run`](Self::run) boxed: a refund giving back a late answer's charge
    /// runs through `run`, whose late answers are settled the same way.
    fn run_boxed<'a>(
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
        decided: Result<Outcome, StoreError>,
    ) {
        use crate::metrics::Precision;
        let o = match decided {
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
        give_back(self, pool, check, &charged).await;
    }
    /// [`release`](Self::release) within the deadline; a failure is
    /// queued to be sent again (see `release.rs`).
    pub(crate) async fn release_bounded(self: &Arc<Self>, pool: &Pool, key: &str, slot: &str) {
        if let Err(e) = self.release_within(pool, key, slot).await {
            self.release_failed(pool, key, slot, &e);
        }
    }

    /// [`release`](Self::release), waited for within the deadline.
    pub(crate) async fn release_within(
        &self,
        pool: &Pool,
        key: &str,
        slot: &str,
    ) -> Result<(), StoreError> {
        let stamp = Stamp::new(self.deadline, &self.stalls);
        let mut release = std::pin::pin!(self.release(pool, key, slot));
        within(&mut release, self.deadline, stamp, &self.io, &self.stalls)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }

    /// `ZREM` of a concurrency slot from its key's set, on the primary
    /// owning the key on a cluster; fail-fast, one attempt, the caller
    /// bounds it by the deadline.
    pub(crate) async fn release(
        &self,
        pool: &Pool,
        key: &str,
        slot: &str,
    ) -> Result<(), StoreError> {
        let node;
        let pool = match &self.nodes {
            Some(nodes) => {
                node = nodes.for_slot(fred::util::redis_keyslot(key.as_bytes()))?;
                &node.pool
            }
            None => pool,
        };
        let zrem = CustomCommand::new_static("ZREM", ClusterHash::FirstKey, false);
        let _removed: Value = pool
            .with_options(&self.options)
            .custom(zrem, vec![Value::from(key), Value::from(slot)])
            .await
            .map_err(map_err)?;
        Ok(())
    }

    /// The per-check deadline.
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// A cluster cannot run one script over several slots, so the groups are
    /// decided in order; when a later group refuses or fails, or the caller
    /// stops waiting between groups, the earlier ones get their cost back.
    /// Between the charge and the refund another request may see those
    /// units spent: the price of limits that share no slot.
    pub(crate) async fn run_in_order(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        groups: &[Vec<usize>],
        stamp: Stamp,
    ) -> Result<Outcome, StoreError> {
        let mut limits: Vec<Option<LimitState>> = vec![None; check.buckets.len()];
        // Dropped before it is kept (a refusal, a failure, a caller that
        // stopped waiting), it gives back what was charged so far.
        let mut charged = GiveBack {
            inner: Arc::clone(self),
            pool: pool.clone(),
            check: check.clone(),
            charged: Vec::new(),
        };
        let mut allowed = true;
        for g in groups {
            let o = self.run(pool, &subset(check, g, check.cost), stamp).await?;
            for (k, &i) in g.iter().enumerate() {
                limits[i] = Some(o.limits[k]);
            }
            if !o.allowed {
                allowed = false;
                break;
            }
            charged.charged.extend(
                g.iter()
                    .copied()
                    .filter(|&i| limits[i].is_some_and(|l| l.enough)),
            );
        }
        if allowed {
            charged.charged.clear();
        }
        drop(charged);
        let limits = limits
            .into_iter()
            .zip(&check.buckets)
            .map(|(l, b)| {
                // Not reached: unknown, reported as untouched.
                l.unwrap_or(LimitState {
                    enough: true,
                    remaining: b.rule.capacity(),
                    wait: 0.0,
                    reset: 0.0,
                    capacity: b.rule.capacity(),
                })
            })
            .collect();
        Ok(Outcome { allowed, limits })
    }
}

/// The buckets `g` of `check`, at `cost`.
fn subset(check: &Check, g: &[usize], cost: f64) -> Check {
    Check {
        slot: check.slot.clone(),
        cost,
        buckets: g.iter().map(|&i| check.buckets[i].clone()).collect(),
    }
}

/// What the earlier groups of a cross-slot check charged, given back when
/// dropped: in a task of its own with its own deadline (the refusal is
/// decided, and a refund that ran past the check's deadline must not turn
/// it into a timeout the route's policy might answer with "admit"). A
/// failed refund leaves those units spent until they refill (an
/// over-count, the safe side). A concurrency slot goes back by id.
struct GiveBack {
    inner: Arc<Inner>,
    pool: Pool,
    check: Check,
    /// Indexes of the buckets charged.
    charged: Vec<usize>,
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if self.charged.is_empty() {
            return;
        }
        let (inner, pool) = (Arc::clone(&self.inner), self.pool.clone());
        let (check, charged) = (self.check.clone(), std::mem::take(&mut self.charged));
        let task = async move { give_back(&inner, &pool, &check, &charged).await };
        // On the caller's runtime when there is one; else on fred's own.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(task)),
            Err(_) => drop(self.inner.io.spawn(task)),
        }
    }
}

/// Gives back what `check` charged its buckets `charged` (indexes): a
/// refund per slot group, a concurrency slot by id. A failed refund leaves
/// those units spent until they refill (an over-count, the safe side).
pub(crate) async fn give_back(inner: &Arc<Inner>, pool: &Pool, check: &Check, charged: &[usize]) {
    if check.cost <= 0.0 {
        return;
    }
    let is_slot = |i: &usize| check.buckets[*i].rule.is_concurrency();
    if let Some(slot) = &check.slot {
        for &i in charged.iter().filter(|i| is_slot(i)) {
            inner
                .release_bounded(pool, &check.buckets[i].key, slot)
                .await;
        }
    }
    let back: Vec<usize> = charged.iter().copied().filter(|i| !is_slot(i)).collect();
    // One refund per slot (a cluster runs a script on one slot).
    let groups = if inner.nodes.is_some() {
        super::cluster::slot_groups(&subset(check, &back, 0.0))
            .into_iter()
            .map(|g| g.into_iter().map(|k| back[k]).collect())
            .collect()
    } else {
        vec![back]
    };
    for g in groups.into_iter().filter(|g: &Vec<usize>| !g.is_empty()) {
        let refund = subset(check, &g, -check.cost);
        let (refund, units) = (&refund, check.cost);
        let done = giving_back(|stamp| inner.run_boxed(pool, refund, stamp), &inner.health).await;
        if let Err(e) = done {
            tracing::warn!(
                target: "fleetlimit",
                error = %e,
                units,
                keys = refund.buckets.len(),
                "could not give back what a check charged after its caller stopped waiting \
                 (or before a refusal of another slot): it stays charged until it refills"
            );
        }
    }
}

/// [`Inner::run`]'s future, boxed where a call's settling calls `run`.
type BoxedRun<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome, StoreError>> + Send + 'a>>;

/// A check's answer, decoded: the lean script's (`lean`) or the general
/// script's.
fn decode(answer: Answer, check: &Check, lean: Option<LeanArgs>) -> Result<Outcome, StoreError> {
    let items = answer.items()?;
    let Some(lean) = lean else {
        return parse(items, &check.buckets, check.cost);
    };
    match <[Value; 1]>::try_from(items) {
        Ok([reply]) => {
            let b = &check.buckets[0];
            lean.parse(&reply, b.rule.capacity(), b.shadow)
        }
        Err(other) => Err(StoreError::Protocol(format!(
            "lean script: unexpected {other:?}"
        ))),
    }
}

fn is_noscript(e: &FredError) -> bool {
    e.details().starts_with("NOSCRIPT")
}

/// How a fred error looks to the layer.
pub(crate) fn map_err(e: FredError) -> StoreError {
    match e.kind() {
        ErrorKind::Timeout => StoreError::Timeout,
        ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Backpressure | ErrorKind::Routing => {
            StoreError::Unavailable(e.to_string())
        }
        ErrorKind::Protocol | ErrorKind::Parse => StoreError::Protocol(e.to_string()),
        // Raised by a command inside a script (Redis names the script's
        // line): one check's data or numbers, unless its code says Redis
        // is not serving (OOM, READONLY, ...).
        _ if e.details().contains("@user_script") => match command_error(e.details()) {
            StoreError::Script(_) => StoreError::Script(e.to_string()),
            _ => StoreError::Redis(e.to_string()),
        },
        _ => StoreError::Redis(e.to_string()),
    }
}

/// A command error met inside a script. `ERR` and `WRONGTYPE` (a value or
/// type Redis refuses) and Lua's own errors (no upper-case code) concern the
/// check; any other code (`OOM`, `READONLY`, `NOPERM`...) concerns Redis.
pub(crate) fn command_error(text: &str) -> StoreError {
    let code = text.split_whitespace().next().unwrap_or("");
    if code == "ERR" || code == "WRONGTYPE" || code.bytes().any(|b| !b.is_ascii_uppercase()) {
        StoreError::Script(text.to_owned())
    } else {
        StoreError::Redis(text.to_owned())
    }
}

/// The "not after" argument of a call whose caller stops waiting at
/// `give_up`: Redis's time no later than that moment, or "" (no bound)
/// while Redis's clock is not known.
pub(crate) fn not_after(clock: &RedisClock, give_up: Instant) -> Value {
    match clock.not_after(give_up) {
        Some(us) => Value::Integer(us),
        None => Value::from_static_str(""),
    }
}

/// A script's reply without its last item, Redis's clock when it ran
/// (learnt by `clock`, for a call handed at `sent`); `Late` when the script
/// ran after its bound and changed nothing.
pub(crate) fn timed(
    reply: Value,
    sent: Instant,
    clock: &RedisClock,
) -> Result<Vec<Value>, StoreError> {
    let bad = |why: String| StoreError::Protocol(format!("script: {why}"));
    let Value::Array(mut items) = reply else {
        return Err(bad(format!("not an array: {reply:?}")));
    };
    match items.pop() {
        // A time no Redis gives teaches the clock nothing (see clock.rs);
        // the answer stands.
        Some(Value::Integer(now)) => {
            clock.observe(sent, now);
        }
        other => return Err(bad(format!("no clock after the answers: {other:?}"))),
    }
    if let [Value::String(late)] = items.as_slice() {
        if &**late == "LATE" {
            return Err(StoreError::Late);
        }
    }
    Ok(items)
}

/// The decision script's reply: the verdict, then each limit's numbers
/// (integers, or text for a fraction), which its algorithm decodes
/// ([`Rule::script_answer`](crate::algorithm::Rule::script_answer)).
fn parse(items: Vec<Value>, buckets: &[Bucket], cost: f64) -> Result<Outcome, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("decision script: {why}"));
    let len: usize = buckets.iter().map(|b| b.rule.reply_len()).sum();
    if items.len() != 1 + len {
        return Err(bad("wrong length"));
    }
    let num = |v: &Value| -> Result<f64, StoreError> {
        match v {
            Value::Integer(x) => Ok(*x as f64),
            _ => v
                .as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .ok_or_else(|| bad("not a number")),
        }
    };
    let x: Vec<f64> = items.iter().map(num).collect::<Result<_, _>>()?;
    let allowed = x[0] == 1.0;
    let mut at = 1;
    let limits = buckets
        .iter()
        .map(|b| {
            let n = b.rule.reply_len();
            let state = b.rule.script_answer(cost, &x[at..at + n]);
            at += n;
            LimitState {
                // Within the slack, a bucket may pass its capacity by a hair.
                remaining: state.remaining.min(b.rule.capacity()),
                ..state
            }
        })
        .collect();
    Ok(Outcome { allowed, limits })
}

/// The lean script's arguments and answers as fred values; the arithmetic
/// is the token bucket's (`algorithm/token_bucket.rs`).
impl LeanArgs {
    /// The check's two arguments. Rust prints the shortest text that reads
    /// back as the same `f64`, so Lua's `tonumber` sees exactly these values.
    pub(crate) fn values(&self) -> (Value, Value) {
        let (inc, limit) = self.args();
        (Value::from(inc.to_string()), Value::from(limit.to_string()))
    }

    /// The script's answer for this check: 4 × (TAT − now) in µs after the
    /// charge when admitted, −1 − 4 × (TAT − now) when refused, or the error
    /// text of the command that failed at this check.
    pub(crate) fn parse(
        &self,
        reply: &Value,
        capacity: f64,
        shadow: bool,
    ) -> Result<Outcome, StoreError> {
        let x = match reply {
            Value::Integer(x) => *x,
            // The script stopped at this check: a command failed.
            Value::String(text) => return Err(command_error(text)),
            Value::Bytes(text) => return Err(command_error(&String::from_utf8_lossy(text))),
            _ => {
                return Err(StoreError::Protocol(format!(
                    "lean script: unexpected {reply:?}"
                )))
            }
        };
        let state = self.answer(x);
        let state = LimitState { capacity, ..state };
        Ok(Outcome {
            // A shadow limit never refuses; it was charged only if it had room.
            allowed: state.enough || shadow,
            limits: vec![state],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Rule;

    #[test]
    fn parses_integer_replies() {
        let bucket = |rule| Bucket {
            key: "k".into(),
            rule,
            shadow: false,
        };
        let buckets = [
            // 5 tokens at 10/s: refused at TAT − now = 460 ms (0.4 token).
            bucket(Rule::TokenBucket {
                capacity: 5.0,
                refill_per_sec: 10.0,
            }),
            // 3 counted of 3, 40 s left.
            bucket(Rule::FixedWindow {
                limit: 3.0,
                window: Duration::from_secs(60),
            }),
            // 2.5 s into a 10 s window: 10 in the previous one weigh 7.5.
            bucket(Rule::SlidingWindow {
                limit: 10.0,
                window: Duration::from_secs(10),
            }),
            // 2 of 2 slots, the oldest held 4 s of 30.
            bucket(Rule::Concurrency {
                max_in_flight: 2.0,
                max_hold: Duration::from_secs(30),
            }),
        ];
        let reply: Vec<Value> = vec![
            0.into(),
            (-1 - 4 * 460_000).into(),
            (-1 - 3).into(),
            40_000.into(),
            2_500.into(),
            "0".into(),
            10.into(),
            (-1 - 2).into(),
            29_000_000.into(),
            26_000_000.into(),
        ];
        let o = parse(reply.clone(), &buckets, 1.0).unwrap();
        assert!(!o.allowed);
        let [t, f, s, c] = o.limits[..] else {
            panic!("{o:?}")
        };
        assert!(!t.enough && (t.remaining - 0.4).abs() < 1e-9);
        assert!((t.wait - 0.06).abs() < 1e-9 && (t.reset - 0.46).abs() < 1e-9);
        assert!(!f.enough);
        assert_eq!((f.remaining, f.wait, f.reset), (0.0, 40.0, 40.0));
        assert!(s.enough && (s.remaining - 2.5).abs() < 1e-9);
        assert_eq!((s.wait, s.reset), (0.0, 7.5));
        assert!(!c.enough);
        assert_eq!((c.remaining, c.wait, c.reset), (0.0, 4.0, 29.0));
        assert!(parse(vec![1.into()], &buckets, 1.0).is_err());
        assert!(parse(Vec::new(), &buckets, 1.0).is_err());
    }

    #[tokio::test]
    async fn replies_carry_redis_clock_and_late_changes_nothing() {
        let clock = RedisClock::new();
        let now = 1_800_000_000_000_000_i64;
        let sent = Instant::now();
        // Answers, then the clock: the clock is learnt and taken off.
        let items = timed(Value::Array(vec![5.into(), now.into()]), sent, &clock).unwrap();
        assert_eq!(items, vec![Value::Integer(5)]);
        assert!(clock.not_after(Instant::now()).is_some());
        // Run after its bound.
        let late = Value::Array(vec!["LATE".into(), (now + 10).into()]);
        assert_eq!(timed(late, sent, &clock), Err(StoreError::Late));
        // No clock, or not an array: an answer no script gives.
        for bad in [
            Value::Null,
            Value::Array(vec![]),
            Value::Array(vec![5.into(), "x".into()]),
        ] {
            assert!(
                matches!(timed(bad, sent, &clock), Err(StoreError::Protocol(_))),
                "protocol error"
            );
        }
        // A clock no Redis reads: the answer stands, the clock learns nothing.
        let before = clock.not_after(sent);
        let items = timed(Value::Array(vec![7.into(), (-3).into()]), sent, &clock).unwrap();
        assert_eq!(items, vec![Value::Integer(7)]);
        assert_eq!(clock.not_after(sent), before);
    }

    #[test]
    fn lean_answers_decode_to_the_limit_state() {
        // 5 tokens at 10/s: 100 ms per token, a burst spans 500 ms.
        let rule = Rule::TokenBucket {
            capacity: 5.0,
            refill_per_sec: 10.0,
        };
        let args = rule.lean_args(1.0).unwrap();
        let (inc, burst) = args.values();
        assert_eq!(
            (inc.as_str().unwrap(), burst.as_str().unwrap()),
            ("100000".into(), "500000.5".into())
        );
        // Admitted, TAT 300 ms ahead after the charge: 2 tokens left.
        let o = args
            .parse(&Value::Integer(4 * 300_000), 5.0, false)
            .unwrap();
        assert!(o.allowed && o.limits[0].enough);
        assert_eq!(o.limits[0].remaining, 2.0);
        assert_eq!(o.limits[0].reset, 0.3);
        assert_eq!(o.limits[0].wait, 0.0);
        // Refused, TAT 450 ms ahead: half a token left, the next one in 50 ms.
        let o = args
            .parse(&Value::Integer(-1 - 4 * 450_000), 5.0, false)
            .unwrap();
        assert!(!o.allowed && !o.limits[0].enough);
        assert!((o.limits[0].remaining - 0.5).abs() < 1e-9);
        assert!((o.limits[0].wait - 0.05).abs() < 1e-9);
        assert_eq!(o.limits[0].reset, 0.45);
        // A shadow limit is reported as refused but lets the request through.
        let o = args.parse(&Value::Integer(-1), 5.0, true).unwrap();
        assert!(o.allowed && !o.limits[0].enough);
        assert!(args.parse(&Value::from("1 2 3 4"), 5.0, false).is_err());
        assert!(Rule::FixedWindow {
            limit: 1.0,
            window: Duration::from_secs(1)
        }
        .lean_args(1.0)
        .is_none());
    }

    #[test]
    fn noscript_and_error_kinds_map() {
        let e = FredError::new(
            ErrorKind::Unknown,
            "NOSCRIPT No matching script. Please use EVAL.",
        );
        assert!(is_noscript(&e));
        assert_eq!(
            map_err(FredError::new(ErrorKind::Timeout, "t")),
            StoreError::Timeout
        );
        assert!(matches!(
            map_err(FredError::new(ErrorKind::IO, "refused")),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(map_err(e), StoreError::Redis(_)));
    }

    #[test]
    fn script_errors_on_data_are_not_availability_errors() {
        // Raised out of a script (Redis 7's wording): the check's data.
        let wrongtype = FredError::new(
            ErrorKind::InvalidArgument,
            "WRONGTYPE Operation against a key holding the wrong kind of value \
             script: 3f2a, on @user_script:31.",
        );
        let e = map_err(wrongtype);
        assert!(matches!(e, StoreError::Script(_)), "{e:?}");
        assert!(!e.is_availability());
        let range = FredError::new(
            ErrorKind::Unknown,
            "ERR value is not an integer or out of range script: 3f2a, on @user_script:47.",
        );
        assert!(matches!(map_err(range), StoreError::Script(_)));
        // Redis not serving, even from inside a script.
        for text in [
            "OOM command not allowed when used memory > 'maxmemory'. script: 3f2a, on @user_script:44.",
            "READONLY You can't write against a read only replica. script: 3f2a, on @user_script:44.",
        ] {
            let e = map_err(FredError::new(ErrorKind::Unknown, text));
            assert!(matches!(e, StoreError::Redis(_)), "{e:?}");
            assert!(e.is_availability());
        }
        // Not from a script: as before.
        let e = map_err(FredError::new(
            ErrorKind::Unknown,
            "ERR unknown command 'EVALSHA'",
        ));
        assert!(matches!(e, StoreError::Redis(_)));
        // The lean script's per-check error texts (caught inside the script).
        assert!(matches!(
            command_error("user_script:30: attempt to compare nil with number"),
            StoreError::Script(_)
        ));
        assert!(matches!(
            command_error("WRONGTYPE Operation against a key holding the wrong kind of value"),
            StoreError::Script(_)
        ));
        assert!(matches!(
            command_error("OOM command not allowed when used memory > 'maxmemory'."),
            StoreError::Redis(_)
        ));
        let args = Rule::TokenBucket {
            capacity: 5.0,
            refill_per_sec: 10.0,
        }
        .lean_args(1.0)
        .unwrap();
        assert!(matches!(
            args.parse(
                &Value::from("ERR value is not an integer or out of range"),
                5.0,
                false
            ),
            Err(StoreError::Script(_))
        ));
        assert!(matches!(
            args.parse(&Value::Null, 5.0, false),
            Err(StoreError::Protocol(_))
        ));
    }
}
