//! Hostile bytes, measured: every decoder of bytes from outside the process gets
//! arbitrary bytes and mutated valid encodings for a fixed number of cases (see
//! `hostile/mod.rs` for `XP_FUZZ_SCALE` and `XP_FUZZ_SEED`), and must answer each
//! with a value or its typed error, never a panic, while one decode's peak heap
//! stays under that decoder's limit, measured by the counting allocator below.
//! Each target prints how many inputs it ran (`-- --nocapture` shows it).

mod hostile;

#[global_allocator]
static ALLOCATOR: hostile::CountingAllocator = hostile::CountingAllocator;

#[test]
fn the_counting_allocator_is_in_use() {
    hostile::check_allocator_counts();
}
