//! A limit's features checked as they are added: its rule, lease,
//! record, login ladder and plans.

use std::time::Duration;

use super::*;
use crate::algorithm::Rule;
use crate::config::ConfigError;
use crate::key::KeySource;
use crate::route::RecordConfig;
use crate::route::{LeaseConfig, Limit, OnExceed, OnMissing};

impl Validator<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::config) fn add_limit(
        &mut self,
        prefix: &str,
        name: &str,
        name_span: Span,
        key: KeySource,
        on_missing: OnMissing,
        rule: Rule,
        spans: &RuleSpans,
        shadow: bool,
    ) -> Result<(), ConfigError> {
        self.check_name("limit name", name, name_span.clone())?;
        if self.limits.iter().any(|l| &*l.name == name) {
            return Err(self.err(name_span, format!("limit {name:?} is defined twice")));
        }
        self.check_rule(name, &rule, spans)?;
        self.limits
            .push(Limit::new(prefix, name, key, on_missing, rule, shadow));
        Ok(())
    }

    /// Hot-key leases for the limit just added (token buckets only).
    pub(in crate::config) fn set_lease(
        &mut self,
        batch: u32,
        above: u32,
        span: Span,
    ) -> Result<(), ConfigError> {
        let src = self.src;
        let l = self.limits.last_mut().expect("a limit was just added");
        if !matches!(l.rule, Rule::TokenBucket { .. }) {
            return Err(ConfigError::at(
                src,
                span,
                format!("limit {:?}: leases are for token buckets", l.name),
            ));
        }
        if batch < 2 || f64::from(batch) > l.rule.capacity() {
            return Err(ConfigError::at(
                src,
                span,
                format!(
                    "limit {:?}: lease_batch must be between 2 and the capacity",
                    l.name
                ),
            ));
        }
        l.lease = Some(LeaseConfig { batch, above });
        Ok(())
    }

    /// Decision records for the limit just added: a bounded stream.
    pub(in crate::config) fn set_record(
        &mut self,
        r: RecordConfig,
        [len_at, age_at]: &[Span; 2],
    ) -> Result<(), ConfigError> {
        let src = self.src;
        let l = self.limits.last_mut().expect("a limit was just added");
        let err = |at: &Span, m: String| Err(ConfigError::at(src, at.clone(), m));
        if !(1..=MAX_RECORD_LEN).contains(&r.max_len) {
            return err(
                len_at,
                format!(
                    "limit {:?}: record max_len must be between 1 and {MAX_RECORD_LEN}",
                    l.name
                ),
            );
        }
        if r.max_age < Duration::from_secs(1) || r.max_age > MAX_RECORD_AGE {
            return err(
                age_at,
                format!(
                    "limit {:?}: record max_age must be between 1s and {}d",
                    l.name,
                    MAX_RECORD_AGE.as_secs() / 86_400
                ),
            );
        }
        l.record = Some(r);
        Ok(())
    }

    /// Failure-only counting and escalation for the limit just added.
    /// A limit keyed by the account alone that counts failures must not
    /// refuse: whoever knows an account's name could lock its owner out.
    pub(in crate::config) fn set_login(
        &mut self,
        failures: Option<&[u16]>,
        on_exceed: OnExceed,
        at: &LoginSpans,
    ) -> Result<(), ConfigError> {
        let src = self.src;
        let l = self.limits.last_mut().expect("a limit was just added");
        let name = l.name.clone();
        let err =
            |span: Span, m: String| ConfigError::at(src, span, format!("limit {name:?}: {m}"));
        if let Some(statuses) = failures {
            if statuses.is_empty() {
                let span = at.statuses.first().cloned().flatten();
                return Err(err(
                    span,
                    "failure_statuses needs at least one status".into(),
                ));
            }
            for (i, &code) in statuses.iter().enumerate() {
                if !(100..=599).contains(&code) {
                    let span = at.statuses.get(i).cloned().flatten();
                    return Err(err(
                        span,
                        "failure_statuses: each must be an HTTP status from 100 to 599".into(),
                    ));
                }
            }
            if l.lease.is_some() {
                return Err(err(
                    at.key.clone(),
                    "a limit that counts failures cannot take hot-key leases (lease_batch): \
                     a leased request is not charged alone, so a success could not be given back"
                        .into(),
                ));
            }
            if l.rule.is_concurrency() {
                return Err(err(
                    at.key.clone(),
                    "a concurrency limit cannot count failures: its slot is given back when \
                     every response ends, failure or not (use a token bucket or a window)"
                        .into(),
                ));
            }
            let by_account_alone = matches!(l.key, KeySource::Account(_));
            if by_account_alone && on_exceed == OnExceed::Refuse && !l.shadow {
                return Err(err(
                    at.on_exceed.clone().or(at.key.clone()),
                    "counts failures per account and refuses when exceeded: an attacker who \
                     knows only the account name could lock its owner out. Use \
                     `on_exceed = \"challenge\"` or `on_exceed = \"delay\"` (and refuse per \
                     IP or per IP+account instead)"
                        .into(),
                ));
            }
            l.failures = Some(statuses.into());
        }
        if l.rule.is_concurrency() && on_exceed != OnExceed::Refuse {
            return Err(err(
                at.on_exceed.clone().or(at.key.clone()),
                "a concurrency limit can only refuse: past max_in_flight no slot is taken, \
                 so a delayed or challenged request would run uncounted"
                    .into(),
            ));
        }
        if let OnExceed::Delay(d) = on_exceed {
            if d.is_zero() || d > MAX_DELAY {
                return Err(err(
                    at.delay.clone(),
                    format!(
                        "delay must be longer than zero and at most {} s (a request is held that long)",
                        MAX_DELAY.as_secs()
                    ),
                ));
            }
        }
        l.on_exceed = on_exceed;
        Ok(())
    }

    /// `[plans.<plan>.<limit>]`: the limit's numbers for callers on `plan`.
    pub(in crate::config) fn add_plan_rule(
        &mut self,
        plan: &str,
        plan_span: Span,
        limit: &str,
        limit_span: Span,
        spans: &RuleSpans,
        rule: impl FnOnce(&Rule) -> Result<Rule, String>,
    ) -> Result<(), ConfigError> {
        self.check_name("plan name", plan, plan_span)?;
        let Some(i) = self.limits.iter().position(|l| &*l.name == limit) else {
            let known = self.limits.iter().map(|l| &*l.name);
            return Err(unknown_limit(self.src, known, limit, limit_span));
        };
        let r = rule(&self.limits[i].rule).map_err(|e| self.err(limit_span.clone(), e))?;
        self.check_rule(limit, &r, spans)?;
        self.limits[i].plans.insert(plan.into(), r);
        self.plans.insert(plan.to_owned());
        Ok(())
    }
}
