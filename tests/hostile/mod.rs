//! The harness of the hostile-input targets: a counting allocator that measures one
//! decode's peak heap use on its own thread, the fixed-count proptest runner that
//! reports how many inputs a target ran, and the structure-aware mutations of valid
//! encodings (bit flips, truncations, splices, length fields set huge) that random
//! bytes alone rarely produce.
//!
//! Each target runs its default number of cases times `XP_FUZZ_SCALE` (1 when
//! unset); `XP_FUZZ_SEED` replays a run (every target prints its seed).

pub(crate) mod text;
pub(crate) mod wire;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};
use std::time::Instant;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use xp_runtime::seeded::{SplitMix64, mix_seed};

/// The system allocator, counting the live heap bytes of each thread and the
/// highest count since [`measure`] started, so one decode's peak is known even
/// while other tests allocate on other threads.
pub(crate) struct CountingAllocator;

thread_local! {
    // Const-initialised cells without destructors: reading them never allocates,
    // so the allocator can use them.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn grew(bytes: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().wrapping_add(bytes as isize);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(bytes: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().wrapping_sub(bytes as isize)));
}

// SAFETY: every call is forwarded unchanged to `System`; the counting touches only
// const-initialised thread-locals, which do not allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on as it is.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            grew(layout.size());
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            grew(layout.size());
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(pointer, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            // Counted as if both blocks were live for a moment (a moving realloc
            // holds both), so the peak is never under-counted.
            grew(new_size);
            shrank(layout.size());
        }
        moved
    }
}

/// Runs `work` and returns its result with the most heap bytes it held at once on
/// this thread (what it returns included, since that is dropped afterwards).
pub(crate) fn measure<R>(work: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(base));
    let result = work();
    let peak = PEAK.with(Cell::get).saturating_sub(base);
    (result, usize::try_from(peak).unwrap_or(0))
}

/// Whether the counting allocator is the one in use: a target whose peak is
/// always 0 would pass vacuously.
pub(crate) fn check_allocator_counts() {
    let (kept, peak) = measure(|| vec![7u8; 1 << 20]);
    assert_eq!(kept.len(), 1 << 20);
    assert!(peak >= 1 << 20, "the counting allocator saw {peak} bytes");
}

/// `XP_FUZZ_SCALE`, the factor on every target's default number of cases.
fn scale() -> u32 {
    match std::env::var("XP_FUZZ_SCALE") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("XP_FUZZ_SCALE={text:?} is not a whole number")),
        Err(_) => 1,
    }
}

/// `XP_FUZZ_SEED`, or a fresh seed for every run; the same for every target of
/// one run, so the printed seed replays them all.
fn base_seed() -> u64 {
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| match std::env::var("XP_FUZZ_SEED") {
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("XP_FUZZ_SEED={text:?} is not a number"))
        }
        // The standard library's per-process random hash keys: fresh inputs on
        // every run without a clock or another dependency.
        Err(_) => std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish(),
    })
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut generator = SplitMix64::new(seed);
    let mut bytes = [0u8; 32];
    for word in bytes.chunks_mut(8) {
        word.copy_from_slice(&generator.next_u64().to_le_bytes());
    }
    bytes
}

/// One decoder under attack.
pub(crate) struct Target {
    /// Printed with the counts.
    pub(crate) name: &'static str,
    /// Cases at `XP_FUZZ_SCALE=1`, sized so the whole set stays within about a
    /// minute in a debug build on two cores.
    pub(crate) cases: u32,
    /// The most heap one decode may hold at once, whatever the input: the
    /// decoder's documented limit.
    pub(crate) limit: usize,
    /// What a text decoder may also hold per byte of its input (0 for a binary
    /// wire, whose limit is fixed): parsers build trees, so the input bounds
    /// their heap; what no input may do is make a short text cost unbounded.
    pub(crate) per_input_byte: usize,
}

impl Target {
    fn bound(&self, input_len: usize) -> usize {
        self.limit
            .saturating_add(self.per_input_byte.saturating_mul(input_len))
    }
}

/// Runs `decode` on `target.cases` inputs from `inputs`, failing on a panic or on
/// a decode whose peak heap exceeds the limit; prints how many inputs ran, how
/// many were accepted, the highest peak and the time.
///
/// `decode` answers whether the decoder accepted the input; its error must be a
/// typed one, which the compiler sees at each call.
#[expect(
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a target says how many inputs it ran and how long they took"
)]
pub(crate) fn run<S: Strategy<Value = Vec<u8>>>(
    target: &Target,
    inputs: S,
    decode: impl Fn(&[u8]) -> bool,
) {
    let seed = mix_seed(base_seed(), name_key(target.name));
    let cases = target.cases.saturating_mul(scale());
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed)),
    );
    let ran = Cell::new(0u64);
    let accepted = Cell::new(0u64);
    let highest = Cell::new(0usize);
    let started = Instant::now();
    let outcome = runner.run(&inputs, |input| {
        let (was_accepted, peak) = measure(|| decode(&input));
        ran.set(ran.get() + 1);
        accepted.set(accepted.get() + u64::from(was_accepted));
        highest.set(highest.get().max(peak));
        let bound = target.bound(input.len());
        prop_assert!(
            peak <= bound,
            "{}: one decode of {} bytes held {peak} bytes, over its limit of {bound}",
            target.name,
            input.len()
        );
        Ok(())
    });
    eprintln!(
        "hostile {}: {} inputs ({} accepted) in {:.1} s; peak {} bytes (limit {} + {}/input byte); XP_FUZZ_SEED={:#x}",
        target.name,
        ran.get(),
        accepted.get(),
        started.elapsed().as_secs_f64(),
        highest.get(),
        target.limit,
        target.per_input_byte,
        base_seed(),
    );
    if let Err(failure) = outcome {
        panic!("{}: {failure}", target.name);
    }
}

/// A target's own seed stream: FNV-1a of its name.
fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Values that make length fields and counters hostile: bincode's varint tags
/// (251 to 254 announce a u16, u32, u64, u128 to follow), all-ones, zero, and
/// the edges of signed ranges.
const NASTY: [&[u8]; 9] = [
    &[0xff; 8],
    &[0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    &[0xfc, 0xff, 0xff, 0xff, 0xff],
    &[0xfb, 0xff, 0xff],
    &[0xfe],
    &[0x00; 4],
    &[0x7f, 0xff, 0xff, 0xff],
    &[0x80, 0x00, 0x00, 0x00],
    &[0xff, 0xff, 0xff, 0xff],
];

/// One edit of a valid encoding.
#[derive(Debug, Clone)]
enum Edit {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Truncate(Index),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
    Nasty(Index, usize),
    Token(Index, usize),
    Repeat(Index, usize, usize),
}

impl Edit {
    fn apply(&self, bytes: &mut Vec<u8>, tokens: &[&str]) {
        let at = |index: &Index, len: usize| if len == 0 { 0 } else { index.index(len) };
        match self {
            Self::FlipBit(index, bit) if !bytes.is_empty() => {
                let position = at(index, bytes.len());
                bytes[position] ^= 1 << (bit % 8);
            }
            Self::SetByte(index, value) if !bytes.is_empty() => {
                let position = at(index, bytes.len());
                bytes[position] = *value;
            }
            Self::Truncate(index) => bytes.truncate(at(index, bytes.len() + 1)),
            Self::Insert(index, insert) => {
                let position = at(index, bytes.len() + 1);
                bytes.splice(position..position, insert.iter().copied());
            }
            Self::Remove(index, count) => {
                let position = at(index, bytes.len() + 1);
                let end = (position + count).min(bytes.len());
                bytes.drain(position..end);
            }
            Self::Nasty(index, which) => {
                let nasty = NASTY[which % NASTY.len()];
                let position = at(index, bytes.len() + 1);
                let end = (position + nasty.len()).min(bytes.len());
                bytes.splice(position..end, nasty.iter().copied());
            }
            Self::Token(index, which) if !tokens.is_empty() => {
                let token = tokens[which % tokens.len()].as_bytes();
                let position = at(index, bytes.len() + 1);
                bytes.splice(position..position, token.iter().copied());
            }
            Self::Repeat(index, len, times) if !bytes.is_empty() => {
                let position = at(index, bytes.len());
                let end = (position + len).min(bytes.len());
                let piece = bytes[position..end].to_vec();
                for _ in 0..*times {
                    bytes.splice(end..end, piece.iter().copied());
                }
            }
            _ => {}
        }
    }
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(index, bit)| Edit::FlipBit(index, bit)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(index, value)| Edit::SetByte(index, value)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        1 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(index, bytes)| Edit::Insert(index, bytes)),
        1 => (any::<Index>(), 1usize..32).prop_map(|(index, count)| Edit::Remove(index, count)),
        3 => (any::<Index>(), any::<usize>()).prop_map(|(index, which)| Edit::Nasty(index, which)),
        3 => (any::<Index>(), any::<usize>()).prop_map(|(index, which)| Edit::Token(index, which)),
        1 => (any::<Index>(), 1usize..16, 1usize..64)
            .prop_map(|(index, len, times)| Edit::Repeat(index, len, times)),
    ]
}

/// Valid encodings from `corpus` with one to four edits, and now and then a
/// token of the format (`tokens`: YAML or CSV syntax, huge numbers) spliced in.
pub(crate) fn mutated(
    corpus: Vec<Vec<u8>>,
    tokens: &'static [&'static str],
) -> impl Strategy<Value = Vec<u8>> {
    assert!(!corpus.is_empty(), "a mutation target needs valid inputs");
    let count = corpus.len();
    (0..count, proptest::collection::vec(edit(), 1..5)).prop_map(move |(pick, edits)| {
        let mut bytes = corpus[pick].clone();
        for edit in &edits {
            edit.apply(&mut bytes, tokens);
        }
        bytes
    })
}

/// Arbitrary bytes, up to `max` of them.
pub(crate) fn random_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Random bytes and mutated valid encodings, one in four random.
pub(crate) fn bytes_and_mutations(
    corpus: Vec<Vec<u8>>,
    tokens: &'static [&'static str],
    max_random: usize,
) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![1 => random_bytes(max_random), 3 => mutated(corpus, tokens)]
}

/// Text made of the format's own tokens in random order: syntax that random bytes
/// reach only by luck (anchors, nesting, quotes, huge numbers).
pub(crate) fn token_soup(tokens: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(proptest::sample::select(tokens), 0..96)
        .prop_map(|picked| picked.concat().into_bytes())
}

/// Inputs for a text format: random bytes, token soup, and (most) mutated valid
/// documents.
pub(crate) fn text_inputs(
    corpus: Vec<Vec<u8>>,
    tokens: &'static [&'static str],
) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => random_bytes(256),
        1 => token_soup(tokens),
        4 => mutated(corpus, tokens),
    ]
}
