//! Bench binary under construction (issue 4); see ARCHITECTURE.md.

fn main() {}
