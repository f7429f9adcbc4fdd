//! Scoring a replay: every answer the layer gave, next to the reference's
//! decision for the same key at the same moment.

use std::collections::HashMap;

use crate::reference::{Algo, Reference};

/// One request as the layer answered it.
#[derive(Clone, Debug)]
pub struct Obs {
    /// The key's index in the scenario.
    pub key: usize,
    /// Sent and answered, seconds on the store's clock (equal on a
    /// virtual timeline).
    pub t0: f64,
    pub t1: f64,
    pub cost: f64,
    pub admitted: bool,
    /// It carried rate-limit headers: a store decided it (Redis, or the
    /// `local` share), not the failure policy alone.
    pub decided: bool,
}

/// Something that happens to the reference between requests.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // the Redis scenarios send them
pub enum Event {
    /// `fleetlimit reset` of a key at `t`.
    Reset { key: usize, t: f64 },
    /// The key's plan changes at `t`.
    Plan { key: usize, t: f64, algo: Algo },
}

#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub offered: u64,
    pub wrong_admitted: u64,
    pub wrong_refused: u64,
    /// Disagreements some moment between sending and answering explains:
    /// the reference takes the layer's decision and goes on.
    pub jitter: u64,
    /// Disagreements that give back a unit an earlier one of the key
    /// took the other way (`Echo`): not a second bend.
    pub echo: u64,
    /// Admitted by the layer, and by the reference replaying the same
    /// requests on its own (never following the layer): the net effect.
    pub admitted: u64,
    pub exact_admitted: u64,
}

/// Replays `obs` (in order of the middle of their intervals) through a
/// reference per key, `algo(key)` its numbers.
pub fn score(mut obs: Vec<Obs>, events: &[Event], algo: impl Fn(usize) -> Algo) -> Tally {
    obs.sort_by(|a, b| (a.t0 + a.t1).total_cmp(&(b.t0 + b.t1)));
    let mut events: Vec<Event> = events.to_vec();
    events.sort_by(|a, b| at(a).total_cmp(&at(b)));
    let mut events = events.into_iter().peekable();
    let mut refs: HashMap<usize, Bracket> = HashMap::new();
    let mut free: HashMap<usize, Reference> = HashMap::new();
    let mut t = Tally::default();
    // Later admissions of each key, for the lookahead below.
    let mut of_key: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, o) in obs.iter().enumerate() {
        of_key.entry(o.key).or_default().push(i);
    }
    let mut seen: HashMap<usize, usize> = HashMap::new();
    // Each key's last admissions the reference took, for the same.
    let mut taken: HashMap<usize, Vec<(f64, f64)>> = HashMap::new();
    let half = obs.iter().map(|o| (o.t1 - o.t0) / 2.0).fold(0.0, f64::max);
    // Per key, units the store spent that the reference did not (less
    // the other way), through the disagreements the store decided.
    let mut echo: HashMap<usize, f64> = HashMap::new();
    for o in &obs {
        let n = seen.entry(o.key).or_default();
        let later = &of_key[&o.key][*n + 1..];
        *n += 1;
        let mid = (o.t0 + o.t1) / 2.0;
        while let Some(e) = events.next_if(|e| at(e) <= mid) {
            match e {
                Event::Reset { key, .. } => {
                    if let Some(b) = refs.get_mut(&key) {
                        b.each(Reference::reset);
                    }
                    if let Some(r) = free.get_mut(&key) {
                        r.reset();
                    }
                    echo.remove(&key);
                }
                Event::Plan { key, algo: a, .. } => {
                    refs.entry(key)
                        .or_insert_with(|| Bracket::new(a))
                        .each(|r| r.set_algo(a));
                    free.entry(key)
                        .or_insert_with(|| Reference::new(a))
                        .set_algo(a);
                }
            }
        }
        let r = refs
            .entry(o.key)
            .or_insert_with(|| Bracket::new(algo(o.key)));
        t.offered += 1;
        t.admitted += u64::from(o.admitted);
        let f = free
            .entry(o.key)
            .or_insert_with(|| Reference::new(algo(o.key)));
        if f.fits(mid, o.cost) {
            f.charge(mid, o.cost);
            t.exact_admitted += 1;
        }
        let exact = r.mid.fits(mid, o.cost);
        if exact == o.admitted {
            if exact {
                r.charge(o);
                remember(&mut taken, o);
            }
            continue;
        }
        // Reachable at either end of the interval: timing, not a bend.
        // A refusal is also explained by admissions of the key that come
        // later in this order but were in flight before it was answered:
        // Redis may have run them first.
        let pending: f64 = later
            .iter()
            .map(|&j| &obs[j])
            .take_while(|p| (p.t0 + p.t1) / 2.0 <= o.t1 + half)
            .filter(|p| p.admitted && p.t0 <= o.t1)
            .map(|p| p.cost)
            .sum();
        // An admission, by admissions the reference took before it that
        // were answered after it was sent: Redis may have run it first.
        let back: f64 = taken
            .get(&o.key)
            .map_or(0.0, |v| v.iter().filter(|p| p.0 >= o.t0).map(|p| p.1).sum());
        let explained = r.refs().into_iter().any(|r| {
            [o.t0, o.t1].iter().any(|&x| {
                r.fits(x, o.cost) == o.admitted
                    || (!o.admitted && !r.fits(x, o.cost + pending))
                    || (o.admitted && r.fits(x, o.cost - back))
            })
        });
        if explained {
            t.jitter += 1;
        } else {
            t.count(echo.entry(o.key).or_default(), o);
        }
        // Timing: the reference takes the layer's decision. A bend: it
        // keeps its own, so a unit the layer misplaced is counted once
        // (an admission it had no room for does not put it in debt, a
        // refusal it had room for spends that room), not again in every
        // later request it would change.
        if explained == o.admitted {
            r.charge(o);
            remember(&mut taken, o);
        }
    }
    t
}

impl Tally {
    /// Counts a disagreement no timing explains: wrong, or the echo of an
    /// earlier one. `gap` is the key's units the store spent that the
    /// reference did not, less the other way: a disagreement the store
    /// decided that closes it only repays what an earlier one took (the
    /// reference kept its own decision then, so as not to count that bend
    /// again in every later request).
    pub fn count(&mut self, gap: &mut f64, o: &Obs) {
        let closes = if o.admitted {
            *gap <= -o.cost
        } else {
            *gap >= o.cost
        };
        if o.decided && closes {
            self.echo += 1;
        } else if o.admitted {
            self.wrong_admitted += 1;
        } else {
            self.wrong_refused += 1;
        }
        if o.decided {
            *gap += if o.admitted { o.cost } else { -o.cost };
        }
    }
}

/// A key's reference three times over: every request the reference takes
/// charged at the middle of its interval (`mid`, the one that decides),
/// and those a store decided charged at their sending (`early`) or at
/// their answer (`late`) instead: Redis decided each at some instant in
/// its interval, and the state the next request meets depends on which.
/// A failure policy's answer is at its middle in all three: no store
/// decided it.
#[derive(Clone, Debug)]
pub struct Bracket {
    pub mid: Reference,
    early: Reference,
    late: Reference,
}

impl Bracket {
    pub fn new(a: Algo) -> Self {
        let r = Reference::new(a);
        Self {
            mid: r.clone(),
            early: r.clone(),
            late: r,
        }
    }

    pub fn charge(&mut self, o: &Obs) {
        let mid = (o.t0 + o.t1) / 2.0;
        let (early, late) = if o.decided { (o.t0, o.t1) } else { (mid, mid) };
        self.mid.charge(mid, o.cost);
        self.early.charge(early, o.cost);
        self.late.charge(late, o.cost);
    }

    /// The three: `mid`, `early`, `late`.
    pub fn refs(&self) -> [&Reference; 3] {
        [&self.mid, &self.early, &self.late]
    }

    fn each(&mut self, f: impl Fn(&mut Reference)) {
        for r in [&mut self.mid, &mut self.early, &mut self.late] {
            f(r);
        }
    }
}

fn at(e: &Event) -> f64 {
    match *e {
        Event::Reset { t, .. } | Event::Plan { t, .. } => t,
    }
}

/// Keeps the last 64 admissions of a key the reference took.
fn remember(taken: &mut HashMap<usize, Vec<(f64, f64)>>, o: &Obs) {
    let v = taken.entry(o.key).or_default();
    if v.len() == 64 {
        v.remove(0);
    }
    v.push((o.t1, o.cost));
}
