//! Where in the file a setting was written, for an error found after the
//! file was read: a path of keys (`["limits", "api", "capacity"]`; a
//! number steps into a list, `[[routes]]` included), looked up in the
//! file only when an error is reported. The model carries no positions:
//! a configuration built in code has no file, so its places are nowhere.

use std::ops::Range;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

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
        let doc: Node = toml::from_str(src).ok()?;
        self.0.iter().find_map(|p| find(&doc, p))
    }
}

fn find(doc: &Node, path: &Path) -> Option<Range<usize>> {
    let (mut at, mut span, mut key_span) = (doc, None, None);
    for k in &path.keys {
        let next = match at {
            Node::Table(entries) => {
                let (key, value) = entries.iter().find(|(n, _)| n.get_ref() == k)?;
                key_span = Some(key.span());
                value
            }
            Node::List(items) => {
                key_span = None;
                items.get(k.parse::<usize>().ok()?)?
            }
            Node::Leaf => return None,
        };
        span = Some(next.span());
        at = next.get_ref();
    }
    if path.name {
        key_span
    } else {
        span
    }
}

/// The file as tables, lists and values, each with its place.
enum Node {
    Table(Vec<(Spanned<String>, Spanned<Node>)>),
    List(Vec<Spanned<Node>>),
    Leaf,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a TOML value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = s.next_element()? {
                    items.push(item);
                }
                Ok(Node::List(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = m.next_entry()? {
                    entries.push(entry);
                }
                Ok(Node::Table(entries))
            }
        }
        d.deserialize_any(V)
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
