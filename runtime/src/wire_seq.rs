//! Sequences decoded without trusting the length they announce.
//!
//! serde's `Vec` reserves room for up to 1 MiB of elements from the size hint
//! before it reads one, and bincode's hint is the length the peer announced; on
//! the channels whose messages are a few KiB (object requests and answers, the
//! rendezvous) a handful of hostile bytes would so cost 1 MiB each. Fields decoded
//! through this module reserve at most [`MAX_RESERVE_BYTES`] and grow only as
//! elements actually arrive. The encoding is unchanged.
//!
//! Found by `tests/hostile_bytes.rs` (the object answers target).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

/// The most bytes of elements reserved before they arrive.
const MAX_RESERVE_BYTES: usize = 1024;

struct Elements<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Elements<T> {
    type Value = Vec<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let reserve = seq
            .size_hint()
            .unwrap_or(0)
            .min(MAX_RESERVE_BYTES / size_of::<T>().max(1));
        let mut elements = Vec::with_capacity(reserve);
        while let Some(element) = seq.next_element()? {
            elements.push(element);
        }
        Ok(elements)
    }
}

/// A `Vec` field (`#[serde(deserialize_with = "crate::wire_seq::vec")]`).
pub(crate) fn vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    deserializer.deserialize_seq(Elements(PhantomData))
}

#[cfg(feature = "net")]
struct Bounded<T>(Vec<T>);

#[cfg(feature = "net")]
impl<'de, T: Deserialize<'de>> Deserialize<'de> for Bounded<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        vec(deserializer).map(Bounded)
    }
}

/// An `Option<Vec>` field (`#[serde(deserialize_with = "crate::wire_seq::option_vec")]`).
#[cfg(feature = "net")]
pub(crate) fn option_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Vec<T>>, D::Error> {
    Option::<Bounded<T>>::deserialize(deserializer).map(|found| found.map(|bounded| bounded.0))
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Message {
        #[serde(deserialize_with = "super::vec")]
        names: Vec<String>,
        #[serde(deserialize_with = "super::option_vec")]
        id: Option<Vec<u8>>,
    }

    #[test]
    fn bounded_sequences_round_trip_like_plain_ones() {
        let config = bincode::config::standard().with_limit::<4096>();
        for message in [
            Message {
                names: vec!["a".to_owned(), "bc".to_owned()],
                id: Some(vec![1, 2, 3]),
            },
            Message {
                names: Vec::new(),
                id: None,
            },
        ] {
            let bytes = bincode::serde::encode_to_vec(&message, config).unwrap();
            let (decoded, used): (Message, usize) =
                bincode::serde::decode_from_slice(&bytes, config).unwrap();
            assert_eq!((decoded, used), (message, bytes.len()));
        }
        // A sequence announcing 2^32 elements with none following is an error.
        let bytes = [0xfc, 0xff, 0xff, 0xff, 0xff, 0];
        assert!(bincode::serde::decode_from_slice::<Message, _>(&bytes, config).is_err());
    }
}
