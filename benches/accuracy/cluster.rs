//! A cross-slot route on a Redis Cluster: a per-tenant limit and a
//! `global` one live in different slots, so they are decided in order,
//! one call per slot, the earlier charge refunded when a later call
//! refuses (docs/algorithms.md). The reference decides both at once.

use std::collections::HashMap;

use crate::Rng;
use crate::fleet::{Fleet, observations, poisson};
use crate::reference::{Algo, Reference};
use crate::report::Row;
use crate::score::{Bracket, Obs, Tally};
use crate::support::{RedisCluster, cluster_config, prefix};

const TENANT: Algo = Algo::Token {
    capacity: 20.0,
    refill: 10.0,
};
const GLOBAL: Algo = Algo::Token {
    capacity: 30.0,
    refill: 15.0,
};

const LIMITS: &str = r#"
[fleet]
size = 3

[limits.tenant]
key = "header:x-api-key"
capacity = 20
refill = "10/s"

[limits.all]
key = "global"
capacity = 30
refill = "15/s"

[[routes]]
path = "/tb"
limits = ["tenant", "all"]
on_redis_error = "closed"
"#;

/// 4 tenants at 6/s each (the global limit, 15/s, refuses most of what
/// is refused) through three instances for 4 s.
pub async fn cross_slot(rng: &mut Rng) -> Vec<Row> {
    let cluster = RedisCluster::start();
    let cfg = || cluster_config(&cluster, &prefix("cross-slot"), "50ms", LIMITS);
    let fleet = Fleet::start(cfg, 3).await;
    let mut schedule = Vec::new();
    for k in 0..4 {
        schedule.extend(poisson(rng, 6.0, (0.2, 4.2), "/tb", k, 3));
    }
    let answers = fleet.replay(schedule).await;
    let policy = answers.iter().filter(|a| !a.obs.decided).count();
    let obs = observations(&answers);
    // A refund is one round trip after its charge: the requests whose
    // interval overlaps a refused one's may see its units spent.
    let refused: Vec<&Obs> = obs.iter().filter(|o| !o.admitted).collect();
    let exposed = obs
        .iter()
        .filter(|o| {
            refused
                .iter()
                .any(|r| !std::ptr::eq(*r, *o) && o.t0 <= r.t1 && r.t0 <= o.t1)
        })
        .count() as u64;
    let tally = score_pair(obs);
    vec![Row {
        scenario: "cross-slot route (tenant + global) on a 3-primary Cluster".into(),
        tally,
        net: false,
        bound_admitted: 0,
        bound_refused: exposed,
        bound_why: format!(
            "admitted: none (refunds only over-count); refused: requests in flight beside a refused one, whose charge is refunded a round trip later ({exposed})"
        ),
        note: if policy > 0 {
            format!("{policy} answered by the failure policy")
        } else {
            String::new()
        },
    }]
}

/// As `score::score`, for a route of two limits decided all or nothing:
/// the tenant's bucket and one global bucket.
fn score_pair(mut obs: Vec<Obs>) -> Tally {
    obs.sort_by(|a, b| (a.t0 + a.t1).total_cmp(&(b.t0 + b.t1)));
    let mut tenants: HashMap<usize, Bracket> = HashMap::new();
    let mut global = Bracket::new(GLOBAL);
    let (mut free_t, mut free_g) = (HashMap::new(), Reference::new(GLOBAL));
    let mut gaps: HashMap<usize, f64> = HashMap::new();
    let mut t = Tally::default();
    for o in &obs {
        let mid = (o.t0 + o.t1) / 2.0;
        t.offered += 1;
        t.admitted += u64::from(o.admitted);
        let ft: &mut Reference = free_t
            .entry(o.key)
            .or_insert_with(|| Reference::new(TENANT));
        if ft.fits(mid, o.cost) && free_g.fits(mid, o.cost) {
            ft.charge(mid, o.cost);
            free_g.charge(mid, o.cost);
            t.exact_admitted += 1;
        }
        let r = tenants.entry(o.key).or_insert_with(|| Bracket::new(TENANT));
        // The tenant's and the global reference charged alike (both mid,
        // both early, both late).
        let fits =
            |v: usize, x: f64| r.refs()[v].fits(x, o.cost) && global.refs()[v].fits(x, o.cost);
        let exact = fits(0, mid);
        let explained = exact == o.admitted
            || (0..3).any(|v| [o.t0, o.t1].iter().any(|&x| fits(v, x) == o.admitted));
        if !explained {
            // The echo of an earlier disagreement of the same tenant (its
            // unit is on the global limit too).
            t.count(gaps.entry(o.key).or_default(), o);
        } else if exact != o.admitted {
            t.jitter += 1;
        }
        // As `score`: timing takes the layer's decision, a bend keeps the
        // reference's own.
        let charge = if explained { o.admitted } else { exact };
        if charge {
            r.charge(o);
            global.charge(o);
        }
    }
    t
}
