//! Stable hashing: the same value in every process, run and platform.
//!
//! Hashes are stored in tuning databases and compared across worker processes, so they
//! must not depend on `RandomState` keys, pointer width or byte order. Every value is fed
//! as an explicit little-endian byte encoding (with type tags and lengths, so different
//! values never share an encoding) into XXH3-64 with its default seed.

use xxhash_rust::xxh3::Xxh3;

/// Streams typed values into XXH3-64 with a fixed, platform-independent encoding.
pub struct StableHasher {
    state: Xxh3,
}

impl StableHasher {
    pub fn new() -> Self {
        StableHasher { state: Xxh3::new() }
    }

    pub fn write_u8(&mut self, value: u8) {
        self.state.update(&[value]);
    }

    pub fn write_u32(&mut self, value: u32) {
        self.state.update(&value.to_le_bytes());
    }

    pub fn write_u64(&mut self, value: u64) {
        self.state.update(&value.to_le_bytes());
    }

    pub fn write_i64(&mut self, value: i64) {
        self.state.update(&value.to_le_bytes());
    }

    /// Lengths are written as u64 so the encoding is the same on 32- and 64-bit hosts.
    pub fn write_len(&mut self, len: usize) {
        self.write_u64(len as u64);
    }

    /// Writes the length first so that ("ab", "c") and ("a", "bc") differ.
    pub fn write_str(&mut self, value: &str) {
        self.write_len(value.len());
        self.state.update(value.as_bytes());
    }

    /// Hashes 0.0 and -0.0 alike, since they compare equal.
    pub fn write_f64(&mut self, value: f64) {
        let bits = if value == 0.0 { 0 } else { value.to_bits() };
        self.write_u64(bits);
    }

    pub fn finish(&self) -> u64 {
        self.state.digest()
    }
}

impl Default for StableHasher {
    fn default() -> Self {
        Self::new()
    }
}

/// A value with a stable hash encoding (see the module documentation).
pub trait StableHash {
    fn stable_hash(&self, hasher: &mut StableHasher);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_of(feed: impl FnOnce(&mut StableHasher)) -> u64 {
        let mut hasher = StableHasher::new();
        feed(&mut hasher);
        hasher.finish()
    }

    #[test]
    fn empty_input_is_the_xxh3_of_nothing() {
        assert_eq!(hash_of(|_| {}), xxhash_rust::xxh3::xxh3_64(b""));
    }

    #[test]
    fn fixed_input_has_a_fixed_hash() {
        let expected = xxhash_rust::xxh3::xxh3_64(&[
            7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ]);
        assert_eq!(
            hash_of(|h| {
                h.write_u32(7);
                h.write_i64(-1)
            }),
            expected
        );
    }

    #[test]
    fn string_boundaries_matter() {
        let ab_c = hash_of(|h| {
            h.write_str("ab");
            h.write_str("c")
        });
        let a_bc = hash_of(|h| {
            h.write_str("a");
            h.write_str("bc")
        });
        assert_ne!(ab_c, a_bc);
    }

    #[test]
    fn signed_zeros_hash_alike() {
        assert_eq!(
            hash_of(|h| h.write_f64(0.0)),
            hash_of(|h| h.write_f64(-0.0))
        );
        assert_ne!(hash_of(|h| h.write_f64(0.0)), hash_of(|h| h.write_f64(1.0)));
    }
}
