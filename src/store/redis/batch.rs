//! Coalesced decisions: requests in flight at the same moment, each against
//! one token bucket, are decided in one script call.
//!
//! A request hands its check to a queue and waits for its answer; the call
//! that carries it has the deadline (so no timer per check), counted from
//! when the batch is handed to fred: time spent in this process's own
//! queue is not Redis's cost, and counting it turned a busy moment of the
//! host into deadline misses for healthy Redis. One task drains the queue: it
//! lets the tasks that are ready run for up to two scheduler ticks (no
//! timer: a lone request on an idle server goes out after one, alone),
//! takes whatever is waiting, and sends it as one `EVALSHA` of the lean
//! script (which takes one check or many), without waiting for the answer
//! before taking the next batch, so calls stay pipelined. Under load this
//! divides Redis's per-call overhead and the client's per-command work by
//! the batch size.
//!
//! When nothing is queued and no call is in flight (a lone request on an
//! idle server), the check skips all that: the request's own future makes
//! the one-check call, as the draining task would have, without the
//! queue, the gather ticks, a spawned task and a channel back. A call in
//! flight sends the next checks to the queue, so under load they are
//! coalesced as before.
//!
//! With a batch window (`[redis] batch_window`, opt-in), a check waits
//! for company instead: none takes the direct call, and a thread of its
//! own (`fleetlimit-batch`) sends a batch once its first check has waited
//! the window, or at once when a full batch is queued. It sleeps through
//! the window (the checks that come meanwhile are queued, nobody wakes it
//! for them), so the wait is the window to within the operating system's
//! timer slack, not a tokio timer's millisecond, and it spins on nothing.
//! A server with a few checks in flight at a time (one at 10,000 requests
//! a second and a 0.2 ms round trip has one to three) then sends batches
//! of about the window's share of its rate: what divides Redis's cost per
//! decision, for a wait of at most the window per request.
//!
//! On a Cluster the batch is decided per primary (`per_node.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fred::clients::Pool;
use fred::types::Value;
use tokio::sync::{mpsc, oneshot};

use super::cluster::Node;
use super::lean_call::{Item, Job, call, fail, hand_out};
use super::script::Inner;
use crate::algorithm::LeanArgs;
use crate::store::{Bucket, Outcome, StoreError, StoreFuture};

/// Most requests in one call.
const MAX_BATCH: usize = 64;
/// Most scheduler ticks a batch waits for more checks; it stops at the
/// first tick that brings none (an idle server: one tick). Measured with
/// the load harness: one tick made batches of ~8, two of ~20 and 3–4 %
/// more requests per second, four of ~40 and fewer (the callers' wait
/// outgrew the saving).
const GATHER_TICKS: usize = 2;
/// Most requests waiting; beyond it a check fails at once (and the route's
/// failure policy answers) rather than queueing without bound.
const MAX_QUEUED: usize = 16_384;

#[derive(Clone)]
pub(crate) struct Batcher {
    tx: mpsc::Sender<Job>,
    /// Calls under way: direct checks, and batches from when the draining
    /// task took their first check until their answers are handed out.
    busy: Arc<AtomicUsize>,
    /// Where a standalone Redis (or Sentinel's primary) is, and its clock;
    /// a Cluster's calls go to their primaries' own pools.
    node: Node,
    scripts: Arc<Inner>,
    /// `[redis] batch_window`: how long a check waits for company.
    window: Option<Duration>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("busy", &self.busy.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// One call under way in [`Batcher::busy`]; let go when dropped, so a
/// request that gave up (its future dropped mid-call) leaves no count.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn raise(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(count))
    }

    /// Raised only from zero: the caller's call is then the only one.
    fn first(count: &Arc<AtomicUsize>) -> Option<Self> {
        count
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| Self(Arc::clone(count)))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Batcher {
    /// Starts the draining task (with a `window`, the draining thread);
    /// it ends when the last `Batcher` is dropped.
    pub(crate) fn start(pool: Pool, scripts: Arc<Inner>, window: Option<Duration>) -> Self {
        let (tx, mut rx) = mpsc::channel::<Job>(MAX_QUEUED);
        let busy = Arc::new(AtomicUsize::new(0));
        let pool = Node {
            pool,
            clock: Arc::clone(&scripts.clock),
        };
        let this = Self {
            tx,
            busy: Arc::clone(&busy),
            node: pool.clone(),
            scripts: Arc::clone(&scripts),
            window,
        };
        if let Some(window) = window {
            let io = tokio::runtime::Handle::current();
            let drain = move || windowed(rx, window, &busy, &pool, &scripts, &io);
            let thread = std::thread::Builder::new().name("fleetlimit-batch".into());
            if let Err(e) = thread.spawn(drain) {
                // Every queued check then fails, and the route's failure
                // policy answers: said once, at start-up.
                tracing::error!(target: "fleetlimit", error = %e, "could not start the batch window's thread");
            }
            return this;
        }
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // Checks that come while this batch gathers are queued.
                let guard = Busy::raise(&busy);
                // Let every task that is ready run first: the checks they
                // queue join this batch. On an idle server nothing is ready
                // and this returns at once, so a lone request waits for no
                // timer; under load, a second tick gathers those that the
                // first one's tasks queued.
                let mut queued = rx.len();
                for _ in 0..GATHER_TICKS {
                    tokio::task::yield_now().await;
                    let now_queued = rx.len();
                    if now_queued == queued || now_queued >= MAX_BATCH {
                        break;
                    }
                    queued = now_queued;
                }
                let jobs = take_batch(first, &mut rx);
                if jobs.is_empty() {
                    continue;
                }
                let (pool, scripts) = (pool.clone(), Arc::clone(&scripts));
                tokio::spawn(async move {
                    run(&pool, &scripts, jobs).await;
                    drop(guard);
                });
            }
        });
        this
    }

    /// One single-token-bucket check: called at once when no other call is
    /// queued or under way, else queued. The future answers within the
    /// deadline counted from when its call is handed to fred.
    pub(crate) fn check(&self, bucket: &Bucket, args: LeanArgs) -> StoreFuture {
        let item = Item {
            key: Value::from(bucket.key.as_str()),
            capacity: bucket.rule.capacity(),
            shadow: bucket.shadow,
            args,
        };
        // With a batch window a check waits for company, alone or not.
        let idle = self.window.is_none() && self.tx.capacity() == self.tx.max_capacity();
        if let Some(busy) = idle.then(|| Busy::first(&self.busy)).flatten() {
            let (pool, scripts) = (self.node.clone(), Arc::clone(&self.scripts));
            if scripts.nodes.is_some() {
                // A batch of one, to its slot's primary.
                let (reply, answer) = oneshot::channel();
                let job = Job {
                    item,
                    reply,
                    at: None,
                };
                return Box::pin(async move {
                    super::per_node::run(&scripts, vec![job]).await;
                    drop(busy);
                    answered(answer).await
                });
            }
            return Box::pin(async move {
                let answer = direct(&pool, &scripts, item).await;
                drop(busy);
                answer
            });
        }
        let (reply, answer) = oneshot::channel();
        let at = self.window.map(|_| Instant::now());
        let queued = self.tx.try_send(Job { item, reply, at });
        Box::pin(async move {
            // This process's own overload: not Redis's fault, so not the
            // breaker's business (it would turn a busy moment of this host
            // into an outage of every route).
            queued.map_err(|_| StoreError::Overloaded)?;
            answered(answer).await
        })
    }
}

/// A queued check's answer.
async fn answered(
    answer: oneshot::Receiver<Result<Outcome, StoreError>>,
) -> Result<Outcome, StoreError> {
    answer
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable("batch dropped".into())))
}

/// `first` and what is queued behind it, up to a batch, without the
/// checks whose caller has gone (its request cancelled while it waited):
/// a check given up on before its call goes out is never sent, so it
/// charges nothing.
fn take_batch(first: Job, rx: &mut mpsc::Receiver<Job>) -> Vec<Job> {
    let mut jobs = vec![first];
    while jobs.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
    jobs.retain(|j| !j.reply.is_closed());
    jobs
}

/// The batch window's draining thread: a batch goes out when its first
/// check has waited `window` since it was queued, or at once when a full
/// batch is queued; its call runs on the layer's runtime (`io`).
fn windowed(
    mut rx: mpsc::Receiver<Job>,
    window: Duration,
    busy: &Arc<AtomicUsize>,
    pool: &Node,
    scripts: &Arc<Inner>,
    io: &tokio::runtime::Handle,
) {
    while let Some(first) = rx.blocking_recv() {
        let guard = Busy::raise(busy);
        if rx.len() + 1 < MAX_BATCH {
            let until = first.at.unwrap_or_else(Instant::now) + window;
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        }
        let jobs = take_batch(first, &mut rx);
        if jobs.is_empty() {
            continue;
        }
        let (pool, scripts) = (pool.clone(), Arc::clone(scripts));
        io.spawn(async move {
            run(&pool, &scripts, jobs).await;
            drop(guard);
        });
    }
}

/// One check in a call of its own, answered as [`run`] answers a batch of
/// one.
async fn direct(pool: &Node, scripts: &Arc<Inner>, item: Item) -> Result<Outcome, StoreError> {
    match <[Value; 1]>::try_from(call(pool, scripts, std::slice::from_ref(&item), false).await?) {
        Ok([reply]) => item.args.parse(&reply, item.capacity, item.shadow),
        Err(other) => Err(StoreError::Protocol(format!(
            "batch script: unexpected {other:?}"
        ))),
    }
}

async fn run(pool: &Node, scripts: &Arc<Inner>, mut jobs: Vec<Job>) {
    if scripts.nodes.is_some() {
        return super::per_node::run(scripts, jobs).await;
    }
    // Bounded: every round answers at least one job.
    while !jobs.is_empty() {
        let items = match call(pool, scripts, &jobs, false).await {
            // The script stops at a check whose command failed: the reply
            // holds the answers before it, then its error.
            Ok(items) if !items.is_empty() && items.len() <= jobs.len() => items,
            Ok(other) => {
                let e = StoreError::Protocol(format!("batch script: unexpected {other:?}"));
                return fail(jobs, &e);
            }
            Err(e) => return fail(jobs, &e),
        };
        let (rest, last) = hand_out(jobs, items);
        jobs = rest;
        match last {
            // One check's data or numbers: the checks after it were not
            // run, and are decided in another call.
            Some(Err(StoreError::Script(_))) | None => {}
            // Redis is not serving them either (OOM, READONLY...).
            Some(Err(e)) => return fail(jobs, &e),
            Some(Ok(_)) if jobs.is_empty() => {}
            Some(Ok(_)) => {
                let e = StoreError::Protocol("batch script: short reply".into());
                return fail(jobs, &e);
            }
        }
    }
}
