//! What the JSON targets' checks ask of a JSON text besides its value: where serde_json says an
//! error is, and whether an object gives a key twice (which `serde_json::Value` hides: there
//! the last one wins).

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// The line and column of serde_json's ` at line L column C` at the end of `message`.
pub fn position_in(message: &str) -> Option<(usize, usize)> {
    let at = " at line ";
    let rest = &message[message.rfind(at)? + at.len()..];
    let (line, column) = rest.split_once(" column ")?;
    Some((line.parse().ok()?, column.parse().ok()?))
}

/// Whether `text` is JSON with an object that gives a key twice; `None` when it is not JSON.
pub fn has_duplicate_keys(text: &str) -> Option<bool> {
    serde_json::from_str::<Duplicates>(text).ok().map(|d| d.0)
}

/// A JSON value read for one fact: whether an object in it gives a key twice.
struct Duplicates(bool);

impl<'de> Deserialize<'de> for Duplicates {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DuplicatesVisitor)
    }
}

struct DuplicatesVisitor;

impl<'de> Visitor<'de> for DuplicatesVisitor {
    type Value = Duplicates;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Duplicates, E> {
        Ok(Duplicates(false))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Duplicates, E> {
        Ok(Duplicates(false))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Duplicates, E> {
        Ok(Duplicates(false))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Duplicates, E> {
        Ok(Duplicates(false))
    }

    fn visit_str<E>(self, _: &str) -> Result<Duplicates, E> {
        Ok(Duplicates(false))
    }

    fn visit_unit<E>(self) -> Result<Duplicates, E> {
        Ok(Duplicates(false))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Duplicates, A::Error> {
        let mut twice = false;
        while let Some(Duplicates(d)) = seq.next_element()? {
            twice |= d;
        }
        Ok(Duplicates(twice))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Duplicates, A::Error> {
        let mut seen = HashSet::new();
        let mut twice = false;
        while let Some(key) = map.next_key::<String>()? {
            twice |= !seen.insert(key);
            twice |= map.next_value::<Duplicates>()?.0;
        }
        Ok(Duplicates(twice))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_twice_is_seen_at_any_depth() {
        assert_eq!(has_duplicate_keys(r#"{"a":1,"b":[{"c":2}]}"#), Some(false));
        assert_eq!(has_duplicate_keys(r#"{"a":1,"a":2}"#), Some(true));
        assert_eq!(
            has_duplicate_keys(r#"[{"x":{"a":1,"\u0061":2}}]"#),
            Some(true)
        );
        assert_eq!(has_duplicate_keys("{"), None);
    }

    #[test]
    fn the_position_is_read_from_the_end() {
        let e = serde_json::from_str::<serde_json::Value>("{\n x").unwrap_err();
        assert_eq!(position_in(&e.to_string()), Some((e.line(), e.column())));
        assert_eq!(position_in("no position"), None);
    }
}
