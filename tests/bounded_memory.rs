//! Bounded memory under attack: a million distinct keys invented by clients
//! leave the in-process store (the embedded default and the `local`
//! fallback) within its bound, and the busy keys stay limited exactly.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use fleetlimit::store::{Bucket, Check, MemoryStore, Outcome, Rule, Store};

/// The in-process store's answer: its future is ready at once.
fn check_now(store: &MemoryStore, check: &Check) -> Outcome {
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::pin!(store.check(check)).poll(&mut cx) {
        Poll::Ready(outcome) => outcome.expect("the in-process store never fails"),
        Poll::Pending => panic!("the in-process store answered later"),
    }
}

fn check(key: String) -> Check {
    Check {
        slot: None,
        cost: 1.0,
        buckets: vec![Bucket {
            key,
            rule: Rule::TokenBucket {
                capacity: 50.0,
                refill_per_sec: 1e-9,
            },
            shadow: false,
        }],
    }
}

#[test]
fn a_million_invented_keys_stay_within_the_bound() {
    const BOUND: usize = 10_000;
    let store = MemoryStore::new(BOUND);
    let busy: Vec<String> = (0..10)
        .map(|i| format!("rl:per-key:{{h:busy-{i}}}"))
        .collect();
    let mut admitted = vec![0usize; busy.len()];
    let mut most = 0;
    for i in 0..1_000_000u32 {
        let _ = check_now(&store, &check(format!("rl:per-key:{{h:junk-{i}}}")));
        // The busy keys keep coming back, far over their limit.
        if i % 100 == 0 {
            for (b, n) in busy.iter().zip(&mut admitted) {
                *n += usize::from(check_now(&store, &check(b.clone())).allowed);
            }
        }
        if i % 10_000 == 0 {
            most = most.max(store.len());
        }
    }
    most = most.max(store.len());
    // Each of the 16 shards may overshoot its share by the one key that
    // triggers its sweep.
    assert!(most <= BOUND + 16, "held {most} keys, bound {BOUND}");
    // 10,000 visits each, 50 admitted each: no busy key was ever forgotten.
    assert_eq!(admitted, vec![50; busy.len()]);
}
