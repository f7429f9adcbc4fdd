//! Each region's target share of a key, and who gets a region's excess:
//! the same figures give the same answer in every region.

/// A region asking for nothing still keeps this fraction of a key's
/// weight, so it can admit a little and be seen asking.
const FLOOR: f64 = 0.02;

/// Each region's target share of a key: the reachable regions' total,
/// split in proportion to what each was asked (at least [`FLOOR`] of it
/// each, but a region with no live instance), or as the configuration
/// splits it when nobody asked (nothing to a region with no live
/// instance, when another has one). Unreachable regions (`None`) keep what
/// they hold and get no target.
pub(crate) fn targets(
    shares: &[Option<u32>],
    offered: &[u64],
    split: &[u32],
    live: &[bool],
) -> Vec<Option<u32>> {
    let any_live = (0..shares.len()).any(|i| shares[i].is_some() && live.get(i) != Some(&false));
    let total: u64 = shares.iter().flatten().map(|&s| u64::from(s)).sum();
    let asked: u64 = shares
        .iter()
        .zip(offered)
        .filter(|(s, _)| s.is_some())
        .map(|(_, &n)| n)
        .sum();
    let weight = |i: usize| -> f64 {
        if live.get(i) == Some(&false) && any_live {
            0.0
        } else if asked == 0 {
            f64::from(split[i])
        } else {
            (offered[i] as f64 / asked as f64).max(FLOOR)
        }
    };
    let sum: f64 = (0..shares.len())
        .filter(|&i| shares[i].is_some())
        .map(weight)
        .sum();
    (0..shares.len())
        .map(|i| {
            shares[i]?;
            let w = if sum > 0.0 { weight(i) / sum } else { 0.0 };
            Some(((total as f64) * w).floor() as u32)
        })
        .collect()
}

/// `excess` split among the regions below their target, in proportion to
/// how far below (whole parts, rounded down).
pub(super) fn split_excess(
    excess: u32,
    shares: &[Option<u32>],
    targets: &[Option<u32>],
) -> Vec<(usize, u32)> {
    let deficits: Vec<(usize, u64)> = shares
        .iter()
        .zip(targets)
        .enumerate()
        .filter_map(|(y, (s, t))| {
            let d = u64::from((*t)?).saturating_sub(u64::from((*s)?));
            (d > 0).then_some((y, d))
        })
        .collect();
    let sum: u64 = deficits.iter().map(|d| d.1).sum();
    if sum == 0 {
        return Vec::new();
    }
    let excess = u64::from(excess).min(sum);
    deficits
        .into_iter()
        .map(|(y, d)| (y, u32::try_from(excess * d / sum).unwrap_or(0)))
        .filter(|g| g.1 > 0)
        .collect()
}
