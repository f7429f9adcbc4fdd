//! The deadline of a Redis call, and the thread fred's connection tasks
//! run on.
//!
//! The deadline bounds what Redis costs, not this process's own delays: it
//! runs from when fred's thread has taken the command, and a host that
//! stalls (a busy or throttled machine, which stalls Redis too) gets Redis
//! another deadline (see [`within`]). Whatever happens a call ends within
//! [`hard_bound`], and one deadline more when Redis answered that it ran
//! the call too late and it was sent again ([`deciding`]).
//!
//! The caller never stops waiting before the call's "not after" bound
//! (`clock.rs`) has passed on Redis's clock: a check Redis runs in time is
//! answered (and charged), one it runs later changes nothing.

use std::time::Duration;

use tokio::time::Instant;

use crate::store::StoreError;

/// A thread of its own running fred's connection tasks (writing commands,
/// reading answers, reconnecting) on a single-threaded runtime. On the
/// application's runtime those tasks wait behind every ready request task:
/// with hundreds of requests in flight an answer Redis sent in 100 µs was
/// read milliseconds later, and checks missed the deadline against a
/// healthy Redis. Here they run as soon as the OS runs the thread. Stopped
/// when the last clone of the store is dropped.
pub(crate) struct IoThread {
    pub(crate) handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl IoThread {
    pub(crate) fn start() -> Result<Self, StoreError> {
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
pub(crate) fn backstop(deadline: Duration) -> Duration {
    hard_bound(deadline) + Duration::from_millis(100)
}

/// When a call is handed to fred, and how long its caller waits for the
/// answer at least: the call's "not after" bound is `handed + window` moved
/// onto Redis's clock (see `clock.rs`), so the caller never stops waiting
/// before Redis stops being allowed to charge.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stamp {
    pub(crate) handed: Instant,
    /// At least the deadline; a hard bound's worth when this host stalled
    /// lately (Redis, on the same host, runs late then too).
    window: Duration,
    /// The latest the call may end, whatever happens.
    hard: Instant,
    /// A give-back's other bound, on Redis's clock (µs): the end of the
    /// earliest window its charge went into. Run later, it would give the
    /// units to the window after, which never had them.
    pub(crate) until: Option<i64>,
}

impl Stamp {
    /// A call handed now.
    pub(crate) fn new(deadline: Duration, stalls: &Stalls) -> Self {
        let handed = Instant::now();
        let window = if stalls.lately(handed, BUSY_LATELY) {
            hard_bound(deadline)
        } else {
            deadline
        };
        Self {
            handed,
            window,
            hard: handed + hard_bound(deadline),
            until: None,
        }
    }

    /// When the caller may stop waiting: the call's bound on Redis's clock.
    pub(crate) fn give_up(&self) -> Instant {
        self.handed + self.window
    }

    /// The stamp of a call sent again after Redis ran this one after its
    /// bound (Redis or this host stalled): what is left of this one's hard
    /// bound, and at least a deadline.
    pub(crate) fn after_late(&self, deadline: Duration, stalls: &Stalls) -> Self {
        let now = Instant::now();
        stalls.seen(now);
        let window = self.hard.saturating_duration_since(now).max(deadline);
        Self {
            handed: now,
            window,
            hard: now + window,
            until: None,
        }
    }
}

/// How long after a stall of this host calls get a hard bound's window
/// (see [`Stamp::new`]): a busy host stalls again soon, and Redis, on the
/// same host, runs late then too.
const BUSY_LATELY: Duration = Duration::from_secs(1);

/// `attempt(stamp)`, which waits within `stamp` ([`within`]); once more
/// when Redis answered that it ran it too late (`Late`: nothing was
/// charged), unless `once` (a call whose earlier parts were charged: see
/// `run_in_order`). The second attempt waits what is left of the first's
/// hard bound, and at least a deadline: a call ends within
/// [`hard_bound`] and one deadline more.
pub(crate) async fn deciding<T, Fut>(
    attempt: impl Fn(Stamp) -> Fut,
    once: bool,
    deadline: Duration,
    stalls: &Stalls,
) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let first = Stamp::new(deadline, stalls);
    let out = attempt(first).await;
    if once || !matches!(out, Err(StoreError::Late)) {
        return out;
    }
    attempt(first.after_late(deadline, stalls)).await
}

/// How long a give-back (a refund no caller waits for) waits for its answer.
pub(crate) const GIVE_BACK_WAIT: Duration = Duration::from_secs(5);
/// Attempts of a give-back, and the longest pause between two.
const GIVE_BACK_TRIES: u32 = 10;
const GIVE_BACK_PAUSE: Duration = Duration::from_secs(2);

/// A give-back: what a check charged after its caller stopped waiting, or
/// before a refusal of another slot, handed back. No caller waits for it,
/// so it is not sent into a store whose calls fail now (its answer would
/// be lost as likely as not), each attempt waits up to [`GIVE_BACK_WAIT`]
/// for its answer (its bound on Redis's clock is as far: one that runs
/// later changes nothing), and one that surely did not run (`Late`, or
/// not sent: no connection, the breaker, this process's queue) is tried
/// again, after a pause doubling from 100 ms to [`GIVE_BACK_PAUSE`], at
/// most [`GIVE_BACK_TRIES`] times. Any other answer ends it (a timeout: it
/// may have run). A give-back into windows that end at `until` (Redis's
/// clock, µs) carries that bound too, and is not tried again once `Late`:
/// its windows are most likely over, and with them the units it would
/// give back (a stall past it leaves them charged: an over-count).
pub(crate) async fn giving_back<T, Fut>(
    attempt: impl Fn(Stamp) -> Fut,
    health: &Health,
    until: Option<i64>,
) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut pause = Duration::from_millis(100);
    let mut out = Err(StoreError::Unavailable("the store kept failing".into()));
    for _ in 0..GIVE_BACK_TRIES {
        if !health.failing() {
            let handed = Instant::now();
            out = attempt(Stamp {
                handed,
                window: GIVE_BACK_WAIT,
                hard: handed + GIVE_BACK_WAIT,
                until,
            })
            .await;
            if until.is_some() && matches!(out, Err(StoreError::Late)) {
                return out;
            }
            let not_run = matches!(
                out,
                Err(StoreError::Late
                    | StoreError::Unavailable(_)
                    | StoreError::CircuitOpen
                    | StoreError::Overloaded)
            );
            if !not_run {
                return out;
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(GIVE_BACK_PAUSE);
    }
    out
}

/// Whether a store's calls answer now: when a caller last got an answer,
/// and when one last did not.
pub(crate) struct Health {
    born: Instant,
    /// µs since `born`, plus one; 0: never.
    ok: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
}

impl Health {
    pub(crate) fn new() -> Self {
        Self {
            born: Instant::now(),
            ok: std::sync::atomic::AtomicU64::new(0),
            failed: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.born)
            .as_micros() as u64
            + 1
    }

    /// A caller got an answer (`true`), or gave up or failed (`false`).
    pub(crate) fn saw(&self, answered: bool) {
        let at = if answered { &self.ok } else { &self.failed };
        at.fetch_max(self.now(), std::sync::atomic::Ordering::Relaxed);
    }

    /// When a caller last got an answer (a stamp only compared with
    /// another of this store: 0 before any).
    pub(crate) fn last_answer(&self) -> u64 {
        self.ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The last call failed.
    fn failing(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.failed.load(Relaxed) > self.ok.load(Relaxed)
    }
}

/// `call`'s output if Redis answers within `deadline`; `None` if not.
/// Never `None` before `stamp`'s give-up moment (the call's bound on
/// Redis's clock), and always by its hard bound.
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
pub(crate) async fn within<F: std::future::Future + Unpin>(
    call: &mut F,
    deadline: Duration,
    stamp: Stamp,
    io: &tokio::runtime::Handle,
    stalls: &Stalls,
) -> Option<F::Output> {
    use std::future::{Future as _, poll_fn};
    use std::task::Poll;

    let mut call = std::pin::Pin::new(call);
    let handed = stamp.handed;
    let give_up = stamp.hard.max(stamp.give_up());
    let mut hard = std::pin::pin!(tokio::time::sleep_until(give_up));
    // Hands the command to fred (its first poll sends it).
    let first = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    if let Poll::Ready(out) = first {
        return Some(out);
    }
    // When fred's thread took the command, read only if the timer fires
    // first: waiting for it on every call would wake this task (and park
    // it again) once more per call, a cost paid in latency at rest.
    let mut sent = Some(mark(io));
    let stalled = (deadline / 2).max(Duration::from_millis(1));
    // fred's thread runs a task within tens of microseconds on a host with
    // a free CPU: a tenth of the deadline says the host is contended.
    let contended = (deadline / 10).max(Duration::from_micros(200));
    let mut until = stamp.give_up();
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
            // Answered: the marker is looked at only if it has run already.
            if let Some(Ok(at)) = sent.as_mut().map(|s| s.try_recv()) {
                if at.saturating_duration_since(handed) >= contended {
                    stalls.seen(at);
                }
            }
            return ready;
        }
        if let Some(seen) = sent.take() {
            // The deadline runs from when fred's thread took the command.
            let at = match seen_or_answer(&mut call, &mut hard, seen).await {
                Ok(at) => at,
                Err(out) => return out,
            };
            if at.saturating_duration_since(handed) >= contended {
                stalls.seen(at);
            }
            // Taken late (by more than the timer's own 1 ms grain): the
            // deadline is counted again from then.
            if at + deadline > Instant::now() + Duration::from_millis(1) && until < give_up {
                until = at + deadline;
                continue;
            }
        }
        let now = Instant::now();
        if now.saturating_duration_since(until) >= stalled && now < give_up {
            // This task was not running: the host stalled.
            stalls.seen(now);
            until = now + deadline;
            continue;
        }
        let ran = io_ran(&mut call, &mut hard, io).await;
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

/// When fred's runtime has run once more ([`marker`]): `Ok(then)`; unless
/// `call` answers first (`Err(Some(answer))`) or the hard bound passes
/// (`Err(None)`).
async fn io_ran<F: std::future::Future>(
    call: &mut std::pin::Pin<&mut F>,
    hard: &mut std::pin::Pin<&mut tokio::time::Sleep>,
    io: &tokio::runtime::Handle,
) -> Result<Instant, Option<F::Output>> {
    use std::future::{Future as _, poll_fn};
    use std::task::Poll;

    let mut ran = std::pin::pin!(marker(io));
    poll_fn(|cx| {
        if let Poll::Ready(out) = call.as_mut().poll(cx) {
            return Poll::Ready(Err(Some(out)));
        }
        if let Poll::Ready(at) = ran.as_mut().poll(cx) {
            return Poll::Ready(Ok(at));
        }
        hard.as_mut().poll(cx).map(|()| Err(None))
    })
    .await
}

/// When checks last saw this host stall (a task late by half a deadline,
/// or fred's thread by a tenth), shared by a store's checks.
pub(crate) struct Stalls {
    born: Instant,
    /// µs since `born`, plus one; 0: never.
    last: std::sync::atomic::AtomicU64,
}

impl Stalls {
    pub(crate) fn new() -> Self {
        Self {
            born: Instant::now(),
            last: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn seen(&self, at: Instant) {
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
    // The runtime is gone only when the store is: "now" then.
    mark(io).await.unwrap_or_else(|_| Instant::now())
}

/// [`marker`]'s task, its time to be read later (or never).
fn mark(io: &tokio::runtime::Handle) -> tokio::sync::oneshot::Receiver<Instant> {
    let (ran, seen) = tokio::sync::oneshot::channel::<Instant>();
    io.spawn(async move {
        tokio::task::yield_now().await;
        let _ = ran.send(Instant::now());
    });
    seen
}

/// [`mark`]'s time once it comes: `Ok(then)`; unless `call` answers first
/// (`Err(Some(answer))`) or the hard bound passes (`Err(None)`).
async fn seen_or_answer<F: std::future::Future>(
    call: &mut std::pin::Pin<&mut F>,
    hard: &mut std::pin::Pin<&mut tokio::time::Sleep>,
    mut seen: tokio::sync::oneshot::Receiver<Instant>,
) -> Result<Instant, Option<F::Output>> {
    use std::future::{Future as _, poll_fn};
    use std::task::Poll;

    poll_fn(|cx| {
        if let Poll::Ready(out) = call.as_mut().poll(cx) {
            return Poll::Ready(Err(Some(out)));
        }
        if let Poll::Ready(at) = std::pin::Pin::new(&mut seen).poll(cx) {
            return Poll::Ready(Ok(at.unwrap_or_else(|_| Instant::now())));
        }
        hard.as_mut().poll(cx).map(|()| Err(None))
    })
    .await
}
