//! On a Cluster, coalesced checks decided per primary: a batch's checks
//! whose slots one primary owns (in fred's slot table) go in one call of
//! the lean script flagged `allow-cross-slot-keys` (Redis 7), sent to that
//! primary's pool (`cluster.rs`); a batch of one runs the one-check script.
//! Where the cluster refuses the flag, the checks go in one call per slot.
//!
//! A slot on the move meets a call in three ways, none of which charges a
//! check twice:
//!
//! - the flagged call reads every key before it decides anything, so a key
//!   no longer (or not yet) the node's fails that read and the call decided
//!   nothing; a command failing later stops the script with the checks
//!   before it decided (their answers stand) and the rest not run;
//! - a call per slot (declared keys) is refused before it runs with `MOVED`
//!   or `ASK`, followed to the node named (`script.rs`), or `TRYAGAIN`
//!   (keys of one slot half moved): split into calls of one key;
//! - a call that timed out is an unknown outcome, as anywhere: never sent
//!   again, its late answer settled (`batch.rs`).
//!
//! Checks not run are sent again per slot within the same deadline (the
//! first call's [`Stamp`]), those calls under way together; what is left
//! when it has passed, or after [`MAX_HOPS`] calls, is answered by the
//! route's failure policy.

use std::sync::Arc;

use tokio::time::Instant;

use super::cluster::{Node, NodePools};
use super::deadline::Stamp;
use super::lean_call::{Job, attempt, fail, hand_out};
use super::redirects::{KINDS, refuses_flag};
use super::script::{Inner, Which};
use crate::store::StoreError;

/// A batch's checks on a Cluster: a call per primary (per slot where the
/// cluster refuses calls across slots), the calls under way together.
pub(super) async fn run(scripts: &Arc<Inner>, jobs: Vec<Job>) {
    let Some(nodes) = &scripts.nodes else {
        return fail(jobs, &StoreError::Protocol("not a cluster".into()));
    };
    let cross = scripts.cross.allowed();
    let mut groups = match group(nodes, jobs, cross, None) {
        Ok(groups) => groups,
        Err((jobs, e)) => return fail(jobs, &e),
    };
    let last = groups.pop();
    for leg in groups {
        let scripts = Arc::clone(scripts);
        drop(tokio::spawn(async move { decide(&scripts, leg).await }));
    }
    if let Some(leg) = last {
        decide(scripts, leg).await;
    }
}

/// Checks to send together: where, and how.
struct Leg {
    node: Node,
    jobs: Vec<Job>,
    /// Keys of several slots: the flagged script, keys undeclared.
    cross: bool,
    /// `ASKING` first (the slot is being imported there).
    asking: bool,
    /// The deadline of the group's first call, which every call sent again
    /// for its checks keeps (`None` until that call goes).
    stamp: Option<Stamp>,
    /// Calls its checks went through before this one (redirections, splits).
    hops: usize,
    /// Sent again once after Redis ran it too late.
    late_again: bool,
}

impl Leg {
    /// The leg of `jobs` sent again after this one, at `node`.
    fn after(&self, node: Node, jobs: Vec<Job>, cross: bool, asking: bool) -> Self {
        Self {
            node,
            jobs,
            cross,
            asking,
            stamp: self.stamp,
            hops: self.hops + 1,
            late_again: self.late_again,
        }
    }
}

/// `jobs` grouped by the primary owning their slot in fred's table (by
/// slot when not `cross`), each group in the order the jobs came; sent
/// again after `parent` if any.
fn group(
    nodes: &NodePools,
    jobs: Vec<Job>,
    cross: bool,
    parent: Option<&Leg>,
) -> Result<Vec<Leg>, (Vec<Job>, StoreError)> {
    let Some(table) = nodes.table() else {
        let e = StoreError::Unavailable("cluster slots not known yet".into());
        return Err((jobs, e));
    };
    let mut groups: Vec<(String, u16, Option<u16>, Vec<Job>)> = Vec::new();
    let mut orphans = Vec::new();
    for job in jobs {
        let slot = job.item.slot();
        let Some(server) = table.get_server(slot) else {
            orphans.push(job);
            continue;
        };
        let by_slot = (!cross).then_some(slot);
        let found = groups.iter_mut().find(|(host, port, s, _)| {
            *port == server.port && *s == by_slot && host.as_str() == &*server.host
        });
        match found {
            Some((_, _, _, g)) => g.push(job),
            None => groups.push((server.host.to_string(), server.port, by_slot, vec![job])),
        }
    }
    fail(
        orphans,
        &StoreError::Unavailable("no node serves the slot".into()),
    );
    let mut legs = Vec::with_capacity(groups.len());
    for (host, port, _, jobs) in groups {
        match (nodes.pool(&host, port), parent) {
            (Ok(node), Some(parent)) => legs.push(parent.after(node, jobs, cross, false)),
            (Ok(node), None) => legs.push(Leg {
                node,
                jobs,
                cross,
                asking: false,
                stamp: None,
                hops: 0,
                late_again: false,
            }),
            (Err(e), _) => fail(jobs, &e),
        }
    }
    Ok(legs)
}

/// `jobs` split per slot, each group to its owner in fred's table: calls
/// of declared keys, which Redis refuses with `MOVED` or `ASK` (and the
/// node to ask) when the table is behind; sent again after `parent`.
fn per_slot(nodes: &NodePools, jobs: Vec<Job>, parent: &Leg) -> Vec<Leg> {
    match group(nodes, jobs, false, Some(parent)) {
        Ok(legs) => legs,
        Err((jobs, e)) => {
            fail(jobs, &e);
            Vec::new()
        }
    }
}

/// A redirection met by a call of declared keys.
enum Redirect {
    /// The slot is elsewhere, or being moved there (`ASK`: true).
    To(String, u16, bool),
    /// Keys of one call on both sides of a slot being moved (`TRYAGAIN`),
    /// or of several slots (`CROSSSLOT`): nothing ran.
    Split,
}

/// What a call's error says about where its checks should go.
fn redirect(e: &StoreError) -> Option<Redirect> {
    let text = match e {
        StoreError::Redis(t) | StoreError::Unavailable(t) => t.as_str(),
        _ => return None,
    };
    for (word, ask) in [("MOVED ", false), ("ASK ", true)] {
        if let Some(at) = text.find(word) {
            let mut parts = text[at + word.len()..].split_whitespace();
            let addr = parts.nth(1)?;
            let (host, port) = addr.rsplit_once(':')?;
            return Some(Redirect::To(host.to_owned(), port.parse().ok()?, ask));
        }
    }
    (text.contains("TRYAGAIN") || text.contains("CROSSSLOT")).then_some(Redirect::Split)
}

/// Whether a flagged call's error item says its key was not the node's (the
/// slot moved or is moving): that check and those after it did not run.
fn not_local(item: &fred::types::Value) -> bool {
    match item {
        fred::types::Value::String(t) => not_local_text(t),
        fred::types::Value::Bytes(b) => not_local_text(std::str::from_utf8(b).unwrap_or("")),
        _ => false,
    }
}

/// Redis's words for a script's command on a key not its node's.
fn not_local_text(text: &str) -> bool {
    text.contains("non local key") || text.contains("not hash to the same slot")
}

/// Most calls a check goes through (redirections and splits): a slot
/// moves once at a time, so two or three are the most it needs.
const MAX_HOPS: usize = 6;

/// What a group's calls met, and whether every check got Redis's answer.
struct Report {
    met: Vec<&'static str>,
    decided: bool,
    calls: usize,
}

impl Report {
    fn saw(&mut self, kind: &'static str) {
        if !self.met.contains(&kind) {
            self.met.push(kind);
        }
    }

    fn merge(&mut self, other: Self) {
        for kind in other.met {
            self.saw(kind);
        }
        self.decided &= other.decided;
        self.calls += other.calls;
    }
}

/// One group's checks decided: a call, then the calls its checks not run
/// need (per slot, to the node Redis named), each wave's calls under way
/// together, all within the first call's deadline.
async fn decide(scripts: &Arc<Inner>, first: Leg) {
    let timer = scripts.metrics.start();
    let began = Instant::now();
    let mut report = Report {
        met: Vec::new(),
        decided: true,
        calls: 0,
    };
    let mut wave = vec![first];
    while !wave.is_empty() {
        let mut next = Vec::new();
        if wave.len() == 1 {
            let leg = wave.pop().expect("one leg");
            next = step(scripts, leg, &mut report).await;
        } else {
            let mut set = tokio::task::JoinSet::new();
            for leg in wave.drain(..) {
                let scripts = Arc::clone(scripts);
                set.spawn(async move {
                    let mut report = Report {
                        met: Vec::new(),
                        decided: true,
                        calls: 0,
                    };
                    let next = step(&scripts, leg, &mut report).await;
                    (next, report)
                });
            }
            while let Some(done) = set.join_next().await {
                match done {
                    Ok((legs, r)) => {
                        next.extend(legs);
                        report.merge(r);
                    }
                    // Its checks' callers see their answer dropped.
                    Err(_) => report.decided = false,
                }
            }
        }
        wave = next;
    }
    let decided = report.decided;
    scripts
        .metrics
        .answered(timer, if decided { Ok(()) } else { Err("cluster") });
    if !report.met.is_empty() {
        let took = began.elapsed();
        scripts.cross.met(&report.met, decided, took);
        for (i, kind) in KINDS.iter().enumerate() {
            if report.met.contains(kind) {
                scripts.metrics.redirected(i, decided);
            }
        }
        tracing::debug!(
            target: "fleetlimit",
            met = ?report.met,
            decided,
            calls = report.calls,
            ?took,
            "a call met a slot on the move"
        );
    }
}

/// One call of `leg`: its answers handed out, and the legs its checks not
/// run go in next.
async fn step(scripts: &Arc<Inner>, mut leg: Leg, report: &mut Report) -> Vec<Leg> {
    let Some(nodes) = &scripts.nodes else {
        return Vec::new();
    };
    let stamp = *leg
        .stamp
        .get_or_insert_with(|| Stamp::new(scripts.deadline(), &scripts.stalls));
    if leg.hops > MAX_HOPS || (leg.hops > 0 && Instant::now() >= stamp.give_up()) {
        // Never sent: nothing charged; the route's policy answers.
        report.decided = false;
        let e = StoreError::Unavailable("cluster slots on the move past the deadline".into());
        fail(leg.jobs, &e);
        return Vec::new();
    }
    let which = match (leg.jobs.len(), leg.cross) {
        (1, _) => Which::One,
        (_, true) => Which::LeanCross,
        _ => Which::Lean,
    };
    report.calls += 1;
    let tried = attempt(&leg.node, scripts, &leg.jobs, which, stamp, leg.asking).await;
    if let Some(kind) = tried.redirected {
        report.saw(kind);
    }
    let mut items = match tried.reply {
        Ok(items) if !items.is_empty() && items.len() <= leg.jobs.len() => items,
        Ok(other) => {
            report.decided = false;
            let e = StoreError::Protocol(format!("batch script: unexpected {other:?}"));
            fail(leg.jobs, &e);
            return Vec::new();
        }
        // Run too late, nothing charged: once more, as `deciding` does.
        Err(StoreError::Late) if !leg.late_again => {
            leg.late_again = true;
            leg.stamp = Some(stamp.after_late(scripts.deadline(), &scripts.stalls));
            return vec![leg];
        }
        // The same error, not caught by the script: it reads every key
        // before it writes any, so nothing was charged.
        Err(StoreError::Script(e) | StoreError::Redis(e))
            if which == Which::LeanCross && not_local_text(&e) =>
        {
            report.saw("not local");
            nodes.resync();
            let jobs = std::mem::take(&mut leg.jobs);
            return per_slot(nodes, jobs, &leg);
        }
        Err(e) if which == Which::LeanCross && refuses_flag(&e) => {
            // Refused before it ran: per slot, now and from now on.
            scripts.cross.refuse(&e);
            let jobs = std::mem::take(&mut leg.jobs);
            return per_slot(nodes, jobs, &leg);
        }
        Err(e) => {
            return match redirect(&e) {
                Some(Redirect::To(host, port, ask)) => {
                    report.saw(if ask { "ASK" } else { "MOVED" });
                    match nodes.pool(&host, port) {
                        Ok(node) => {
                            let jobs = std::mem::take(&mut leg.jobs);
                            vec![leg.after(node, jobs, leg.cross, ask)]
                        }
                        Err(e) => {
                            report.decided = false;
                            fail(leg.jobs, &e);
                            Vec::new()
                        }
                    }
                }
                Some(Redirect::Split) if leg.jobs.len() > 1 => {
                    report.saw("TRYAGAIN");
                    let jobs = std::mem::take(&mut leg.jobs);
                    jobs.into_iter()
                        .map(|job| leg.after(leg.node.clone(), vec![job], false, leg.asking))
                        .collect()
                }
                _ => {
                    report.decided = false;
                    fail(leg.jobs, &e);
                    Vec::new()
                }
            };
        }
    };
    // A flagged call whose key was not its node's: the checks from it on
    // did not run, and go per slot.
    let moved = leg.cross && items.last().is_some_and(not_local);
    if moved {
        items.pop();
    }
    let (rest, last) = hand_out(std::mem::take(&mut leg.jobs), items);
    if moved {
        report.saw("not local");
        nodes.resync();
        return per_slot(nodes, rest, &leg);
    }
    match last {
        Some(Ok(_)) if rest.is_empty() => Vec::new(),
        // One check's data or numbers: the checks after it were not run,
        // and are decided in another call.
        Some(Err(StoreError::Script(_))) if !rest.is_empty() => {
            leg.jobs = rest;
            vec![leg]
        }
        Some(Err(StoreError::Script(_))) => Vec::new(),
        Some(Err(e)) => {
            report.decided = false;
            fail(rest, &e);
            Vec::new()
        }
        _ => {
            report.decided = false;
            fail(
                rest,
                &StoreError::Protocol("batch script: short reply".into()),
            );
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirections_read() {
        let moved = StoreError::Redis("Cluster Error: MOVED 3999 127.0.0.1:6381".into());
        assert!(matches!(redirect(&moved), Some(Redirect::To(h, 6381, false)) if h == "127.0.0.1"));
        let ask = StoreError::Redis("Cluster Error: ASK 3999 127.0.0.1:6382".into());
        assert!(matches!(redirect(&ask), Some(Redirect::To(_, 6382, true))));
        let again = StoreError::Redis(
            "Unknown Error: TRYAGAIN Multiple keys request during rehashing of slot".into(),
        );
        assert!(matches!(redirect(&again), Some(Redirect::Split)));
        assert!(redirect(&StoreError::Redis("OOM command not allowed".into())).is_none());
        assert!(redirect(&StoreError::Timeout).is_none());
    }

    #[test]
    fn a_key_not_local_is_told_from_a_check_error() {
        use fred::types::Value;
        let text = "ERR Script attempted to access a non local key in a cluster node";
        assert!(not_local(&Value::from(text)));
        assert!(!not_local(&Value::from(
            "WRONGTYPE Operation against a key"
        )));
        assert!(!not_local(&Value::Integer(4000)));
    }
}
