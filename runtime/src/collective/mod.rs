//! Collectives for the data-parallel workers of one trial: ring all-reduce,
//! broadcast, all-gather and barrier over pluggable links.
//!
//! The ring schedule is a pure core (`ring`); links move bytes between neighbours
//! over TCP, QUIC or shared memory; `Communicator` drives the schedule over a
//! ring of links. Rendezvous (who is where) is `rendezvous`.
