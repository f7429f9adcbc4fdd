//! Where in the file a setting was written, for an error found after the
//! file was read: a path of keys (`["limits", "api", "capacity"]`; a
//! number steps into a list, `[[routes]]` included), looked up in the
//! file only when an error is reported. The model carries no positions:
//! a configuration built in code has no file, so its places are nowhere.

use std::ops::Range;

use toml_edit::{Item, Table, TableLike, Value};

/// One or more paths into the file, the first one written wins (`capacity`,
/// else the limit's table).
#[derive(Clone, Debug, Default)]
pub(super) struct Place(Vec<Path>);

#[derive(Clone, Debug)]
struct Path {
    keys: Vec<String>,
    /// The last key itself (a name), not its value.
    name: bool,
}

impl Place {
    /// The value at `keys`.
    pub(super) fn of(keys: &[&str]) -> Self {
        Self(vec![Path {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            name: false,
        }])
    }

    /// The last of `keys` itself: a name, as `api` in `[limits.api]`.
    pub(super) fn name(keys: &[&str]) -> Self {
        let mut p = Self::of(keys);
        p.0[0].name = true;
        p
    }

    /// Field `key` of this place's (first) table.
    pub(super) fn field(&self, key: &str) -> Self {
        let mut keys = self.0.first().map(|p| p.keys.clone()).unwrap_or_default();
        keys.push(key.to_owned());
        Self(vec![Path { keys, name: false }])
    }

    /// The first of `keys` written in this place's table.
    pub(super) fn first_of(&self, keys: &[&str]) -> Self {
        Self(keys.iter().flat_map(|k| self.field(k).0).collect())
    }

    /// This place, or `other` when this one was not written.
    pub(super) fn or(mut self, other: Place) -> Self {
        self.0.extend(other.0);
        self
    }

    /// Its byte range in `src` (`None`: no file, or not written).
    pub(super) fn span(&self, src: &str) -> Option<Range<usize>> {
        if src.is_empty() || self.0.is_empty() {
            return None;
        }
        let doc = toml_edit::ImDocument::parse(src).ok()?;
        self.0
            .iter()
            .find_map(|p| find(At::Table(doc.as_table()), p))
    }
}

/// A place in the parsed file: a table, an item of one, or a list's value.
#[derive(Clone, Copy)]
enum At<'a> {
    Table(&'a Table),
    Item(&'a Item),
    Value(&'a Value),
}

impl<'a> At<'a> {
    /// Its entry `k` (an index in a list), and the span of its key.
    fn child(self, k: &str) -> Option<(At<'a>, Option<Range<usize>>)> {
        let entry = |t: &'a dyn TableLike| {
            t.get_key_value(k)
                .map(|(key, item)| (At::Item(item), key.span()))
        };
        let index = || k.parse::<usize>().ok();
        match self {
            At::Table(t) | At::Item(Item::Table(t)) => entry(t),
            At::Item(Item::ArrayOfTables(a)) => a.get(index()?).map(|t| (At::Table(t), None)),
            At::Item(Item::Value(v)) | At::Value(v) => match v {
                Value::InlineTable(t) => entry(t),
                Value::Array(a) => a.get(index()?).map(|v| (At::Value(v), None)),
                _ => None,
            },
            At::Item(Item::None) => None,
        }
    }

    fn span(self) -> Option<Range<usize>> {
        match self {
            At::Table(t) => t.span(),
            At::Item(i) => i.span(),
            At::Value(v) => v.span(),
        }
    }
}

fn find(mut at: At<'_>, path: &Path) -> Option<Range<usize>> {
    let mut key_span = None;
    for k in &path.keys {
        (at, key_span) = at.child(k)?;
    }
    if path.name { key_span } else { at.span() }
}

/// Where a rule's numbers were written in table `at`, for its errors
/// (`fallback`: where to point for numbers it did not write).
pub(super) struct RulePlaces {
    /// `capacity`, `limit` or `max_in_flight`.
    pub(super) count: Place,
    /// `refill`, `window` or `max_hold`.
    pub(super) rate: Place,
    /// A rule on both numbers: the rate if it was written here.
    pub(super) both: Place,
}

impl RulePlaces {
    pub(super) fn new(at: &Place, fallback: &Place) -> Self {
        const COUNT: [&str; 3] = ["capacity", "limit", "max_in_flight"];
        const RATE: [&str; 3] = ["refill", "window", "max_hold"];
        let count = at.first_of(&COUNT).or(fallback.clone());
        Self {
            rate: at.first_of(&RATE).or(fallback.clone()),
            both: at.first_of(&RATE).or(count.clone()),
            count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_find_values_names_and_list_elements() {
        let src = "[limits.api]\ncapacity = 5\n\n[[routes]]\nlimits = [\"a\", \"b\"]\n";
        let at = |p: Place| p.span(src).map(|s| &src[s]);
        assert_eq!(at(Place::of(&["limits", "api", "capacity"])), Some("5"));
        assert_eq!(at(Place::name(&["limits", "api"])), Some("api"));
        assert_eq!(
            at(Place::of(&["routes", "0", "limits", "1"])),
            Some("\"b\"")
        );
        let refill = Place::of(&["limits", "api", "refill"]);
        assert_eq!(at(refill.clone()), None);
        let or = refill.or(Place::name(&["limits", "api"]));
        assert_eq!(at(or), Some("api"));
        assert_eq!(Place::of(&["limits"]).span(""), None);
    }
}
