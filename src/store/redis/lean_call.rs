//! One call of the lean script for single-token-bucket checks (of the
//! one-check script for a check alone), at one node, within its deadline;
//! a late answer's charges given back. What `batch.rs` sends, and
//! `per_node.rs` on a Cluster.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Instant;

use fred::types::Value;
use tokio::sync::oneshot;

use super::cluster::Node;
use super::deadline::{Stamp, deciding, giving_back, within};
use super::script::{Inner, Which};
use crate::algorithm::LeanArgs;
use crate::store::{Outcome, StoreError};

/// One single-token-bucket check, as the lean script takes it.
#[derive(Clone)]
pub(crate) struct Item {
    /// The bucket's key, ready to send (built once, shared by reference).
    pub(super) key: Value,
    pub(super) capacity: f64,
    pub(super) shadow: bool,
    pub(super) args: LeanArgs,
}

pub(crate) struct Job {
    pub(super) item: Item,
    pub(super) reply: oneshot::Sender<Result<Outcome, StoreError>>,
    /// When it was queued, with a batch window (its wait is counted from
    /// then).
    pub(super) at: Option<Instant>,
}

impl Item {
    /// Its key's Cluster hash slot.
    pub(super) fn slot(&self) -> u16 {
        fred::util::redis_keyslot(self.key.as_bytes().unwrap_or_default())
    }

    /// The check giving back what this one charged (`None`: it charges
    /// nothing).
    fn refund(&self) -> Option<Self> {
        Some(Self {
            args: self.args.refund()?,
            ..self.clone()
        })
    }
}

impl Borrow<Item> for Job {
    fn borrow(&self) -> &Item {
        &self.item
    }
}

/// One call of the lean script for `jobs` (of the one-check script for a
/// job alone): its answers, Redis's clock
/// taken off (see `script::timed`). A call Redis ran too late (nothing
/// charged) is sent again when the deadline leaves time (see
/// `deadline::deciding`); an answer that comes after the call gave up is
/// settled: what it charged is given back (`give_back`: such a call,
/// sent as `deadline::giving_back` says).
pub(super) async fn call<J: Borrow<Item>>(
    pool: &Node,
    scripts: &Arc<Inner>,
    jobs: &[J],
    give_back: bool,
) -> Result<Vec<Value>, StoreError> {
    let which = if jobs.len() == 1 {
        Which::One
    } else {
        Which::Lean
    };
    let timer = scripts.metrics.start();
    let attempt = |stamp: Stamp| async move {
        attempt(pool, scripts, jobs, which, stamp, false)
            .await
            .reply
    };
    let answer = if give_back {
        giving_back(attempt, &scripts.health, None).await
    } else {
        deciding(attempt, false, scripts.deadline(), &scripts.stalls).await
    };
    scripts.metrics.answered(
        timer,
        answer.as_ref().map(|_| ()).map_err(StoreError::reason),
    );
    answer
}

/// What one call of `jobs` got: its answers (as [`call`]'s), and the
/// redirection it followed to get them (`MOVED` or `ASK`), if any.
pub(super) struct Attempt {
    pub(super) reply: Result<Vec<Value>, StoreError>,
    pub(super) redirected: Option<&'static str>,
}

/// One call of script `which` for `jobs` at `node`, waiting within
/// `stamp` (after `ASKING` when `asking`); an answer that comes after it
/// gave up is settled.
pub(super) async fn attempt<J: Borrow<Item>>(
    node: &Node,
    scripts: &Arc<Inner>,
    jobs: &[J],
    which: Which,
    stamp: Stamp,
    asking: bool,
) -> Attempt {
    let (args, at) = match (which, jobs) {
        // One check: EVALSHA sha 1 key (not_after cost×per burst×per), packed.
        (Which::One, [one]) => {
            let one = one.borrow();
            let args = vec![
                Value::Null,
                Value::Integer(1),
                one.key.clone(),
                one.args.packed(),
            ];
            (args, 3)
        }
        _ => lean_args(jobs, which == Which::LeanCross),
    };
    scripts.metrics.sent(which.metric(), jobs.len());
    let clock = Arc::clone(&node.clock);
    let mut sending = scripts.send_to(&node.pool, clock, which, args, at, stamp, asking);
    let waited = within(
        &mut sending,
        scripts.deadline(),
        stamp,
        &scripts.io,
        &scripts.stalls,
    )
    .await;
    scripts
        .health
        .saw(waited.as_ref().is_some_and(|a| a.reply.is_ok()));
    match waited {
        Some(answer) => Attempt {
            redirected: answer.redirected,
            reply: answer.items(),
        },
        None => {
            let items: Vec<Item> = jobs.iter().map(|j| j.borrow().clone()).collect();
            let (inner, node) = (Arc::clone(scripts), node.clone());
            scripts.settle(sending, move |answer| async move {
                settled(&inner, &node, &items, answer.items()).await;
            });
            Attempt {
                reply: Err(StoreError::Timeout),
                redirected: None,
            }
        }
    }
}

/// The lean script's arguments for `jobs` (after a placeholder for the
/// SHA), and where its bound goes: EVALSHA sha n key.. not_after
/// (cost×per burst×per).. [d]; `cross` (a Cluster's call across slots):
/// EVALSHA sha 0 n key.. not_after ..., the keys undeclared.
fn lean_args<J: Borrow<Item>>(jobs: &[J], cross: bool) -> (Vec<Value>, usize) {
    let mut args: Vec<Value> = Vec::with_capacity(5 + 3 * jobs.len());
    args.push(Value::Null);
    if cross {
        args.push(Value::Integer(0));
    }
    args.push(Value::Integer(jobs.len() as i64));
    args.extend(jobs.iter().map(|j| j.borrow().key.clone()));
    let at = args.len();
    args.push(Value::Null);
    // Checks of one limit share their numbers: printed once, then the
    // (reference-counted) values are reused.
    let mut last: Option<(LeanArgs, (Value, Value))> = None;
    for j in jobs.iter().map(Borrow::borrow) {
        let (inc, burst) = match &last {
            Some((a, values)) if *a == j.args => values.clone(),
            _ => {
                let values = j.args.values();
                last = Some((j.args, values.clone()));
                values
            }
        };
        args.push(inc);
        args.push(burst);
    }
    if repeats_a_key(jobs) {
        // The script then follows each key's own writes in this call.
        args.push(Value::from("d"));
    }
    (args, at)
}

/// [`call`] boxed: a refund giving back a late answer's charges runs
/// through `call`, whose late answers are settled the same way.
fn call_boxed<'a>(
    pool: &'a Node,
    scripts: &'a Arc<Inner>,
    items: &'a [Item],
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<Value>, StoreError>> + Send + 'a>>
{
    Box::pin(call(pool, scripts, items, true))
}

/// A lean call's answers that came after it gave up: each check they
/// charged is given back (a refund of its charge, in one call).
async fn settled(
    inner: &Arc<Inner>,
    pool: &Node,
    items: &[Item],
    answers: Result<Vec<Value>, StoreError>,
) {
    use crate::metrics::Precision;
    let n = items.len() as u64;
    let answers = match answers {
        Ok(answers) => answers,
        Err(StoreError::Late) => return inner.metrics.precision(Precision::LateDiscarded, n),
        Err(_) => return inner.metrics.precision(Precision::Unknown, n),
    };
    let refunds: Vec<Item> = (items.iter().zip(&answers))
        .filter(|(item, answer)| {
            (item.args.parse(answer, item.capacity, item.shadow)).is_ok_and(|o| o.limits[0].enough)
        })
        .filter_map(|(item, _)| item.refund())
        .collect();
    let charged = refunds.len() as u64;
    inner.metrics.precision(Precision::SettledCharged, charged);
    inner
        .metrics
        .precision(Precision::SettledUncharged, n - charged);
    if refunds.is_empty() {
        return;
    }
    // On a Cluster one by one: a call of one key goes wherever its slot is.
    let sent = if inner.nodes.is_some() {
        let mut out = Ok(Vec::new());
        for refund in refunds.chunks(1) {
            if let Err(e) = call_boxed(pool, inner, refund).await {
                out = Err(e);
            }
        }
        out
    } else {
        call_boxed(pool, inner, &refunds).await
    };
    if let Err(e) = sent {
        tracing::warn!(
            target: "fleetlimit",
            error = %e,
            checks = refunds.len(),
            "could not give back what checks charged after their call gave up: \
             they stay charged until they refill"
        );
    }
}

/// Whether a key is named by more than one job: the script reads every
/// key once (MGET) and, only when told, follows a key's writes within the
/// call, so a repeated key must be flagged or its later checks would
/// decide on a stale TAT.
fn repeats_a_key<J: Borrow<Item>>(jobs: &[J]) -> bool {
    fn key<J: Borrow<Item>>(j: &J) -> &[u8] {
        j.borrow().key.as_bytes().unwrap_or_default()
    }
    if jobs.len() <= 16 {
        jobs.iter()
            .enumerate()
            .any(|(i, a)| jobs[..i].iter().any(|b| key(a) == key(b)))
    } else {
        let mut seen = std::collections::HashSet::with_capacity(jobs.len());
        !jobs.iter().all(|j| seen.insert(key(j)))
    }
}

/// Each of `jobs` gets its answer from `items`, in order (a call's reply
/// holds one per check it ran); the jobs without one are returned, with
/// the last answer handed out. A caller gone has its answer dropped: Redis
/// may still have charged it, an unknown outcome as for any timeout.
pub(super) fn hand_out(
    mut jobs: Vec<Job>,
    items: Vec<Value>,
) -> (Vec<Job>, Option<Result<Outcome, StoreError>>) {
    let rest = jobs.split_off(items.len().min(jobs.len()));
    let mut last = None;
    for (job, item) in jobs.into_iter().zip(items) {
        let answer = job
            .item
            .args
            .parse(&item, job.item.capacity, job.item.shadow);
        last = Some(answer.clone());
        let _ = job.reply.send(answer);
    }
    (rest, last)
}

pub(super) fn fail(jobs: Vec<Job>, e: &StoreError) {
    for job in jobs {
        let _ = job.reply.send(Err(e.clone()));
    }
}
