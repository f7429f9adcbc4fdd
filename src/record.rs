//! Decision records: what settles "your limiter is broken" after the fact.
//!
//! A limit with `record = true` (or [`LimitConfig::record`](crate::configuration::LimitConfig::record))
//! has each decision about it written to a Redis stream of its own,
//! `<prefix>:record:{<limit>}`: the caller's log id (a digest for API keys
//! and accounts, never the raw value), the plan, admitted or refused, the
//! tokens remaining, whether the decision was degraded, how it was made,
//! and which instance made it. `fleetlimit explain` reads it back.
//!
//! Never on the request path: a decision is handed to a bounded queue with
//! `try_send`; when the queue is full the record is dropped and counted
//! (one WARN a second). One caller holds at most [`SHARE`] of the queued
//! records (callers are told apart by a keyed hash of their log id, into
//! [`STRIPES`] counters): a client flooding one recorded limit loses its
//! own records beyond that, not everyone else's. One task drains the queue and writes what it holds
//! in one pipeline (`XADD … MAXLEN ~`, then per stream `XTRIM … MINID ~`
//! and `PEXPIRE`) under the store's deadline; a batch that fails or misses
//! the deadline is counted as failed and not retried, so a slow Redis costs
//! records, never latency or memory.
//!
//! Only with Redis: the in-process store records nothing (see
//! docs/configuration.md, "Decision records").

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(feature = "redis")]
use fred::interfaces::ClientLike;
#[cfg(feature = "redis")]
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::mpsc;

use crate::log_throttle::Throttle;
use crate::route::RecordConfig;
#[cfg(feature = "redis")]
use crate::store::redis::reply::map_err;
#[cfg(feature = "redis")]
use crate::store::{RedisStore, StoreError};

/// Records waiting for the writer, per layer. A full queue drops.
pub(crate) const QUEUE: usize = 4096;
/// Callers' shares of the queue: a keyed hash of the log id picks one of
/// these counters. Two callers meet in one with odds of 1 in 256, and
/// cannot aim for it (the hash's keys are random per process).
const STRIPES: usize = 256;
/// Records of one stripe in the queue at most (1/16 of it).
const SHARE: u16 = (QUEUE / 16) as u16;
/// Records written in one pipeline at most.
#[cfg(feature = "redis")]
const BATCH: usize = 256;

/// What a layer's recorder has done since it started (public as
/// [`Stats`](crate::layer::Stats)'s `records_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecordStats {
    /// Records Redis acknowledged.
    pub(crate) written: u64,
    /// Records dropped because the queue was full.
    pub(crate) dropped: u64,
    /// Records in a batch Redis refused or did not answer in time.
    pub(crate) failed: u64,
}

/// The Redis stream of `limit`'s decisions.
pub(crate) fn stream_key(prefix: &str, limit: &str) -> String {
    format!("{prefix}:record:{{{limit}}}")
}

/// How a decision was made, as the record's `via` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    /// The primary store decided (Redis, or the in-process store for the
    /// metrics; a record is always Redis's: records need Redis, and keep
    /// the name `redis`).
    Store,
    /// A refusal Redis gave, repeated by this instance until its Retry-After.
    Remembered,
    /// From this instance's lease of a hot key's tokens.
    Lease,
    /// Redis failed: this instance's share of the limit (`local`).
    Local,
    /// Redis failed: served unlimited (`open`).
    Open,
    /// Redis failed: refused with 503 (`closed`).
    Closed,
}

impl Via {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Store => "redis",
            Self::Remembered => "remembered",
            Self::Lease => "lease",
            Self::Local => "local",
            Self::Open => "open",
            Self::Closed => "closed",
        }
    }

    pub(crate) fn degraded(self) -> bool {
        matches!(self, Self::Local | Self::Open | Self::Closed)
    }
}

/// One decision about one recorded limit.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The limit's name.
    pub(crate) limit: Arc<str>,
    /// The limit's record settings.
    pub(crate) record: RecordConfig,
    /// The caller's log id (never a raw API key).
    pub(crate) key: String,
    pub(crate) plan: Option<Arc<str>>,
    pub(crate) allowed: bool,
    /// Whole tokens (or requests) left; `None`: not known (`open`,
    /// `closed`, a limit another limit's refusal kept from being asked).
    pub(crate) remaining: Option<f64>,
    /// This limit had room for the request (`false` on a refusal: this
    /// limit refused; `true`: another one did); `None`: not known.
    pub(crate) enough: Option<bool>,
    pub(crate) via: Via,
}

#[derive(Debug)]
struct Counters {
    written: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    /// Records of each stripe in the queue.
    queued: Box<[AtomicU16]>,
    /// Keys of the stripes' hash.
    hasher: RandomState,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            queued: (0..STRIPES).map(|_| AtomicU16::new(0)).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl Counters {
    /// The count of the stripe of the caller whose log id is `key`.
    fn queued(&self, key: &str) -> &AtomicU16 {
        &self.queued[(self.hasher.hash_one(key) % STRIPES as u64) as usize]
    }

    /// The writer took `batch` off the queue: its callers have room again.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn taken(&self, batch: &[Entry]) {
        for e in batch {
            self.queued(&e.key).fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The request path's end of the queue.
#[derive(Debug)]
pub(crate) struct Recorder {
    tx: mpsc::Sender<Entry>,
    counters: Arc<Counters>,
    /// The WARN line of dropped records, one a second.
    dropped_log: Throttle,
}

// Without Redis no recorder is ever started.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Recorder {
    /// Starts the writer on `store`; it ends when the recorder is dropped.
    #[cfg(feature = "redis")]
    pub(crate) fn start(
        store: RedisStore,
        prefix: Arc<str>,
        instance: Arc<str>,
        deadline: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let counters = Arc::new(Counters::default());
        let writer = Writer {
            store,
            prefix,
            instance,
            deadline,
            counters: Arc::clone(&counters),
        };
        tokio::spawn(writer.run(rx));
        Self {
            tx,
            counters,
            dropped_log: Throttle::default(),
        }
    }

    /// Hands `e` to the writer, or drops it (counted) when the queue is
    /// full or holds its caller's share. Never waits.
    pub(crate) fn record(&self, e: Entry) {
        let queued = self.counters.queued(&e.key);
        let room = queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < SHARE).then_some(n + 1)
            })
            .is_ok();
        let sent = room
            && self
                .tx
                .try_send(e)
                .map_err(|_| {
                    queued.fetch_sub(1, Ordering::Relaxed);
                })
                .is_ok();
        if !sent {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            if let Some(suppressed) = self.dropped_log.event() {
                tracing::warn!(
                    target: "fleetlimit",
                    suppressed,
                    queue = QUEUE,
                    share = SHARE,
                    "decision record dropped: the queue to Redis, or its caller's share of it, is full"
                );
            }
        }
    }

    pub(crate) fn stats(&self) -> RecordStats {
        RecordStats {
            written: self.counters.written.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
        }
    }
}

/// The task writing the queue to Redis.
#[cfg(feature = "redis")]
struct Writer {
    store: RedisStore,
    prefix: Arc<str>,
    instance: Arc<str>,
    deadline: Duration,
    counters: Arc<Counters>,
}

#[cfg(feature = "redis")]
impl Writer {
    async fn run(self, mut rx: mpsc::Receiver<Entry>) {
        let failed_log = Throttle::default();
        let mut batch = Vec::with_capacity(BATCH);
        while rx.recv_many(&mut batch, BATCH).await > 0 {
            self.counters.taken(&batch);
            let n = batch.len() as u64;
            let sent = tokio::time::timeout(self.deadline, self.send(&batch)).await;
            let (written, error) = match sent {
                Ok(Ok(w)) => w,
                Ok(Err(e)) => (0, Some(e.to_string())),
                Err(_) => (
                    0,
                    Some(format!(
                        "no answer within the deadline ({:?})",
                        self.deadline
                    )),
                ),
            };
            self.counters.written.fetch_add(written, Ordering::Relaxed);
            let failed = n - written;
            self.counters.failed.fetch_add(failed, Ordering::Relaxed);
            if let Some(error) = error {
                if let Some(suppressed) = failed_log.event() {
                    tracing::warn!(
                        target: "fleetlimit",
                        records = failed,
                        suppressed,
                        %error,
                        "decision records not written, or their stream not trimmed"
                    );
                }
            }
            batch.clear();
        }
    }

    /// One pipeline: each record's `XADD`, then each stream's trim by age
    /// and expiry. Each command answers for itself, so one stream's bad
    /// key (another type) costs that stream's records only: how many were
    /// written, and the first error.
    async fn send(&self, batch: &[Entry]) -> Result<(u64, Option<String>), StoreError> {
        let pipe = self.store.pool().next().pipeline();
        let xadd = CustomCommand::new_static("XADD", ClusterHash::FirstKey, false);
        let mut streams: Vec<&Entry> = Vec::new();
        for e in batch {
            let max_len = e.record.max_len;
            let remaining = e
                .remaining
                .map(|r| r.floor().max(0.0).to_string())
                .unwrap_or_default();
            let args: Vec<Value> = vec![
                stream_key(&self.prefix, &e.limit).into(),
                "MAXLEN".into(),
                "~".into(),
                (max_len as i64).into(),
                "*".into(),
                "key".into(),
                e.key.as_str().into(),
                "plan".into(),
                e.plan.as_deref().unwrap_or("").into(),
                "allowed".into(),
                i64::from(e.allowed).into(),
                "remaining".into(),
                remaining.into(),
                "enough".into(),
                e.enough.map_or("", |b| if b { "1" } else { "0" }).into(),
                "degraded".into(),
                i64::from(e.via.degraded()).into(),
                "via".into(),
                e.via.as_str().into(),
                "instance".into(),
                (&*self.instance).into(),
            ];
            let () = pipe.custom(xadd.clone(), args).await.map_err(map_err)?;
            if !streams.iter().any(|s| s.limit == e.limit) {
                streams.push(e);
            }
        }
        // Trimmed by the age of this host's clock: a skew of seconds
        // against an age of an hour moves the cut by seconds.
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for s in streams {
            let key = stream_key(&self.prefix, &s.limit);
            let age_ms = s.record.max_age.as_millis() as u64;
            let min_id = format!("{}-0", now_ms.saturating_sub(age_ms));
            let xtrim = CustomCommand::new_static("XTRIM", ClusterHash::FirstKey, false);
            let args: Vec<Value> = vec![
                key.as_str().into(),
                "MINID".into(),
                "~".into(),
                min_id.into(),
            ];
            let () = pipe.custom(xtrim, args).await.map_err(map_err)?;
            let pexpire = CustomCommand::new_static("PEXPIRE", ClusterHash::FirstKey, false);
            let args: Vec<Value> = vec![key.into(), (age_ms.max(1) as i64).into()];
            let () = pipe.custom(pexpire, args).await.map_err(map_err)?;
        }
        let answers = pipe.try_all::<Value>().await;
        let mut written = 0;
        let mut error = None;
        for a in &answers[..batch.len().min(answers.len())] {
            match a {
                Ok(_) => written += 1,
                Err(e) => {
                    error.get_or_insert_with(|| map_err(e.clone()).to_string());
                }
            }
        }
        if error.is_none() {
            // A failed trim or expiry is reported, its records still count.
            error = answers[batch.len().min(answers.len())..]
                .iter()
                .find_map(|a| a.as_ref().err())
                .map(|e| map_err(e.clone()).to_string());
        }
        Ok((written, error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full queue drops at once and counts, whatever the writer is doing.
    #[tokio::test]
    async fn a_full_queue_drops_and_counts() {
        let (tx, _rx) = mpsc::channel(2);
        let r = Recorder {
            tx,
            counters: Arc::default(),
            dropped_log: Throttle::default(),
        };
        let limit: Arc<str> = "l".into();
        for _ in 0..5 {
            r.record(Entry {
                limit: Arc::clone(&limit),
                record: RecordConfig::default(),
                key: "global".into(),
                plan: None,
                allowed: true,
                remaining: Some(0.0),
                enough: Some(true),
                via: Via::Store,
            });
        }
        assert_eq!(
            r.stats(),
            RecordStats {
                written: 0,
                dropped: 3,
                failed: 0
            }
        );
    }

    fn entry(key: &str) -> Entry {
        Entry {
            limit: "l".into(),
            record: RecordConfig::default(),
            key: key.into(),
            plan: None,
            allowed: false,
            remaining: Some(0.0),
            enough: Some(false),
            via: Via::Store,
        }
    }

    /// One caller flooding a recorded limit fills its share of the queue,
    /// not the queue: every other caller's records still get in, and the
    /// flooder's are accepted again once the writer takes its records.
    #[tokio::test]
    async fn one_caller_cannot_fill_the_queue() {
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let r = Recorder {
            tx,
            counters: Arc::default(),
            dropped_log: Throttle::default(),
        };
        for _ in 0..QUEUE {
            r.record(entry("flood"));
        }
        let share = u64::from(SHARE);
        assert_eq!(r.stats().dropped, QUEUE as u64 - share);
        // Others: distinct callers, 14 of each, well under the queue's
        // room left; a caller sharing the flooder's stripe (1 in 256) would
        // be the only one dropped.
        let others: Vec<String> = (0..200).map(|i| format!("caller-{i}")).collect();
        let same_stripe = |k: &str| std::ptr::eq(r.counters.queued(k), r.counters.queued("flood"));
        let expected_in: u64 = others.iter().filter(|k| !same_stripe(k)).count() as u64 * 14;
        for k in &others {
            for _ in 0..14 {
                r.record(entry(k));
            }
        }
        assert_eq!(rx.len() as u64, share + expected_in);
        // The writer takes the flooder's records off: room again.
        let mut taken = Vec::new();
        rx.recv_many(&mut taken, QUEUE).await;
        r.counters.taken(&taken);
        let dropped = r.stats().dropped;
        r.record(entry("flood"));
        assert_eq!(r.stats().dropped, dropped);
        assert_eq!(rx.len(), 1);
    }

    #[test]
    fn stream_keys_are_not_bucket_keys() {
        let k = stream_key("rl", "record");
        assert_eq!(k, "rl:record:{record}");
        assert!(crate::key::StoreKey::parse("rl", &k).is_none());
    }
}
