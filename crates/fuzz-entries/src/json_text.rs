//! What the JSON targets' checks ask of a JSON text besides its value: where serde_json says an
//! error is, and every key it gives, a key given twice included (which `serde_json::Value`
//! hides: there the last one wins).

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

/// Every object key of a JSON text, at any depth, a key given twice included (a
/// `serde_json::Value` keeps only the last of them).
#[derive(Debug, Default)]
pub struct Keys {
    /// Each key, once.
    pub all: HashSet<String>,
    /// Whether an object gives a key twice.
    pub twice: bool,
}

/// The keys of `text`; `None` when it is not JSON.
pub fn keys(text: &[u8]) -> Option<Keys> {
    serde_json::from_slice(text).ok()
}

impl Keys {
    fn add(mut self, other: Keys) -> Keys {
        self.all.extend(other.all);
        self.twice |= other.twice;
        self
    }
}

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeysVisitor)
    }
}

struct KeysVisitor;

impl<'de> Visitor<'de> for KeysVisitor {
    type Value = Keys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Keys, E> {
        Ok(Keys::default())
    }

    fn visit_i64<E>(self, _: i64) -> Result<Keys, E> {
        Ok(Keys::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<Keys, E> {
        Ok(Keys::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<Keys, E> {
        Ok(Keys::default())
    }

    fn visit_str<E>(self, _: &str) -> Result<Keys, E> {
        Ok(Keys::default())
    }

    fn visit_unit<E>(self) -> Result<Keys, E> {
        Ok(Keys::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Keys, A::Error> {
        let mut keys = Keys::default();
        while let Some(inner) = seq.next_element()? {
            keys = keys.add(inner);
        }
        Ok(keys)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
        let mut keys = Keys::default();
        let mut here = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            keys.twice |= !here.insert(key.clone());
            keys.all.insert(key);
            keys = keys.add(map.next_value()?);
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_at_any_depth_and_a_key_twice() {
        let k = keys(br#"{"a":1,"b":[{"c":2}]}"#).unwrap();
        assert!(!k.twice);
        assert_eq!(k.all, ["a", "b", "c"].map(String::from).into());
        let k = keys(br#"[{"x":{"a":[{"d":1}],"\u0061":2}}]"#).unwrap();
        assert!(k.twice);
        assert_eq!(k.all, ["x", "a", "d"].map(String::from).into());
        assert!(!keys(br#"[{"a":1},{"a":2}]"#).unwrap().twice);
        assert!(keys(b"{").is_none());
    }

    #[test]
    fn the_position_is_read_from_the_end() {
        let e = serde_json::from_str::<serde_json::Value>("{\n x").unwrap_err();
        assert_eq!(position_in(&e.to_string()), Some((e.line(), e.column())));
        assert_eq!(position_in("no position"), None);
    }
}
