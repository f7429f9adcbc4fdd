//! One limit after validation: its rule, key, policies and the caches its
//! answers use.

use std::collections::HashMap;
use std::sync::Arc;

use crate::algorithm::Rule;
use crate::answer::{Face, RefusalBodies};
use crate::key::{KeyHead, KeySource};
use crate::log_throttle::Throttle;

use super::{OnExceed, OnMissing, RecordConfig};

/// A named limit: its key, its rule, and other numbers per plan.
#[derive(Debug)]
pub(crate) struct Limit {
    pub(crate) name: Arc<str>,
    /// `<prefix>:<name>:{`, how each of its store keys starts.
    pub(crate) key_head: KeyHead,
    pub(crate) key: KeySource,
    pub(crate) on_missing: OnMissing,
    /// The numbers for callers on no particular plan.
    pub(crate) rule: Rule,
    /// Shadow mode: counted, logged, never refuses.
    pub(crate) shadow: bool,
    /// Plan name → that plan's numbers (same algorithm).
    pub(crate) plans: HashMap<Arc<str>, Rule>,
    /// Hot-key leases (token buckets only).
    pub(crate) lease: Option<LeaseConfig>,
    /// The INFO line of its refusals: decided by Redis, then decided
    /// locally (degraded) — one a second each.
    pub(crate) refusal_log: [Throttle; 2],
    /// Its `429` bodies, built once per `Retry-After`.
    pub(crate) refusal_bodies: RefusalBodies,
    /// The lines of requests answered before the store, one a second each:
    /// a missing key, a cost above capacity, no client address, an invalid
    /// custom key, a custom key that could not be computed.
    /// One throttle per kind of early answer (missing key, cost too high,
    /// no client IP, invalid custom key, custom key unavailable; see
    /// answer/rate.rs).
    pub(crate) early_log: [Throttle; 5],
    /// Counted only when the handler answers one of these statuses
    /// (`count = "failures"`); `None`: every request counts.
    pub(crate) failures: Option<Box<[u16]>>,
    /// What exceeding it does.
    pub(crate) on_exceed: OnExceed,
    /// The INFO lines of its escalations (delayed or challenged), and of
    /// failed refunds of a success, one a second each.
    pub(crate) escalation_log: [Throttle; 2],
    /// Its decisions are written to a Redis stream (`record.rs`).
    pub(crate) record: Option<RecordConfig>,
    /// `scope = "global"`: decided against this region's share (`region/`).
    pub(crate) global: Option<super::Global>,
}

/// `lease_batch` tokens per lease, for keys above `lease_above` requests per
/// second on one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseConfig {
    pub(crate) batch: u32,
    pub(crate) above: u32,
}

impl Face for Limit {
    fn name(&self) -> &Arc<str> {
        &self.name
    }
    fn key_described(&self) -> String {
        self.key.describe()
    }
    fn bodies(&self) -> &RefusalBodies {
        &self.refusal_bodies
    }
    fn refusal_log(&self, degraded: bool) -> &Throttle {
        &self.refusal_log[usize::from(degraded)]
    }
    fn early_log(&self, kind: usize) -> &Throttle {
        &self.early_log[kind]
    }
}

impl Limit {
    /// A limit without plans or leases (added by the configuration after),
    /// its store keys under `prefix`.
    pub(crate) fn new(
        prefix: &str,
        name: &str,
        key: KeySource,
        on_missing: OnMissing,
        rule: Rule,
        shadow: bool,
    ) -> Self {
        Self {
            name: name.into(),
            key_head: KeyHead::new(prefix, name),
            key,
            on_missing,
            rule,
            shadow,
            plans: HashMap::new(),
            lease: None,
            refusal_log: Default::default(),
            refusal_bodies: RefusalBodies::new(name),
            early_log: Default::default(),
            failures: None,
            on_exceed: OnExceed::Refuse,
            escalation_log: Default::default(),
            record: None,
            global: None,
        }
    }

    /// Whether a request with response `status` counts against it.
    pub(crate) fn counts(&self, status: http::StatusCode) -> bool {
        self.failures
            .as_ref()
            .is_none_or(|f| f.contains(&status.as_u16()))
    }

    /// Exceeding it escalates (`delay`, `challenge`) instead of refusing.
    pub(crate) fn escalates(&self) -> bool {
        self.on_exceed != OnExceed::Refuse
    }

    /// The rule for a caller on `plan` (the base rule for an unknown plan).
    pub(crate) fn rule_for(&self, plan: Option<&str>) -> Rule {
        plan.and_then(|p| self.plans.get(p))
            .copied()
            .unwrap_or(self.rule)
    }

    pub(crate) fn describe(&self) -> String {
        let mut s = format!(
            "{}: key {} (on_missing {}), {}{}",
            self.name,
            self.key,
            self.on_missing,
            self.rule.describe(),
            if self.shadow { ", shadow" } else { "" }
        );
        if self.global.is_some() {
            s.push_str(", scope global");
        }
        if let Some(f) = &self.failures {
            let statuses: Vec<String> = f.iter().map(u16::to_string).collect();
            s.push_str(&format!(", counts failures [{}]", statuses.join(", ")));
        }
        if let Some(r) = self.record {
            s.push_str(&format!(
                ", decisions recorded (max_len {}, max_age {})",
                r.max_len,
                crate::algorithm::duration_text(r.max_age)
            ));
        }
        match self.on_exceed {
            OnExceed::Refuse => {}
            OnExceed::Delay(d) => s.push_str(&format!(
                ", on_exceed delay {}",
                crate::algorithm::duration_text(d)
            )),
            OnExceed::Challenge => s.push_str(", on_exceed challenge"),
        }
        let mut plans: Vec<_> = self.plans.iter().collect();
        plans.sort_by(|a, b| a.0.cmp(b.0));
        for (name, rule) in plans {
            s.push_str(&format!("; plan {name}: {}", rule.describe()));
        }
        s
    }
}
