//! The background exchange: each instance, every quarter interval, reads
//! its region's shares into its view (`share.rs`); at each interval's end
//! it publishes the demand it counted; a quarter interval later, the one
//! instance holding the region's lock moves quota.
//!
//! A cycle, for each global limit, in region X:
//! 1. read X's shares, generation, demand of the interval just ended, and
//!    the same of every other region reachable within a quarter interval;
//! 2. moves what was held long enough to `given` (cumulative), and pushes
//!    each receiver its total: the receiver rescales the key's bucket
//!    (tokens kept), then raises its share by what it has not yet received
//!    (a compare-and-set on its share and on what it had received);
//! 3. for each key some region asked for, or whose shares moved: the
//!    targets (`targets.rs`), the same in every region that sees the same
//!    figures; when X holds more than its target by at least
//!    [`HYSTERESIS`] and has no hand-off of the key under way, it lowers its
//!    share (a compare-and-set on the share it read) and holds the excess
//!    for the receivers for longer than any view is trusted;
//! 4. after X's Redis restarted empty, claims the keys it meets unclaimed
//!    (`generation.rs`).
//!
//! Nothing in a cycle can raise a sum of shares: a share rises only by a
//! push, by at most what another region gave, once (the totals are
//! cumulative), after that region lowered its own.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::clients::Pool;
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::time::Instant;

use super::Generation;
use super::agreement::{AGE, agree, field, report};
use super::calls::{SCRIPT, eval, hash, join_all, map, options, ppm, quarter, step, step_for};
use super::contact::note;
use super::generation::{candidate, claim, mark, noticed, shared_keys};
use super::handoff::{Gift, give, hand_over};
use super::share::{Quota, Runtime};
use super::stranded::{live, on_behalf, stranded};
use super::targets::{split_excess, targets};
use crate::config::RedisSettings;
use crate::route::WHOLE;
use crate::store::redis::connect::{build_pool, fred_config};

/// The least excess a region gives away: smaller moves are churn.
pub(crate) const HYSTERESIS: u32 = WHOLE / 100;
/// The most keys a cycle considers per limit, and an instance publishes
/// per limit and interval: exchange traffic is bounded per interval.
pub(crate) const MAX_KEYS: usize = 1000;
/// Reads this region's shares once (so requests are decided on them as
/// soon as the layer is built, Redis up), then starts this instance's
/// exchange; it ends with the runtime.
pub(crate) async fn start(rt: &Arc<Runtime>, own: Pool, prefix: Arc<str>, instance: Arc<str>) {
    let links = connect_links(rt);
    if own.is_connected() {
        // Agreement before trust: the other regions' rules first, so that
        // an instance whose rule differs decides with the smaller one from
        // its first request.
        let wait = links.iter().flatten().map(|l| async {
            let _ = tokio::time::timeout(quarter(rt), l.wait_for_connect()).await;
        });
        join_all(wait).await;
        for q in rt.quotas.iter() {
            let h = hash(&prefix, &q.name, "gen");
            let reads = links.iter().map(|link| async {
                let v = eval(
                    rt,
                    link.as_ref()?,
                    SCRIPT,
                    vec![h.clone()],
                    step("read", [0.into()]),
                );
                Some(map(v.await.ok()?.into_array().into_iter().next()?))
            });
            let read = join_all(reads).await;
            note(rt, q, &own, &prefix, &read).await;
        }
        refresh(rt, &own, &prefix).await;
    }
    let weak = Arc::downgrade(rt);
    tokio::spawn(run(weak, own, links, prefix, instance));
}

/// A pool of one to each other region (`None` for this one, or a link
/// whose URL fred refuses: that region is unreachable).
fn connect_links(rt: &Runtime) -> Vec<Option<Pool>> {
    let timeout = quarter(rt);
    let r = &rt.regions;
    r.links
        .iter()
        .enumerate()
        .map(|(i, url)| {
            if i == r.this {
                return None;
            }
            let settings = RedisSettings {
                url: url.clone(),
                ..RedisSettings::default()
            };
            let pool = fred_config(&settings)
                .and_then(|(c, _)| build_pool(c, 1, timeout, timeout))
                .map_err(|e| {
                    tracing::warn!(target: "fleetlimit", region = &*r.names[i], error = %e, "the exchange cannot reach this region");
                })
                .ok()?;
            let _ = pool.connect_pool();
            Some(pool)
        })
        .collect()
}

fn unix_ms() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn run(
    rt: Weak<Runtime>,
    own: Pool,
    links: Vec<Option<Pool>>,
    prefix: Arc<str>,
    instance: Arc<str>,
) {
    let links = Arc::new(links);
    loop {
        let Some(q) = rt.upgrade().map(|r| quarter(&r)) else {
            return;
        };
        // Quarters aligned on the wall clock, so a region's instances
        // publish and exchange in step (an interval is `4 × q`).
        let q_ms = u64::try_from(q.as_millis()).unwrap_or(1).max(1);
        let now = unix_ms();
        tokio::time::sleep(Duration::from_millis(q_ms - now % q_ms)).await;
        let Some(rt) = rt.upgrade() else {
            return;
        };
        let tick = unix_ms() / q_ms;
        // A restart of this region's Redis is claimed from at once, lock
        // or not: its keys are refused here until then.
        let restarted = refresh(&rt, &own, &prefix).await;
        if tick % 4 == 0 {
            publish(&rt, &own, &prefix, tick / 4 - 1).await;
        }
        match tick % 4 {
            _ if restarted => {}
            1 if lock(&rt, &own, &prefix, &instance).await => {}
            _ => continue,
        }
        let (rt, own, links, prefix) = (
            Arc::clone(&rt),
            own.clone(),
            Arc::clone(&links),
            Arc::clone(&prefix),
        );
        // Its own task: views keep being read meanwhile.
        tokio::spawn(async move {
            let epoch = tick / 4 - 1;
            for quota in rt.quotas.iter() {
                let mine = (rt.regions.this, &own, &links[..]);
                for y in cycle(&rt, quota, mine, &prefix, epoch).await {
                    let Some((link, others)) = on_behalf(&rt, &own, &links, y) else {
                        continue;
                    };
                    let _ = cycle(&rt, quota, (y, &link, &others), &prefix, epoch).await;
                }
            }
            rt.stats.cycles.fetch_add(1, Ordering::Relaxed);
            rt.metrics.cycle();
        });
    }
}

/// Reads this region's shares of every global limit into the views;
/// whether its generation changed (its Redis restarted empty).
async fn refresh(rt: &Runtime, own: &Pool, prefix: &str) -> bool {
    let mut restarted = false;
    // One call per limit: a Cluster puts each limit's hashes on its slot.
    for q in rt.quotas.iter() {
        let keys = vec![hash(prefix, &q.name, "share"), hash(prefix, &q.name, "gen")];
        let known = q.generation().id;
        let age = i64::try_from((rt.regions.interval * AGE).as_millis()).unwrap_or(i64::MAX);
        let args = [
            0.into(),
            2.into(),
            (*known).into(),
            candidate().into(),
            field(&rt.regions, &q.fingerprint).into(),
            age.into(),
        ];
        let sent = Instant::now();
        match eval(rt, own, SCRIPT, keys, step("read", args)).await {
            Ok(v) => {
                let mut it = v.into_array().into_iter().map(map);
                let shares = it
                    .next()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k.into_boxed_str(), ppm(&v)))
                    .collect::<HashMap<_, _>>();
                q.metrics.shares_held(shares.len());
                let gen_hash = it.next().unwrap_or_default();
                let generation = Generation::read(&gen_hash);
                let own = (&*q.name, q.rule, &*q.split, &*q.fingerprint);
                let agreement = agree(own, &rt.regions, gen_hash.keys());
                let said = (&*q.name, &q.metrics, &q.warned);
                report(said, &rt.regions, agreement.as_ref());
                let view = (generation.clone(), agreement);
                let old = q.set_view(shares, view, sent, rt.trusted_for());
                restarted |= noticed(rt, q, &old, &generation);
            }
            Err(e) => {
                tracing::debug!(target: "fleetlimit", limit = &*q.name, error = %e, "this region's quotas could not be read; the last view stands until it is too old");
            }
        }
    }
    restarted
}

/// Adds what this instance counted in interval `epoch` to its region's
/// demand of that interval (kept four intervals).
async fn publish(rt: &Runtime, own: &Pool, prefix: &str, epoch: u64) {
    for q in rt.quotas.iter() {
        let demand = q.take_demand(MAX_KEYS);
        if demand.is_empty() {
            continue;
        }
        let key = hash(prefix, &q.name, &format!("demand:{epoch}"));
        let pairs = demand.into_iter().flat_map(|(k, n)| {
            [
                Value::from(String::from(k)),
                Value::from(i64::try_from(n).unwrap_or(i64::MAX)),
            ]
        });
        let args = step_for(rt.regions.interval * 4, "count", pairs);
        if let Err(e) = eval(rt, own, SCRIPT, vec![key], args).await {
            tracing::debug!(target: "fleetlimit", limit = &*q.name, error = %e, "demand not published");
        }
    }
}

/// Whether this instance runs its region's cycle now (a lock in its
/// Redis for half an interval). Two cycles at once would only repeat
/// each other: every change is a compare-and-set.
async fn lock(rt: &Runtime, own: &Pool, prefix: &str, instance: &str) -> bool {
    let key = format!("{prefix}:regions:lock");
    let half = i64::try_from((rt.regions.interval / 2).as_millis()).unwrap_or(i64::MAX);
    let slot = ClusterHash::Custom(fred::util::redis_keyslot(key.as_bytes()));
    let cmd = CustomCommand::new_static("SET", slot, false);
    let args: Vec<Value> = vec![
        key.into(),
        instance.into(),
        "NX".into(),
        "PX".into(),
        half.max(1).into(),
    ];
    rt.stats.calls.fetch_add(1, Ordering::Relaxed);
    rt.metrics.call();
    matches!(
        own.with_options(&options(rt))
            .custom::<Value, _>(cmd, args)
            .await,
        Ok(Value::String(_))
    )
}

/// One region's shares, demand and generation, as a cycle read them.
struct Seen {
    shares: HashMap<String, String>,
    demand: HashMap<String, String>,
    generation: Generation,
    /// Its `gen` hash (the rules it published).
    gen_hash: HashMap<String, String>,
}

impl Seen {
    /// A key's share there (unclaimed after a restart: none).
    fn share(&self, key: &str, default: u32) -> u32 {
        let absent = if self.generation.restart { 0 } else { default };
        self.shares.get(key).map_or(absent, |s| ppm(s))
    }
    fn demand(&self, key: &str) -> u64 {
        self.demand
            .get(key)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

/// One cycle of one global limit (see the module's text), for region
/// `x`: this one, or one with no live instance (`own`: its Redis, `links`:
/// every other's). Returns, for this region's own cycle, the regions that
/// this one should run the cycle of (`stranded.rs`).
async fn cycle(
    rt: &Runtime,
    quota: &Quota,
    (x, own, links): (usize, &Pool, &[Option<Pool>]),
    prefix: &str,
    epoch: u64,
) -> Vec<usize> {
    let r = &rt.regions;
    let own_cycle = x == r.this;
    let name = &*quota.name;
    let h = |part: &str| hash(prefix, name, part);
    let demand_key = h(&format!("demand:{epoch}"));
    // 1. What every reachable region holds and asked for; what this one
    //    holds for others and has not seen received.
    let own_keys = vec![
        h("share"),
        h("held"),
        h("pending"),
        h("gen"),
        h("seen"),
        demand_key.clone(),
    ];
    let known = if own_cycle {
        quota.generation().id
    } else {
        "".into()
    };
    let args = [5.into(), 4.into(), (*known).into(), candidate().into()];
    let Ok(v) = eval(rt, own, SCRIPT, own_keys, step("read", args)).await else {
        return Vec::new();
    };
    let mut it = v.into_array().into_iter().map(map);
    // Held and pending are read to be kept alive; the release reads them.
    let (shares, _held, _pending, generation, known, demand) = (
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
        Generation::read(&it.next().unwrap_or_default()),
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
    );
    let reads = links.iter().map(|link| async {
        let keys = vec![h("share"), demand_key.clone(), h("gen")];
        let v = eval(rt, link.as_ref()?, SCRIPT, keys, step("read", [0.into()])).await;
        let mut it = v.ok()?.into_array().into_iter().map(map);
        let (shares, demand, gen_hash) = (
            it.next().unwrap_or_default(),
            it.next().unwrap_or_default(),
            it.next().unwrap_or_default(),
        );
        Some(Seen {
            shares,
            demand,
            generation: Generation::read(&gen_hash),
            gen_hash,
        })
    });
    let mut seen: Vec<Option<Seen>> = join_all(reads).await;
    let rules: Vec<Option<HashMap<String, String>>> = (seen.iter_mut())
        .map(|s| Some(std::mem::take(&mut s.as_mut()?.gen_hash)))
        .collect();
    let live = live(rt, x, &rules);
    if own_cycle {
        note(rt, quota, own, prefix, &rules).await;
    }
    let split = quota.split_now();
    seen[x] = Some(Seen {
        shares,
        demand,
        generation,
        gen_hash: HashMap::new(),
    });
    // A region whose Redis restarted with none of its instances left to
    // notice: this one knew its older generation.
    for (y, s) in seen.iter_mut().enumerate() {
        let (Some(s), Some(link)) = (s.as_mut(), links[y].as_ref()) else {
            continue;
        };
        let was = known.get(&*r.names[y]);
        if !s.generation.restart && was.is_some_and(|g| **g != *s.generation.id) {
            s.generation.restart = mark(rt, link, &h("gen"), &s.generation.id).await;
        }
    }

    let gen_id: Arc<str> = Arc::clone(&seen[x].as_ref().expect("this region").generation.id);

    // 2. Release what was held long enough; push every total not yet
    //    acknowledged. First, so that a key whose quota landed is weighed
    //    again in this cycle, with what landed.
    let Some(handed) = hand_over(rt, quota, (x, own, links), prefix, &gen_id).await else {
        return Vec::new();
    };
    for ((key, y), n) in handed.landed {
        if let Some(s) = seen[y].as_mut() {
            let now = s.share(&key, split[y]);
            s.shares
                .insert(key, now.saturating_add(n).min(WHOLE).to_string());
        }
    }
    if own_cycle {
        quota.in_flight.store(handed.in_flight, Ordering::Relaxed);
        quota.metrics.in_flight(handed.in_flight);
    }

    // 3. Keys to consider: asked for anywhere, or away from the split here;
    //    none with a hand-off of this region's under way.
    let mut asked: HashMap<&str, u64> = HashMap::new();
    for s in seen.iter().flatten() {
        for (k, n) in &s.demand {
            *asked.entry(k).or_default() += n.parse::<u64>().unwrap_or(0);
        }
    }
    let mut keys: Vec<&str> = asked.keys().copied().collect();
    if keys.len() > MAX_KEYS {
        keys.select_nth_unstable_by(MAX_KEYS, |a, b| asked[b].cmp(&asked[a]));
        keys.truncate(MAX_KEYS);
    }
    let mine = seen[x].as_ref().expect("this region's read");
    let mut keys: BTreeSet<&str> = keys.into_iter().collect();
    keys.extend(mine.shares.keys().take(MAX_KEYS).map(String::as_str));
    if mine.generation.restart {
        let others = seen.iter().enumerate().filter(|(y, _)| *y != x);
        shared_keys(
            &mut keys,
            others.filter_map(|(_, s)| Some(&s.as_ref()?.shares)),
            MAX_KEYS,
        );
    }
    let busy: BTreeSet<&str> = (handed.held.keys().chain(&handed.unacked))
        .map(String::as_str)
        .filter_map(|f| Some(f.rsplit_once('|')?.0))
        .collect();
    // A Redis restarted less than two intervals ago lost this region's
    // demand with it: it would look idle and give its quota away.
    let young = mine.generation.restart
        && unix_ms()
            < mine.generation.born + u64::try_from((r.interval * 2).as_millis()).unwrap_or(0);
    let mut unclaimed = Vec::new();
    for key in keys {
        if busy.contains(key) {
            continue;
        }
        if mine.generation.restart && !mine.shares.contains_key(key) {
            unclaimed.push(key);
            continue;
        }
        let shares: Vec<Option<u32>> = seen
            .iter()
            .enumerate()
            .map(|(y, s)| s.as_ref().map(|s| s.share(key, split[y])))
            .collect();
        let offered: Vec<u64> = seen
            .iter()
            .map(|s| s.as_ref().map_or(0, |s| s.demand(key)))
            .collect();
        let targets = targets(&shares, &offered, &split, &live);
        let (Some(have), Some(want)) = (shares[x], targets[x]) else {
            continue;
        };
        let excess = have.saturating_sub(want);
        if excess < HYSTERESIS || young {
            continue;
        }
        let gifts = split_excess(excess, &shares, &targets);
        let total: u32 = gifts.iter().map(|g| g.1).sum();
        if total > 0 {
            let read = mine.shares.get(key).map_or("", String::as_str);
            let gift = Gift {
                x,
                key,
                read,
                generation: &gen_id,
                new: have - total,
                gifts: &gifts,
            };
            give(rt, quota, own, prefix, gift).await;
        }
    }
    if own_cycle {
        claim(rt, quota, own, links, prefix, &gen_id, &unclaimed).await;
    }
    // A receiver whose Redis restarted refuses pushes of a key until it
    // claims it: once more a quarter interval later, not an interval.
    let to_restarted = handed.unacked.iter().any(|f| {
        let to = f.rsplit_once('|').map_or("", |(_, to)| to);
        let y = r.names.iter().position(|n| **n == *to);
        y.and_then(|y| seen[y].as_ref())
            .is_some_and(|s| s.generation.restart)
    });
    if to_restarted {
        tokio::time::sleep(quarter(rt)).await;
        let _ = hand_over(rt, quota, (x, own, links), prefix, &gen_id).await;
    }
    if own_cycle {
        stranded(r, &live, &seen)
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_region_asking_gets_nearly_all() {
        let s = [Some(333_333), Some(333_333), Some(333_333)];
        let t = targets(&s, &[100, 0, 0], &[333_333; 3], &[true; 3]);
        let a = t[0].unwrap();
        assert!(a >= 950_000, "{a}");
        assert!(t.iter().flatten().map(|&x| u64::from(x)).sum::<u64>() <= 999_999);
    }

    #[test]
    fn demand_splits_in_proportion() {
        let s = [Some(333_333), Some(333_333), Some(333_333)];
        let t = targets(&s, &[60, 30, 10], &[333_333; 3], &[true; 3]);
        assert_eq!(t, vec![Some(599_999), Some(299_999), Some(99_999)]);
    }

    #[test]
    fn nobody_asking_goes_back_to_the_split() {
        let s = [Some(900_000), Some(50_000), Some(50_000)];
        let t = targets(&s, &[0, 0, 0], &[500_000, 300_000, 200_000], &[true; 3]);
        assert_eq!(t, vec![Some(500_000), Some(300_000), Some(200_000)]);
    }

    #[test]
    fn an_unreachable_region_keeps_its_share_out_of_the_sum() {
        let s = [Some(300_000), Some(300_000), None];
        let t = targets(&s, &[10, 0, 1000], &[333_333; 3], &[true; 3]);
        assert_eq!(t[2], None);
        let sum: u32 = t.iter().flatten().sum();
        assert!(sum <= 600_000, "{sum}");
    }

    #[test]
    fn a_region_with_no_live_instance_is_weighed_nothing() {
        let s = [Some(300_000), Some(300_000), Some(400_000)];
        let t = targets(&s, &[10, 10, 0], &[333_333; 3], &[true, true, false]);
        assert_eq!(t, vec![Some(500_000), Some(500_000), Some(0)]);
        let t = targets(&s, &[0, 0, 0], &[333_333; 3], &[true, true, false]);
        assert_eq!(t, vec![Some(500_000), Some(500_000), Some(0)]);
    }

    #[test]
    fn the_excess_goes_to_the_regions_below_target() {
        let s = [Some(333_333), Some(333_333), Some(333_333)];
        let t = [Some(600_000), Some(300_000), Some(100_000)];
        let g = split_excess(233_333, &s, &t);
        assert_eq!(g, vec![(0, 233_333)]);
        let g = split_excess(500_000, &s, &[Some(333_333), Some(600_000), Some(66_666)]);
        assert_eq!(g, vec![(1, 266_667)]);
    }
}
