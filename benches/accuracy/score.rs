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
}

/// Replays `obs` (in order of the middle of their intervals) through a
/// reference per key, `algo(key)` its numbers.
pub fn score(mut obs: Vec<Obs>, events: &[Event], algo: impl Fn(usize) -> Algo) -> Tally {
    obs.sort_by(|a, b| (a.t0 + a.t1).total_cmp(&(b.t0 + b.t1)));
    let mut events: Vec<Event> = events.to_vec();
    events.sort_by(|a, b| at(a).total_cmp(&at(b)));
    let mut events = events.into_iter().peekable();
    let mut refs: HashMap<usize, Reference> = HashMap::new();
    let mut t = Tally::default();
    for o in obs {
        let mid = (o.t0 + o.t1) / 2.0;
        while let Some(e) = events.next_if(|e| at(e) <= mid) {
            match e {
                Event::Reset { key, .. } => {
                    if let Some(r) = refs.get_mut(&key) {
                        r.reset();
                    }
                }
                Event::Plan { key, algo: a, .. } => {
                    refs.entry(key)
                        .or_insert_with(|| Reference::new(a))
                        .set_algo(a);
                }
            }
        }
        let r = refs
            .entry(o.key)
            .or_insert_with(|| Reference::new(algo(o.key)));
        t.offered += 1;
        let exact = r.fits(mid, o.cost);
        if exact == o.admitted {
            if exact {
                r.charge(mid, o.cost);
            }
            continue;
        }
        // Reachable at either end of the interval: timing, not a bend.
        let explained = [o.t0, o.t1]
            .iter()
            .any(|&x| r.fits(x, o.cost) == o.admitted);
        if explained {
            t.jitter += 1;
        } else if o.admitted {
            t.wrong_admitted += 1;
        } else {
            t.wrong_refused += 1;
        }
        // An admission the limit had no room for is counted once, here:
        // charged, it would put the reference in debt and count again as
        // every later admission the debt refuses.
        if o.admitted && explained {
            r.charge(mid, o.cost);
        }
    }
    t
}

fn at(e: &Event) -> f64 {
    match *e {
        Event::Reset { t, .. } | Event::Plan { t, .. } => t,
    }
}
