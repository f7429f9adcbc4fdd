//! The closed sets of words the metrics are labelled with.

/// Which script a call ran (the `script` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Script {
    /// The single-token-bucket script, which also carries coalesced checks.
    Lean,
    /// The general script (several limits, windows, concurrency).
    Decide,
    /// A hot key's partial lease.
    Lease,
}

/// Why a hot key's request was refused by this instance's lease table,
/// without Redis (the `reason` label of
/// `fleetlimit_lease_local_refusals_total`).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseRefusal {
    /// The last lease got nothing: the key's free tokens were taken, by
    /// other instances' leases or their requests.
    Elsewhere,
    /// The last lease came short and is spent: waiting for the next one.
    Waiting,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl LeaseRefusal {
    pub(super) const ALL: [Self; 2] = [Self::Elsewhere, Self::Waiting];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Elsewhere => "elsewhere",
            Self::Waiting => "waiting",
        }
    }
}

/// Precision spent by the Redis store's calls, per check (the `event`
/// label of `fleetlimit_precision_events_total`; docs/accuracy.md says
/// what each costs).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Precision {
    /// Given up on, and its answer never came (or was not awaited): Redis
    /// may have charged it before its bound.
    Unknown,
    /// Redis ran it after its bound and changed nothing.
    LateDiscarded,
    /// Its answer came after its caller stopped waiting, charged: given
    /// back.
    SettledCharged,
    /// Its answer came after its caller stopped waiting, not charged.
    SettledUncharged,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl Precision {
    pub(super) const ALL: [Self; 4] = [
        Self::Unknown,
        Self::LateDiscarded,
        Self::SettledCharged,
        Self::SettledUncharged,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown_outcome",
            Self::LateDiscarded => "late_discarded",
            Self::SettledCharged => "settled_charged",
            Self::SettledUncharged => "settled_uncharged",
        }
    }
}

/// What became of a concurrency slot's release that failed (the `result`
/// label of `fleetlimit_slot_releases_total`; docs/accuracy.md, section
/// "Concurrency slots").
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotRelease {
    /// Failed, queued to be sent again.
    Failed,
    /// Sent again from the queue, and Redis answered.
    Retried,
    /// Pushed out of the full queue: counts until its `max_hold`.
    Dropped,
    /// Refused by Redis on the key's data (not a set of slots): not sent
    /// again.
    Refused,
    /// Still failing after the longest `max_hold`: let go.
    Expired,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl SlotRelease {
    pub(super) const ALL: [Self; 5] = [
        Self::Failed,
        Self::Retried,
        Self::Dropped,
        Self::Refused,
        Self::Expired,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Failed => "failed",
            Self::Retried => "retried",
            Self::Dropped => "dropped",
            Self::Refused => "refused",
            Self::Expired => "expired",
        }
    }
}

/// What one limit's part of a decision was (the `outcome` label).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Admitted,
    Refused,
    RefusedByOther,
    ShadowRefused,
    Escalated,
    DegradedOpen,
    DegradedClosed,
    DegradedLocal,
    DegradedLocalRefused,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl Verdict {
    pub(super) const ALL: [Self; 9] = [
        Self::Admitted,
        Self::Refused,
        Self::RefusedByOther,
        Self::ShadowRefused,
        Self::Escalated,
        Self::DegradedOpen,
        Self::DegradedClosed,
        Self::DegradedLocal,
        Self::DegradedLocalRefused,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Refused => "refused",
            Self::RefusedByOther => "refused_by_other",
            Self::ShadowRefused => "shadow_refused",
            Self::Escalated => "escalated",
            Self::DegradedOpen => "degraded_open",
            Self::DegradedClosed => "degraded_closed",
            Self::DegradedLocal => "degraded_local",
            Self::DegradedLocalRefused => "degraded_local_refused",
        }
    }
}
