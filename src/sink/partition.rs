//! The Java client's key partitioning, for tests and for tools that must
//! predict where an aggregate's events live.
//!
//! Kafka's default partitioner maps a non-null key to
//! `toPositive(murmur2(key)) % partitions`, where `murmur2` is MurmurHash2
//! (32-bit, seed `0x9747b28c`, little-endian 4-byte blocks) and `toPositive`
//! clears the sign bit. librdkafka's `murmur2_random` partitioner computes the
//! same for non-empty keys (it differs only for null keys, which the relay
//! never produces).

const SEED: u32 = 0x9747_b28c;
const M: u32 = 0x5bd1_e995;
const R: u32 = 24;

/// Kafka's `Utils.murmur2`: MurmurHash2 of `data`, as the signed int Java returns.
pub fn murmur2(data: &[u8]) -> i32 {
    let mut h = SEED ^ data.len() as u32;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client's default partitioner (and librdkafka's
/// `murmur2_random`) picks for `key` among `partitions` partitions.
/// Returns 0 when `partitions` is not positive.
pub fn java_partition(key: &[u8], partitions: i32) -> i32 {
    if partitions <= 0 {
        return 0;
    }
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apache Kafka's `UtilsTest.testMurmur2` vectors.
    #[test]
    fn murmur2_matches_kafka_utils_test() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, expected) in cases {
            assert_eq!(
                murmur2(key),
                expected,
                "murmur2({})",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn partition_is_positive_hash_modulo_count() {
        // toPositive(-790332482) = 1357151166.
        assert_eq!(java_partition(b"foobar", 10), 1_357_151_166 % 10);
        assert_eq!(java_partition(b"foobar", 1), 0);
        assert_eq!(java_partition(b"foobar", 0), 0);
        for n in 1..50 {
            let p = java_partition(b"a-little-bit-long-string", n);
            assert!((0..n).contains(&p));
        }
    }
}
