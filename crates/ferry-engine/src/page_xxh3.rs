//! xxh3-64 of one 4 KiB page, with the widest vectors the CPU has.
//!
//! Every page a migration moves is hashed once on each side: the source for
//! the frame check and its digest, the destination to check the frame and
//! keep its digest (see `digest` and `wire::frame`). `xxhash-rust` picks
//! its vector width when it is compiled, and a portable build gets SSE2.
//! Measured on this project's kvm host (a 1 MiB buffer in cache, 4 KiB
//! pages), AVX2 hashed markedly faster than SSE2, and AVX-512 faster still.
//! So this module computes the same function for a whole page with AVX-512
//! or AVX2 when the CPU has them (checked once, at the first call), and
//! falls back to `xxhash-rust` otherwise. The result is xxh3-64 with seed 0
//! and the default secret, bit for bit: the tests compare it with
//! `xxhash-rust` on every path this CPU can run.
//!
//! The long-input path of xxh3 for 4096 bytes: 3 blocks of 16 stripes of
//! 64 bytes (each block's accumulators scrambled after it), 15 stripes of
//! the last block, the page's last 64 bytes, then the merge and avalanche.

use ferry_vm::PAGE_SIZE;
use std::sync::OnceLock;

const SECRET: [u8; 192] = xxhash_rust::const_xxh3::const_custom_default_secret(0);
const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;
const INIT: [u64; 8] = [
    PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
];
const STRIPE: usize = 64;
const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE) / 8;
const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;
const FULL_BLOCKS: usize = (PAGE_SIZE - 1) / BLOCK;
const LAST_STRIPES: usize = (PAGE_SIZE - 1 - FULL_BLOCKS * BLOCK) / STRIPE;
/// Where the scramble's key, the last stripe's key and the merge's key
/// start in the secret.
const SCRAMBLE_KEY: usize = SECRET.len() - STRIPE;
const LAST_KEY: usize = SECRET.len() - STRIPE - 7;
const MERGE_KEY: usize = 11;

/// The vector width chosen for this CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Width {
    Avx512,
    Avx2,
    Portable,
}

/// Whether this CPU (and its OS) runs `width`.
fn runs(width: Width) -> bool {
    match width {
        #[cfg(target_arch = "x86_64")]
        Width::Avx512 => std::is_x86_feature_detected!("avx512f"),
        #[cfg(target_arch = "x86_64")]
        Width::Avx2 => std::is_x86_feature_detected!("avx2"),
        Width::Portable => true,
        #[cfg(not(target_arch = "x86_64"))]
        _ => false,
    }
}

/// The widest this CPU runs, found once.
fn width() -> Width {
    static WIDTH: OnceLock<Width> = OnceLock::new();
    *WIDTH.get_or_init(|| {
        [Width::Avx512, Width::Avx2]
            .into_iter()
            .find(|w| runs(*w))
            .unwrap_or(Width::Portable)
    })
}

/// xxh3-64 (seed 0, default secret) of one page.
#[inline]
pub fn hash(page: &[u8; PAGE_SIZE]) -> u64 {
    hash_with(width(), page)
}

/// [`hash`] with `width`, or portably where this CPU does not run it (the
/// check is a cached load).
fn hash_with(width: Width, page: &[u8; PAGE_SIZE]) -> u64 {
    match width {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `runs` found avx512f on this CPU.
        Width::Avx512 if runs(width) => finish(unsafe { x86::accumulate_avx512(page) }),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `runs` found avx2 on this CPU.
        Width::Avx2 if runs(width) => finish(unsafe { x86::accumulate_avx2(page) }),
        _ => xxhash_rust::xxh3::xxh3_64(page),
    }
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The merge of the eight accumulators and the avalanche.
fn finish(acc: [u64; 8]) -> u64 {
    let mut h = (PAGE_SIZE as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        let key = MERGE_KEY + 16 * i;
        let a = acc[2 * i] ^ read_u64(&SECRET, key);
        let b = acc[2 * i + 1] ^ read_u64(&SECRET, key + 8);
        let p = u128::from(a) * u128::from(b);
        h = h.wrapping_add((p as u64) ^ ((p >> 64) as u64));
    }
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

/// xxh3's walk over a page, on accumulators of any width: each full
/// block's stripes, then `scramble`; the last block's stripes; the page's
/// last 64 bytes. `stripe(acc, at, key)` adds the stripe at byte `at` of
/// the page, keyed by the secret from byte `key`.
#[inline(always)]
fn walk<A>(
    mut acc: A,
    mut stripe: impl FnMut(A, usize, usize) -> A,
    mut scramble: impl FnMut(A) -> A,
) -> A {
    for block in 0..FULL_BLOCKS {
        for n in 0..STRIPES_PER_BLOCK {
            acc = stripe(acc, block * BLOCK + n * STRIPE, n * 8);
        }
        acc = scramble(acc);
    }
    for n in 0..LAST_STRIPES {
        acc = stripe(acc, FULL_BLOCKS * BLOCK + n * STRIPE, n * 8);
    }
    stripe(acc, PAGE_SIZE - STRIPE, LAST_KEY)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Swaps the two u64s of each 128-bit lane (dwords 2, 3, 0, 1).
    const SWAP_U64S: i32 = 0b01_00_11_10;

    /// The eight accumulators after the page, with AVX-512.
    ///
    /// # Safety
    /// The CPU must have avx512f.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn accumulate_avx512(page: &[u8; PAGE_SIZE]) -> [u64; 8] {
        let (p, s) = (page.as_ptr(), SECRET.as_ptr());
        let stripe = |acc: __m512i, at: usize, key: usize| {
            // SAFETY: `p + at` and `s + key` are followed by at least 64
            // bytes of the page or the secret (at <= 4096 - 64, key <= 192
            // - 64); unaligned loads need no alignment.
            let (data, key) = unsafe {
                (
                    _mm512_loadu_si512(p.add(at).cast()),
                    _mm512_loadu_si512(s.add(key).cast()),
                )
            };
            let keyed = _mm512_xor_si512(data, key);
            let product = _mm512_mul_epu32(keyed, _mm512_srli_epi64::<32>(keyed));
            let swapped = _mm512_shuffle_epi32::<SWAP_U64S>(data);
            _mm512_add_epi64(product, _mm512_add_epi64(acc, swapped))
        };
        let init = INIT;
        // SAFETY: `init` is 64 bytes on this stack frame.
        let acc = unsafe { _mm512_loadu_si512(init.as_ptr().cast()) };
        // SAFETY: as for the stripes.
        let scramble_key = unsafe { _mm512_loadu_si512(s.add(SCRAMBLE_KEY).cast()) };
        let prime = _mm512_set1_epi32(PRIME32_1 as i32);
        let scramble = |acc: __m512i| {
            let mixed = _mm512_xor_si512(acc, _mm512_srli_epi64::<47>(acc));
            let keyed = _mm512_xor_si512(mixed, scramble_key);
            let low = _mm512_mul_epu32(keyed, prime);
            let high = _mm512_mul_epu32(_mm512_srli_epi64::<32>(keyed), prime);
            _mm512_add_epi64(low, _mm512_slli_epi64::<32>(high))
        };
        let acc = walk(acc, stripe, scramble);
        let mut out = [0u64; 8];
        // SAFETY: `out` is 64 bytes.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), acc) };
        out
    }

    /// The eight accumulators after the page, with AVX2 (two halves of four).
    ///
    /// # Safety
    /// The CPU must have avx2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn accumulate_avx2(page: &[u8; PAGE_SIZE]) -> [u64; 8] {
        let (p, s) = (page.as_ptr(), SECRET.as_ptr());
        let half = |acc: __m256i, at: usize, key: usize| {
            // SAFETY: `p + at` and `s + key` are followed by at least 32
            // bytes of the page or the secret (at <= 4096 - 32, key <= 192
            // - 32); unaligned loads need no alignment.
            let (data, key) = unsafe {
                (
                    _mm256_loadu_si256(p.add(at).cast()),
                    _mm256_loadu_si256(s.add(key).cast()),
                )
            };
            let keyed = _mm256_xor_si256(data, key);
            let product = _mm256_mul_epu32(keyed, _mm256_srli_epi64::<32>(keyed));
            let swapped = _mm256_shuffle_epi32::<SWAP_U64S>(data);
            _mm256_add_epi64(product, _mm256_add_epi64(acc, swapped))
        };
        let stripe = |[low, high]: [__m256i; 2], at: usize, key: usize| {
            [half(low, at, key), half(high, at + 32, key + 32)]
        };
        let init = INIT;
        // SAFETY: `init` is 64 bytes on this stack frame; the scramble key
        // as for the stripes.
        let (acc, scramble_key) = unsafe {
            let init = init.as_ptr().cast::<u8>();
            let key = s.add(SCRAMBLE_KEY);
            (
                [
                    _mm256_loadu_si256(init.cast()),
                    _mm256_loadu_si256(init.add(32).cast()),
                ],
                [
                    _mm256_loadu_si256(key.cast()),
                    _mm256_loadu_si256(key.add(32).cast()),
                ],
            )
        };
        let prime = _mm256_set1_epi32(PRIME32_1 as i32);
        let scramble_half = |acc: __m256i, key: __m256i| {
            let mixed = _mm256_xor_si256(acc, _mm256_srli_epi64::<47>(acc));
            let keyed = _mm256_xor_si256(mixed, key);
            let low = _mm256_mul_epu32(keyed, prime);
            let high = _mm256_mul_epu32(_mm256_srli_epi64::<32>(keyed), prime);
            _mm256_add_epi64(low, _mm256_slli_epi64::<32>(high))
        };
        let scramble = |[low, high]: [__m256i; 2]| {
            [
                scramble_half(low, scramble_key[0]),
                scramble_half(high, scramble_key[1]),
            ]
        };
        let acc = walk(acc, stripe, scramble);
        let mut out = [0u64; 8];
        // SAFETY: `out` is 64 bytes, two halves of 32.
        unsafe {
            let o = out.as_mut_ptr().cast::<u8>();
            _mm256_storeu_si256(o.cast(), acc[0]);
            _mm256_storeu_si256(o.add(32).cast(), acc[1]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of varied content: zeros, ones, text, and pseudo-random bytes.
    fn pages() -> Vec<[u8; PAGE_SIZE]> {
        let mut out = vec![[0u8; PAGE_SIZE], [0xff; PAGE_SIZE]];
        let mut text = [0u8; PAGE_SIZE];
        for (i, b) in text.iter_mut().enumerate() {
            *b = b"ferry moves pages "[i % 18];
        }
        out.push(text);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200 {
            let mut page = [0u8; PAGE_SIZE];
            for b in page.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            out.push(page);
        }
        out
    }

    #[test]
    fn every_width_this_cpu_runs_is_xxh3_bit_for_bit() {
        let widths: Vec<Width> = [Width::Portable, Width::Avx2, Width::Avx512]
            .into_iter()
            .filter(|w| runs(*w))
            .collect();
        for w in &widths {
            for page in pages() {
                assert_eq!(
                    hash_with(*w, &page),
                    xxhash_rust::xxh3::xxh3_64(&page),
                    "{w:?}"
                );
            }
        }
        println!(
            "page xxh3 checked on {widths:?}; this CPU uses {:?}",
            width()
        );
    }

    #[test]
    fn the_layout_constants_are_xxh3s_for_a_page() {
        assert_eq!((STRIPES_PER_BLOCK, BLOCK), (16, 1024));
        assert_eq!((FULL_BLOCKS, LAST_STRIPES), (3, 15));
    }
}
