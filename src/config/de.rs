//! How the file's values become the model's types: text parsed where it
//! is written (rates, durations, keys, methods, addresses), so that a
//! parser's error is the TOML error at that value, and the few values
//! read in more than one shape.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::route::RecordConfig;

/// A value written as text and read by `parse`. The error is raised
/// inside the value's own deserializer, so the TOML error points at the
/// value (an element of a list included), and a value of another type is
/// "expected a string" as before.
struct Text<T, E>(fn(&str) -> Result<T, E>);

impl<'de, T, E: fmt::Display> Visitor<'de> for Text<T, E> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<Er: de::Error>(self, v: &str) -> Result<T, Er> {
        (self.0)(v).map_err(Er::custom)
    }
}

impl<'de, T, E: fmt::Display> de::DeserializeSeed<'de> for Text<T, E> {
    type Value = T;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_str(self)
    }
}

fn text_with<'de, D, T, E>(d: D, parse: fn(&str) -> Result<T, E>) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    E: fmt::Display,
{
    d.deserialize_str(Text(parse))
}

/// A value of a type that parses from text ([`FromStr`]).
pub(crate) fn text<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    text_with(d, T::from_str)
}

/// An optional [`text`] (`deserialize_with` sees only values written).
pub(crate) fn some_text<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    text(d).map(Some)
}

/// A duration as the configuration writes one (`"5ms"`).
pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    text_with(d, super::units::parse_duration)
}

/// An optional [`duration`].
pub(crate) fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// A list of values of a type that parses from text, each error at its
/// element.
fn texts<'de, D, T, E>(d: D, parse: fn(&str) -> Result<T, E>) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    E: fmt::Display,
{
    struct List<T, E>(fn(&str) -> Result<T, E>);
    impl<'de, T, E: fmt::Display> Visitor<'de> for List<T, E> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut s: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(v) = s.next_element_seed(Text(self.0))? {
                out.push(v);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(List(parse))
}

/// A route's `methods`, in any case.
pub(super) fn methods<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<http::Method>>, D::Error> {
    texts(d, |s| http::Method::from_str(&s.to_ascii_uppercase())).map(Some)
}

/// `[client_ip] trusted_proxies`: networks, or addresses (a /32 or /128).
pub(crate) fn proxies<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
    texts(d, |s| {
        s.parse::<ipnet::IpNet>()
            .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
            .map_err(|_| {
                format!(
                    "invalid proxy address {s:?}; expected a CIDR such as \"10.0.0.0/8\" or an IP"
                )
            })
    })
}

/// `[client_ip] forwarded_header`, in any case.
pub(crate) fn forwarded_header<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<crate::key::ForwardedHeader, D::Error> {
    text_with(d, |h| match h.to_ascii_lowercase().as_str() {
        "x-forwarded-for" => Ok(crate::key::ForwardedHeader::XForwardedFor),
        "forwarded" => Ok(crate::key::ForwardedHeader::Forwarded),
        _ => Err(format!(
            "forwarded_header must be \"x-forwarded-for\" or \"forwarded\", not {h:?}"
        )),
    })
}

/// `failure_statuses`: whole numbers; one that is no `u16` becomes 0, which
/// `build` refuses as no HTTP status, at its element.
pub(super) fn statuses<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u16>>, D::Error> {
    let codes = Vec::<i64>::deserialize(d)?;
    Ok(Some(
        codes
            .into_iter()
            .map(|c| u16::try_from(c).unwrap_or(0))
            .collect(),
    ))
}

/// A limit's `record`: `true`, `false`, or a table of its bounds.
pub(super) fn record<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RecordConfig>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<RecordConfig>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("`true`, `false` or a table with `max_len` and `max_age`")
        }
        fn visit_bool<E: de::Error>(self, on: bool) -> Result<Self::Value, E> {
            Ok(on.then(RecordConfig::default))
        }
        fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
            // The table's own checks (unknown fields) apply.
            RecordConfig::deserialize(de::value::MapAccessDeserializer::new(m)).map(Some)
        }
    }
    d.deserialize_any(V)
}

/// A table's entries in the order the file wrote them (a `BTreeMap` would
/// sort them; the toml parser refuses a key written twice, at the second).
pub(super) fn pairs<'de, D, V>(d: D) -> Result<Vec<(String, V)>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Pairs<V>(PhantomData<V>);
    impl<'de, V: Deserialize<'de>> Visitor<'de> for Pairs<V> {
        type Value = Vec<(String, V)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(entry) = m.next_entry()? {
                out.push(entry);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Pairs(PhantomData))
}

/// [`pairs`], for a field that may be absent.
pub(super) fn some_pairs<'de, D, V>(d: D) -> Result<Option<Vec<(String, V)>>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    pairs(d).map(Some)
}

/// A table's entries sorted by key, as `[limits]` and `[plan_assignments]`
/// have always been read.
pub(super) fn sorted<'de, D, V>(d: D) -> Result<Vec<(String, V)>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    let map = std::collections::BTreeMap::<String, V>::deserialize(d)?;
    Ok(map.into_iter().collect())
}

/// A capacity, a window's limit or slots in flight: a whole number, read
/// from any TOML number so that a float or a negative one is told the
/// bound in words (the upper bound, 2^53, is checked with the limit's
/// other numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Amount(pub(super) u64);

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Amount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(AMOUNT)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Amount, E> {
                Ok(Amount(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Amount, E> {
                u64::try_from(v)
                    .map(Amount)
                    .map_err(|_| E::custom(format!("{v} is not {AMOUNT}")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Amount, E> {
                Err(E::custom(format!(
                    "{} is not {AMOUNT}",
                    super::error::short_number(v)
                )))
            }
        }
        d.deserialize_any(V)
    }
}

/// What an [`Amount`] is, in words.
const AMOUNT: &str = "a whole number from 1 to 2^53 (9007199254740992)";

/// [`duration`] as a seed, for a table read by hand.
pub(super) struct DurationSeed;

impl<'de> de::DeserializeSeed<'de> for DurationSeed {
    type Value = Duration;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Duration, D::Error> {
        duration(d)
    }
}
