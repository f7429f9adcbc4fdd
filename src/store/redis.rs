//! The Redis store: a pooled `fred` client running the scripts in `lua/`.
//!
//! A request's check is one `EVALSHA` (single token-bucket checks in flight
//! together share one, see `batch.rs`; a cluster runs one per hash slot the
//! request's keys touch), with a hard deadline, `fail_fast` (a
//! disconnected pool answers at once instead of queueing) and a single
//! attempt. The deadline runs from when the call is handed to fred, not
//! from when the check was queued in this process (see [`within`]). It is sent as a custom command because fred 10.1's
//! `with_options(..).evalsha(..)` drops the timeout and fail-fast options.
//! `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`) is answered by `EVAL`, which
//! also caches the script again, inside the same deadline.
//!
//! A command that timed out may still run on Redis: the caller treats a
//! timeout as "outcome unknown", never as "not charged".

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, LuaInterface};
use fred::types::config::{Config as FredConfig, Options, ReconnectPolicy, Server};
use fred::types::{Builder, ClusterHash, CustomCommand, Value};
use tokio::sync::broadcast::{error::RecvError, Receiver as BroadcastReceiver};
use tokio::time::Instant;

use super::batch::Batcher;
use super::nodes::{moved_to, NodePools};
use super::{Check, Outcome, Store, StoreError, StoreFuture};
use crate::algorithm::{LimitState, Rule};
use crate::config::{redact_url, redis_url, RedisSettings};

/// The lean script: single-token-bucket checks (most requests), one or
/// several per call (see `batch.rs`).
pub(crate) const LEAN: &str = include_str!("../../lua/token_bucket_lean.lua");

/// The decision script, run by `EVALSHA`: each algorithm's functions, then
/// the driver that decides every limit of a request at once.
pub(crate) const SCRIPT: &str = concat!(
    include_str!("../../lua/token_bucket.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/decide.lua"),
);

/// Rate-limit state in Redis (standalone, Sentinel or Cluster).
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    /// Where fred's connection tasks run (see [`IoThread`]).
    _io: Arc<IoThread>,
    inner: Arc<Inner>,
    /// Coalesces single-bucket checks (standalone and Sentinel only).
    batcher: Option<Batcher>,
}

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

pub(crate) struct Inner {
    /// fred's runtime (see [`IoThread`]).
    pub(crate) io: tokio::runtime::Handle,
    pub(crate) stalls: Stalls,
    /// On a cluster: a pool per primary, which checks go through.
    nodes: Option<NodePools>,
    pub(crate) lean: Script,
    decide: Script,
    deadline: Duration,
    options: Options,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("pool_size", &self.pool.size())
            .field("deadline", &self.inner.deadline)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Builds a pool for `url` and starts connecting. Waits up to
    /// `connect_timeout` for the first connection and loads the script; if
    /// Redis is not there yet, or refuses the credentials, that is logged,
    /// not an error: the pool keeps reconnecting in the background and
    /// routes use their failure policy meanwhile. Errors only for a
    /// malformed URL or pool size (and `rediss://` in a build without TLS).
    pub async fn connect(
        url: &str,
        pool_size: usize,
        deadline: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let settings = RedisSettings {
            url: url.to_owned(),
            connect_timeout,
            ..RedisSettings::default()
        };
        Self::connect_with(&settings, pool_size, deadline).await
    }

    /// [`connect`](Self::connect) with every Redis setting (TLS CA file).
    pub(crate) async fn connect_with(
        settings: &RedisSettings,
        pool_size: usize,
        deadline: Duration,
    ) -> Result<Self, StoreError> {
        let (store, started) = Self::open(settings, pool_size, deadline).await?;
        let url = redact_url(&settings.url);
        match started {
            Ok(()) => {}
            Err(Startup::Auth(e)) => {
                tracing::warn!(target: "fleetlimit", %url, error = %e, "Redis refused the credentials at start (authentication failed); routes use their failure policy until it accepts them")
            }
            Err(Startup::Unreachable(e)) => {
                tracing::warn!(target: "fleetlimit", %url, error = %e, "Redis not reachable at start; routes use their failure policy until it is")
            }
        }
        Ok(store)
    }

    /// Builds the pool and waits up to the connect timeout for it; the
    /// second result says how that went (the store is usable either way:
    /// it keeps reconnecting).
    pub(crate) async fn open(
        settings: &RedisSettings,
        pool_size: usize,
        deadline: Duration,
    ) -> Result<(Self, Result<(), Startup>), StoreError> {
        let connect_timeout = settings.connect_timeout;
        let (mut config, tls) = fred_config(settings)?;
        // A Redis that is down at start-up is retried by the reconnect
        // policy, like one that goes down later (fred gives up otherwise).
        config.fail_fast = false;
        let template = config.clone();
        let pool = build_pool(config, pool_size, deadline, connect_timeout)?;
        // Subscribed before connecting: a refused AUTH or a failed TLS
        // handshake shows only there (the pool just keeps reconnecting).
        let errors = pool.next().error_rx();
        let io = IoThread::start()?;
        {
            // fred spawns its connection tasks (and, from them, every
            // reconnection) on the runtime it is called from.
            let _on_io = io.handle.enter();
            let _connection_tasks = pool.connect_pool();
        }
        let handle = io.handle.clone();
        let nodes = pool.is_clustered().then(|| {
            NodePools::new(
                pool.clone(),
                template,
                pool_size,
                deadline,
                connect_timeout,
                handle.clone(),
            )
        });
        let store = Self {
            pool,
            _io: Arc::new(io),
            inner: Arc::new(Inner {
                io: handle,
                stalls: Stalls::new(),
                nodes,
                lean: Script::new(LEAN),
                decide: Script::new(SCRIPT),
                deadline,
                options: Options {
                    // A backstop only: `within` enforces the deadline.
                    timeout: Some(backstop(deadline)),
                    fail_fast: true,
                    max_attempts: Some(1),
                    max_redirections: Some(3),
                    ..Options::default()
                },
            }),
            batcher: None,
        };
        let started = wait_connected(&store.pool, errors, connect_timeout, tls).await;
        if started.is_ok() {
            if let Some(nodes) = &store.inner.nodes {
                nodes.connect_all(connect_timeout).await;
            }
            if let Err(e) = store.load_script().await {
                tracing::warn!(target: "fleetlimit", error = %e, "could not load the script; EVAL will load it on first use");
            }
        }
        Ok((store, started))
    }

    /// `SCRIPT LOAD`s the scripts (on every primary of a cluster); the
    /// check also recovers by itself.
    pub async fn load_script(&self) -> Result<(), StoreError> {
        for text in [LEAN, SCRIPT] {
            if self.pool.is_clustered() {
                let () = self
                    .pool
                    .next()
                    .script_load_cluster(text)
                    .await
                    .map_err(map_err)?;
            } else {
                let _sha: String = self.pool.script_load(text).await.map_err(map_err)?;
            }
        }
        Ok(())
    }

    /// Records this instance as alive in the fleet's sorted set (scored by
    /// Redis `TIME`), prunes instances silent for `dead_after`, keeps an
    /// expiry on the set, and returns how many are alive.
    pub async fn heartbeat(
        &self,
        key: &str,
        instance: &str,
        dead_after: Duration,
    ) -> Result<u32, StoreError> {
        const HEARTBEAT: &str = "local t = redis.call('TIME')\n\
            local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n\
            redis.call('ZADD', KEYS[1], now, ARGV[1])\n\
            redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))\n\
            redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))\n\
            return redis.call('ZCARD', KEYS[1])";
        let opts = Options {
            timeout: Some(dead_after.min(Duration::from_secs(1))),
            fail_fast: true,
            max_attempts: Some(1),
            ..Options::default()
        };
        let slot = ClusterHash::Custom(fred::util::redis_keyslot(key.as_bytes()));
        let eval = CustomCommand::new_static("EVAL", slot, false);
        let args: Vec<Value> = vec![
            HEARTBEAT.into(),
            1.into(),
            key.into(),
            instance.into(),
            (dead_after.as_millis() as i64).into(),
        ];
        let n: i64 = self
            .pool
            .with_options(&opts)
            .custom(eval, args)
            .await
            .map_err(map_err)?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Coalesce concurrent single-bucket checks into one script call (see
    /// `batch.rs`); ignored on a cluster. Needs a tokio runtime.
    #[must_use]
    pub fn with_coalescing(mut self, on: bool) -> Self {
        self.batcher = (on && !self.pool.is_clustered())
            .then(|| Batcher::start(self.pool.clone(), Arc::clone(&self.inner)));
        self
    }

    /// The fred pool, for admin tasks and tests.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The SHA1 of the decision script (what `EVALSHA` sends for requests
    /// counted against several limits, or against a window).
    #[must_use]
    pub fn script_sha() -> String {
        fred::util::sha1_hash(SCRIPT)
    }

    /// The SHA1 of the lean script (what `EVALSHA` sends for a request
    /// counted against a single token bucket).
    #[must_use]
    pub fn lean_script_sha() -> String {
        fred::util::sha1_hash(LEAN)
    }
}

impl Store for RedisStore {
    fn check(&self, check: &Check) -> StoreFuture {
        if let (Some(batcher), [bucket]) = (&self.batcher, check.buckets.as_slice()) {
            if let Some(args) = LeanArgs::new(&bucket.rule, check.cost) {
                // No timer per check: the batch's call carries the deadline,
                // counted from when it is handed to fred.
                return Box::pin(batcher.check(bucket, args));
            }
        }
        let pool = self.pool.clone();
        let inner = Arc::clone(&self.inner);
        // Only a cluster cares about slots; standalone is always one call.
        let groups = if pool.is_clustered() {
            slot_groups(check)
        } else {
            Vec::new()
        };
        let check = check.clone();
        Box::pin(async move {
            // One call for the whole request, unless a cluster spreads its
            // keys over several slots (see `slot_groups`).
            let run = async {
                if groups.len() <= 1 {
                    return inner.run(&pool, &check).await;
                }
                inner.run_in_order(&pool, &check, &groups).await
            };
            // One deadline for the whole check, NOSCRIPT recovery included.
            within(run, inner.deadline, &inner.io, &inner.stalls)
                .await
                .unwrap_or(Err(StoreError::Timeout))
        })
    }

    fn nodes(&self, check: &Check) -> Vec<String> {
        if !self.pool.is_clustered() {
            return Vec::new();
        }
        // The slot owners in fred's cached cluster state (none yet: the
        // store as a whole).
        let Some(state) = self.pool.next().cached_cluster_state() else {
            return Vec::new();
        };
        let mut nodes: Vec<String> = Vec::with_capacity(1);
        for b in &check.buckets {
            let slot = fred::util::redis_keyslot(b.key.as_bytes());
            if let Some(server) = state.get_server(slot) {
                let name = server.to_string();
                if !nodes.contains(&name) {
                    nodes.push(name);
                }
            }
        }
        nodes
    }
}

/// A pool with the store's settings, not connected yet.
pub(crate) fn build_pool(
    config: FredConfig,
    pool_size: usize,
    deadline: Duration,
    connect_timeout: Duration,
) -> Result<Pool, StoreError> {
    Builder::from_config(config)
        .with_performance_config(|p| {
            // Safety net for anything sent without per-call options.
            p.default_command_timeout = deadline.max(Duration::from_millis(1));
        })
        .with_connection_config(|c| {
            c.connection_timeout = connect_timeout;
            c.max_command_attempts = 1;
            c.internal_command_timeout = connect_timeout;
        })
        // Without a policy a pool never reconnects after Redis restarts.
        .set_policy(ReconnectPolicy::new_exponential(0, 20, 1_000, 2))
        .build_pool(pool_size.max(1))
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

/// A thread of its own running fred's connection tasks (writing commands,
/// reading answers, reconnecting) on a single-threaded runtime. On the
/// application's runtime those tasks wait behind every ready request task:
/// with hundreds of requests in flight an answer Redis sent in 100 µs was
/// read milliseconds later, and checks missed the deadline against a
/// healthy Redis. Here they run as soon as the OS runs the thread. Stopped
/// when the last clone of the store is dropped.
struct IoThread {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl IoThread {
    fn start() -> Result<Self, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unavailable(format!("cannot start fred's runtime: {e}")))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("fleetlimit-redis".into())
            .spawn(move || {
                // Ends when the store is dropped (the sender with it).
                let _ = rt.block_on(stopped);
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start fred's thread: {e}")))?;
        Ok(Self {
            handle,
            stop: Some(stop),
        })
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// fred's own timeout per call: only a backstop, well past the deadline.
fn backstop(deadline: Duration) -> Duration {
    hard_bound(deadline) + Duration::from_millis(100)
}

/// `call`'s output if Redis answers within `deadline`; `None` if not.
///
/// The deadline bounds what Redis costs, not this process's own delays:
///
/// - it starts when fred's thread (see [`IoThread`]) has taken the command
///   and written it to the socket, not when the call was made: a marker
///   task queued on fred's runtime behind the command says when that was;
/// - when its timer fires late (by half the deadline or more), or fred's
///   thread takes a tenth of it to run a task, this process was not
///   running — a busy or throttled host, which stalls Redis too — and
///   Redis gets one more deadline, counted from then; so it does while checks keep seeing
///   such stalls (one within the last twenty deadlines);
/// - Redis's answer may wait in the socket until fred's thread runs again,
///   and the timer may be seen first (fred's own timeout, a plain
///   `tokio::time::timeout`, calls that a miss). So once the timer fires
///   the check waits until fred's runtime has run once more — anything
///   Redis sent by then has been read — and takes the answer if it came.
///
/// Against a Redis that does not answer this costs microseconds, and
/// whatever happens a call ends within [`hard_bound`]`(deadline)`.
pub(crate) async fn within<F: std::future::Future>(
    call: F,
    deadline: Duration,
    io: &tokio::runtime::Handle,
    stalls: &Stalls,
) -> Option<F::Output> {
    use std::future::{poll_fn, Future as _};
    use std::task::Poll;

    let mut call = std::pin::pin!(call);
    let handed = Instant::now();
    let give_up = handed + hard_bound(deadline);
    let mut hard = std::pin::pin!(tokio::time::sleep_until(give_up));
    // Hands the command to fred (its first poll sends it).
    let first = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    if let Poll::Ready(out) = first {
        return Some(out);
    }
    let mut taken = std::pin::pin!(marker(io));
    let sent = poll_fn(|cx| {
        if let Poll::Ready(out) = call.as_mut().poll(cx) {
            return Poll::Ready(Err(Some(out)));
        }
        if let Poll::Ready(at) = taken.as_mut().poll(cx) {
            return Poll::Ready(Ok(at));
        }
        hard.as_mut().poll(cx).map(|()| Err(None))
    })
    .await;
    let stalled = (deadline / 2).max(Duration::from_millis(1));
    // fred's thread runs a task within tens of microseconds on a host with
    // a free CPU: a tenth of the deadline says the host is contended.
    let contended = (deadline / 10).max(Duration::from_micros(200));
    let mut until = match sent {
        Ok(at) => {
            if at.saturating_duration_since(handed) >= contended {
                stalls.seen(at);
            }
            at + deadline
        }
        Err(out) => return out,
    };
    loop {
        let mut timer = std::pin::pin!(tokio::time::sleep_until(until.min(give_up)));
        let ready = poll_fn(|cx| {
            if let Poll::Ready(out) = call.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            timer.as_mut().poll(cx).map(|()| None)
        })
        .await;
        if ready.is_some() {
            return ready;
        }
        let now = Instant::now();
        if now.saturating_duration_since(until) >= stalled && now < give_up {
            // This task was not running: the host stalled.
            stalls.seen(now);
            until = now + deadline;
            continue;
        }
        let mut caught_up = std::pin::pin!(marker(io));
        let ran = poll_fn(|cx| {
            if let Poll::Ready(out) = call.as_mut().poll(cx) {
                return Poll::Ready(Err(Some(out)));
            }
            if let Poll::Ready(at) = caught_up.as_mut().poll(cx) {
                return Poll::Ready(Ok(at));
            }
            hard.as_mut().poll(cx).map(|()| Err(None))
        })
        .await;
        match ran {
            Err(out) => return out,
            // fred's thread was not running either: the host stalled.
            Ok(at) if at.saturating_duration_since(now) >= contended && at < give_up => {
                stalls.seen(at);
                until = at + deadline;
            }
            // Another check saw the host stall a moment ago: Redis, on the
            // same host, was likely held up too.
            Ok(at) if stalls.lately(at, deadline.saturating_mul(20)) && at < give_up => {
                until = at + deadline;
            }
            Ok(_) => return None,
        }
    }
}

/// When checks last saw this host stall (a task late by half a deadline,
/// or fred's thread by a tenth), shared by a store's checks.
pub(crate) struct Stalls {
    born: Instant,
    /// µs since `born`, plus one; 0: never.
    last: std::sync::atomic::AtomicU64,
}

impl Stalls {
    fn new() -> Self {
        Self {
            born: Instant::now(),
            last: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn seen(&self, at: Instant) {
        let us = at.saturating_duration_since(self.born).as_micros() as u64 + 1;
        self.last
            .fetch_max(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a stall was seen within `recent` before `now`.
    fn lately(&self, now: Instant, recent: Duration) -> bool {
        let last = self.last.load(std::sync::atomic::Ordering::Relaxed);
        let now = now.saturating_duration_since(self.born).as_micros() as u64 + 1;
        last != 0 && now.saturating_sub(last) <= recent.as_micros() as u64
    }
}

/// The longest a Redis call can take, whatever the host does: the
/// deadline, and room for the host's own stalls.
pub(crate) fn hard_bound(deadline: Duration) -> Duration {
    deadline + HOST_STALLS
}

/// What [`hard_bound`] allows for the host's stalls: a starved 2-core
/// machine left fred's thread unscheduled for 20–45 ms.
const HOST_STALLS: Duration = Duration::from_millis(50);

/// When fred's runtime has run everything queued before this call: a task
/// spawned there, which lets the tasks woken with it (the router writing
/// a command, the reader reading an answer) go first.
async fn marker(io: &tokio::runtime::Handle) -> Instant {
    let (ran, seen) = tokio::sync::oneshot::channel::<Instant>();
    io.spawn(async move {
        tokio::task::yield_now().await;
        let _ = ran.send(Instant::now());
    });
    // The runtime is gone only when the store is: "now" then.
    seen.await.unwrap_or_else(|_| Instant::now())
}

/// fred's configuration for `settings`: the URL checked and its TLS set up
/// by fleetlimit (fred only sees the plain URL), so every connection to
/// Redis — the pool, the reset listener — is made the same way. The flag
/// says whether TLS is on.
pub(crate) fn fred_config(settings: &RedisSettings) -> Result<(FredConfig, bool), StoreError> {
    let target =
        redis_url::check(&settings.url, cfg!(feature = "tls")).map_err(StoreError::Unavailable)?;
    #[allow(unused_mut)]
    let mut config = FredConfig::from_url(&target.plain_url).map_err(|e| {
        StoreError::Unavailable(format!(
            "bad Redis URL {:?}: {}",
            redact_url(&settings.url),
            e.details()
        ))
    })?;
    #[cfg(feature = "tls")]
    if target.tls {
        let connector = super::tls::connector(settings).map_err(StoreError::Unavailable)?;
        config.tls = Some(connector.into());
    }
    Ok((config, target.tls))
}

/// Indexes of the check's buckets, grouped by cluster slot in the route's
/// order.
fn slot_groups(check: &Check) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, b) in check.buckets.iter().enumerate() {
        let slot = fred::util::redis_keyslot(b.key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, g)) => g.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

impl Inner {
    /// EVALSHA of one all-or-nothing check; EVAL when Redis lost the script.
    /// A single token bucket (the common case) runs the lean script.
    async fn run(&self, pool: &Pool, check: &Check) -> Result<Outcome, StoreError> {
        let n = check.buckets.len();
        let lean = match check.buckets.as_slice() {
            [b] => LeanArgs::new(&b.rule, check.cost),
            _ => None,
        };
        let script = if lean.is_some() {
            &self.lean
        } else {
            &self.decide
        };
        let args = |head: &Value| {
            let mut args: Vec<Value> = Vec::with_capacity(3 + 5 * n);
            args.push(head.clone());
            args.push(Value::Integer(n as i64));
            args.extend(check.buckets.iter().map(|b| Value::from(b.key.as_str())));
            if let Some(lean) = &lean {
                // EVALSHA sha 1 key cost×per burst×per
                let (inc, burst) = lean.values();
                args.push(inc);
                args.push(burst);
            } else {
                args.push(Value::from(check.cost.to_string()));
                // EVALSHA sha numkeys key.. cost (algorithm p1 p2 shadow)..
                for b in &check.buckets {
                    let (code, p1, p2) = b.rule.script_args();
                    args.push(Value::from(code));
                    args.push(Value::from(p1.to_string()));
                    args.push(Value::from(p2.to_string()));
                    args.push(Value::from(if b.shadow { "1" } else { "0" }));
                }
            }
            args
        };
        // On a cluster, the pool of the primary owning the slot (all the
        // check's keys share it, see `slot_groups`).
        let node_pool;
        let pool = match &self.nodes {
            Some(nodes) => {
                let slot = check
                    .buckets
                    .first()
                    .map_or(0, |b| fred::util::redis_keyslot(b.key.as_bytes()));
                node_pool = nodes.for_slot(slot)?;
                &node_pool
            }
            None => pool,
        };
        let reply = match self.eval(pool, script, ClusterHash::FirstKey, &args).await {
            // The slot moved since fred's table was read: follow it once.
            Err(e) => match (&self.nodes, moved_to(&e)) {
                (Some(nodes), Some((host, port))) => {
                    let pool = nodes.pool(&host, port)?;
                    self.eval(&pool, script, ClusterHash::FirstKey, &args).await
                }
                _ => Err(e),
            },
            ok => ok,
        };
        let reply = reply.map_err(map_err)?;
        if let Some(lean) = &lean {
            match reply {
                Value::Array(mut items) if items.len() == 1 => {
                    let b = &check.buckets[0];
                    let reply = items.pop().unwrap_or(Value::Null);
                    lean.parse(&reply, b.rule.capacity(), b.shadow)
                }
                other => Err(StoreError::Protocol(format!(
                    "lean script: unexpected {other:?}"
                ))),
            }
        } else {
            parse(reply, &check.buckets)
        }
    }

    /// `EVALSHA`, and on `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`)
    /// `EVAL` of the same arguments; `EVAL` also caches the script again.
    /// The caller bounds both by the deadline (see [`within`]). `args`
    /// builds the arguments after the script's SHA or text, so nothing is
    /// copied for the rare second call.
    pub(crate) async fn eval(
        &self,
        pool: &Pool,
        script: &Script,
        slot: ClusterHash,
        args: impl Fn(&Value) -> Vec<Value>,
    ) -> Result<Value, FredError> {
        let evalsha = CustomCommand::new_static("EVALSHA", slot.clone(), false);
        match pool
            .with_options(&self.options)
            .custom::<Value, Value>(evalsha, args(&script.sha))
            .await
        {
            Err(e) if is_noscript(&e) => {
                let eval = CustomCommand::new_static("EVAL", slot, false);
                pool.with_options(&self.options)
                    .custom::<Value, Value>(eval, args(&script.text))
                    .await
            }
            other => other,
        }
    }

    /// The per-check deadline.
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// A cluster cannot run one script over several slots, so the groups are
    /// decided in order; when a later group refuses, the earlier ones get
    /// their cost back. Between the charge and the refund another request
    /// may see those units spent: the price of limits that share no slot.
    async fn run_in_order(
        self: &Arc<Self>,
        pool: &Pool,
        check: &Check,
        groups: &[Vec<usize>],
    ) -> Result<Outcome, StoreError> {
        let subset = |g: &[usize], cost: f64| Check {
            cost,
            buckets: g.iter().map(|&i| check.buckets[i].clone()).collect(),
        };
        let mut limits: Vec<Option<LimitState>> = vec![None; check.buckets.len()];
        let mut charged: Vec<usize> = Vec::new();
        let mut allowed = true;
        for g in groups {
            let o = self.run(pool, &subset(g, check.cost)).await?;
            for (k, &i) in g.iter().enumerate() {
                limits[i] = Some(o.limits[k]);
            }
            if !o.allowed {
                allowed = false;
                break;
            }
            charged.extend(
                g.iter()
                    .copied()
                    .filter(|&i| limits[i].is_some_and(|l| l.enough)),
            );
        }
        if !allowed && !charged.is_empty() && check.cost > 0.0 {
            // Give back what the earlier groups took (one call per slot), in
            // a task of its own with its own deadline: the refusal is
            // decided, and a refund that ran past the check's deadline must
            // not turn it into a timeout the route's policy might answer
            // with "admit". A failed refund leaves those units spent until
            // they refill (an over-count, the safe side).
            let refunds: Vec<Check> = groups
                .iter()
                .map(|g| {
                    let back: Vec<usize> =
                        g.iter().copied().filter(|i| charged.contains(i)).collect();
                    subset(&back, -check.cost)
                })
                .filter(|c| !c.buckets.is_empty())
                .collect();
            let (inner, pool, units) = (Arc::clone(self), pool.clone(), check.cost);
            tokio::spawn(async move {
                for refund in refunds {
                    let done = within(
                        inner.run(&pool, &refund),
                        inner.deadline,
                        &inner.io,
                        &inner.stalls,
                    )
                    .await
                    .unwrap_or(Err(StoreError::Timeout));
                    if let Err(e) = done {
                        tracing::warn!(
                            target: "fleetlimit",
                            error = %e,
                            units,
                            keys = refund.buckets.len(),
                            "refused, and the refund of the limits charged before the refusal failed: \
                             they stay charged until they refill"
                        );
                    }
                }
            });
        }
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

/// Why the pool was not connected when start-up stopped waiting.
#[derive(Debug)]
pub(crate) enum Startup {
    /// Redis answered `WRONGPASS` or `NOAUTH`: the URL's credentials.
    Auth(String),
    /// Nothing usable within the connect timeout (refused, TLS, silence).
    Unreachable(String),
}

impl From<Startup> for StoreError {
    fn from(s: Startup) -> Self {
        match s {
            Startup::Auth(e) | Startup::Unreachable(e) => StoreError::Unavailable(e),
        }
    }
}

/// A connection error that retrying will not fix: refused credentials, an
/// untrusted certificate.
fn final_error(e: &FredError) -> Option<Startup> {
    if *e.kind() == ErrorKind::Auth {
        return Some(Startup::Auth(format!(
            "authentication failed: {} (check the user and password of the Redis URL)",
            e.details()
        )));
    }
    // rustls' verdict, as fred passes it on inside an IO error.
    if e.details().contains("InvalidCertificate") {
        return Some(Startup::Unreachable(format!(
            "TLS: the Redis server's certificate is not trusted ({}); check tls_ca_file \
             and the host of the URL",
            e.details()
        )));
    }
    None
}

/// Waits for the pool's first connection, at most `timeout`; stops early on
/// an error retrying will not fix (see `final_error`).
async fn wait_connected(
    pool: &Pool,
    mut errors: BroadcastReceiver<(FredError, Option<Server>)>,
    timeout: Duration,
    tls: bool,
) -> Result<(), Startup> {
    let connected = pool.wait_for_connect();
    tokio::pin!(connected);
    let timer = tokio::time::sleep(timeout);
    tokio::pin!(timer);
    let mut last: Option<FredError> = None;
    let mut listening = true;
    loop {
        let next_error = async {
            if listening {
                errors.recv().await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            r = &mut connected => {
                return r.map_err(|e| {
                    final_error(&e).unwrap_or_else(|| Startup::Unreachable(e.to_string()))
                });
            }
            () = &mut timer => {
                let mut why = last.map_or_else(|| "no answer".to_owned(), |e| e.to_string());
                // A plaintext port never answers a TLS handshake; whether
                // fred's own connect timeout fired first is a race.
                if tls {
                    why.push_str(" (does the port of the rediss:// URL serve TLS?)");
                }
                return Err(Startup::Unreachable(format!(
                    "no connection within {timeout:?}: {why}"
                )));
            }
            e = next_error => match e {
                Ok((e, _)) => match final_error(&e) {
                    Some(stop) => return Err(stop),
                    None => last = Some(e),
                },
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => listening = false,
            }
        }
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

/// One check as the lean script sees it: the bucket's emission interval
/// (µs per token), what the check costs and what a full burst spans, both in
/// µs. Computed here rather than in Lua: the script does only what needs
/// Redis (the clock, the read, the write).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LeanArgs {
    per: f64,
    inc: f64,
    burst: f64,
    /// What the script compares TAT − now with: the burst and
    /// [`REDIS_SLACK_US`](crate::algorithm::REDIS_SLACK_US).
    limit: f64,
}

impl LeanArgs {
    /// `None` for anything but a token bucket (the general script's work).
    pub(crate) fn new(rule: &Rule, cost: f64) -> Option<Self> {
        let Rule::TokenBucket {
            capacity,
            refill_per_sec,
        } = *rule
        else {
            return None;
        };
        let per = 1_000_000.0 / refill_per_sec;
        let burst = capacity * per;
        Some(Self {
            per,
            inc: cost * per,
            burst,
            limit: burst + crate::algorithm::REDIS_SLACK_US,
        })
    }

    /// The check's two arguments. Rust prints the shortest text that reads
    /// back as the same `f64`, so Lua's `tonumber` sees exactly these values.
    pub(crate) fn values(&self) -> (Value, Value) {
        (
            Value::from(self.inc.to_string()),
            Value::from(self.limit.to_string()),
        )
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
        let allowed = x >= 0;
        let ahead = (if allowed { x } else { -1 - x }) as f64 / 4.0;
        let limits = vec![LimitState {
            enough: allowed,
            // Within the slack, TAT may pass the burst by a hair.
            remaining: ((self.burst - ahead) / self.per).max(0.0),
            wait: if allowed {
                0.0
            } else {
                (ahead + self.inc - self.burst) / 1_000_000.0
            },
            reset: ahead / 1_000_000.0,
            capacity,
        }];
        Ok(Outcome {
            // A shadow limit never refuses; it was charged only if it had room.
            allowed: allowed || shadow,
            limits,
        })
    }
}

fn parse(reply: Value, buckets: &[super::Bucket]) -> Result<Outcome, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("decision script: {why}"));
    let Value::Array(items) = reply else {
        return Err(bad("not an array"));
    };
    if items.len() != 1 + 4 * buckets.len() {
        return Err(bad("wrong length"));
    }
    let num = |v: &Value| -> Result<f64, StoreError> {
        v.as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| bad("not a number"))
    };
    let allowed = num(&items[0])? == 1.0;
    let limits = buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let at = 1 + 4 * i;
            Ok(LimitState {
                enough: num(&items[at])? == 1.0,
                // The script's capacity carries the slack: never report it.
                remaining: num(&items[at + 1])?.min(b.rule.capacity()),
                wait: num(&items[at + 2])?,
                reset: num(&items[at + 3])?,
                capacity: b.rule.capacity(),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Outcome { allowed, limits })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_string_replies() {
        let bucket = super::super::Bucket {
            key: "k".into(),
            rule: super::super::Rule::TokenBucket {
                capacity: 5.0,
                refill_per_sec: 10.0,
            },
            shadow: false,
        };
        let buckets = [bucket];
        let reply = Value::Array(vec![
            "0".into(),
            "0".into(),
            "0.4".into(),
            "0.06".into(),
            "0.46".into(),
        ]);
        let o = parse(reply, &buckets).unwrap();
        assert!(!o.allowed);
        assert_eq!(o.limits[0].remaining, 0.4);
        assert_eq!(o.limits[0].wait, 0.06);
        assert!(!o.limits[0].enough);
        assert!(parse(Value::Array(vec!["1".into()]), &buckets).is_err());
        assert!(parse(Value::Null, &buckets).is_err());
    }

    #[test]
    fn lean_answers_decode_to_the_limit_state() {
        // 5 tokens at 10/s: 100 ms per token, a burst spans 500 ms.
        let rule = Rule::TokenBucket {
            capacity: 5.0,
            refill_per_sec: 10.0,
        };
        let args = LeanArgs::new(&rule, 1.0).unwrap();
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
        assert!(LeanArgs::new(
            &Rule::FixedWindow {
                limit: 1.0,
                window: Duration::from_secs(1)
            },
            1.0
        )
        .is_none());
    }

    #[test]
    fn start_up_stops_at_errors_retrying_cannot_fix() {
        let e = FredError::new(ErrorKind::Auth, "WRONGPASS invalid username-password pair");
        let Some(Startup::Auth(why)) = final_error(&e) else {
            panic!("not an authentication failure");
        };
        assert!(why.starts_with("authentication failed: WRONGPASS"), "{why}");
        let e = FredError::new(
            ErrorKind::IO,
            "Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }",
        );
        assert!(matches!(final_error(&e), Some(Startup::Unreachable(w)) if w.starts_with("TLS: ")));
        let e = FredError::new(ErrorKind::IO, "Connection refused");
        assert!(
            final_error(&e).is_none(),
            "refused: keep waiting, Redis may come up"
        );
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
        let args = LeanArgs::new(
            &Rule::TokenBucket {
                capacity: 5.0,
                refill_per_sec: 10.0,
            },
            1.0,
        )
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
