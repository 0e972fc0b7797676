//! A zeroed buffer that several tasks fill at once, each in its own range, and
//! that then becomes one `Arc<[u8]>` without a copy.
//!
//! Object fetches receive chunks on several QUIC streams. Received by one task,
//! the copies out of quinn and the page faults of a fresh buffer all land on one
//! core; spawned tasks spread them over the runtime's threads (a 256 MiB fetch on
//! loopback took about a quarter less time). Spawned tasks need owned, `'static`
//! access, which `&mut` slices of one allocation cannot give: this is the small
//! unsafe piece that can.
//!
//! Soundness rests on two things. Every byte is an `UnsafeCell`, so writing
//! through a shared allocation is allowed; and [`FillBuffer::split`] hands out
//! each byte in at most one [`FillRange`], so no two writers ever touch the same
//! byte. [`FillBuffer::finish`] gives the bytes out only once every range has
//! been dropped, so nobody writes after they are shared.

use std::cell::UnsafeCell;
use std::sync::Arc;

/// The buffer before it is filled: split it, fill the ranges, then finish it.
pub(crate) struct FillBuffer {
    cells: Arc<[UnsafeCell<u8>]>,
    split: bool,
}

/// One range of a [`FillBuffer`], writable by whoever holds it.
pub(crate) struct FillRange {
    cells: Arc<[UnsafeCell<u8>]>,
    start: usize,
    len: usize,
}

// SAFETY: a range is the only handle that writes its bytes (see `split`), and
// nothing reads them until every range is gone (see `finish`).
unsafe impl Send for FillRange {}
// SAFETY: the buffer itself touches no byte until `finish` has checked that it is
// the last handle.
unsafe impl Send for FillBuffer {}

impl std::fmt::Debug for FillBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FillBuffer")
            .field("len", &self.cells.len())
            .field("split", &self.split)
            .finish_non_exhaustive()
    }
}

impl FillBuffer {
    /// A buffer of `len` zero bytes. A large one comes as fresh pages from the
    /// kernel, so nothing writes the zeros before the ranges are filled.
    pub(crate) fn zeroed(len: usize) -> Self {
        let zeroed: Arc<[std::mem::MaybeUninit<u8>]> = Arc::new_zeroed_slice(len);
        ask_for_huge_pages(zeroed.as_ptr() as usize, len);
        // SAFETY: zero bytes are initialised u8s, and `UnsafeCell<u8>` has the
        // layout of `u8`, so the allocation is a valid `[UnsafeCell<u8>]`.
        let cells = unsafe { Arc::from_raw(Arc::into_raw(zeroed) as *const [UnsafeCell<u8>]) };
        Self {
            cells,
            split: false,
        }
    }

    /// The whole buffer in consecutive ranges of `piece` bytes (the last may be
    /// shorter), paired with their offsets. Only once: a second call returns none.
    pub(crate) fn split(&mut self, piece: usize) -> Vec<(usize, FillRange)> {
        if self.split {
            return Vec::new();
        }
        self.split = true;
        let piece = piece.max(1);
        (0..self.cells.len())
            .step_by(piece)
            .map(|start| {
                let range = FillRange {
                    cells: self.cells.clone(),
                    start,
                    len: piece.min(self.cells.len() - start),
                };
                (start, range)
            })
            .collect()
    }

    /// The filled bytes, once every range is dropped; the buffer back while a
    /// range is still alive.
    pub(crate) fn finish(mut self) -> Result<Arc<[u8]>, Self> {
        if Arc::get_mut(&mut self.cells).is_none() {
            return Err(self);
        }
        // SAFETY: no range is left, so nobody else can write; `UnsafeCell<u8>`
        // has the layout of `u8`.
        Ok(unsafe { Arc::from_raw(Arc::into_raw(self.cells) as *const [u8]) })
    }
}

/// Buffers at least this large are asked to be backed by huge pages.
const HUGE_PAGES_FROM: usize = 8 << 20;

/// Asks the kernel to back the whole 2 MiB pages within `len` bytes at `start`
/// (fresh, untouched memory) with huge pages where it only does so on request
/// (`transparent_hugepage` set to `madvise`): filling a fetched gigabyte then
/// takes 512 page faults instead of 262,144, which cost more than the copy.
/// Only advice: where it is refused the buffer is filled page by page.
fn ask_for_huge_pages(start: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    if len < HUGE_PAGES_FROM {
        return;
    }
    let first = start.next_multiple_of(HUGE);
    let end = (start + len) / HUGE * HUGE;
    if end > first {
        // SAFETY: the range lies within the allocation, which nothing has
        // touched yet; MADV_HUGEPAGE changes how it is backed, not its contents.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
}

impl FillRange {
    /// This range's bytes, to write.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let cells = &self.cells[self.start..self.start + self.len];
        // SAFETY: the bytes are cells, and this range is the only handle that
        // touches them (`split` hands each byte out once); `&mut self` keeps the
        // returned slice unique while it lives.
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_ptr()), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_filled_on_several_threads_make_one_buffer() {
        let mut buffer = FillBuffer::zeroed(10_000);
        let mut ranges = buffer.split(3_000);
        assert_eq!(
            ranges
                .iter_mut()
                .map(|(start, range)| (*start, range.bytes_mut().len()))
                .collect::<Vec<_>>(),
            vec![(0, 3_000), (3_000, 3_000), (6_000, 3_000), (9_000, 1_000)]
        );
        assert!(buffer.split(3_000).is_empty(), "split hands out bytes once");
        let threads: Vec<_> = ranges
            .into_iter()
            .map(|(start, mut range)| {
                std::thread::spawn(move || {
                    for (offset, byte) in range.bytes_mut().iter_mut().enumerate() {
                        *byte = ((start + offset) % 251) as u8;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("filler");
        }
        let bytes = buffer.finish().expect("every range dropped");
        assert_eq!(bytes.len(), 10_000);
        assert!(
            bytes
                .iter()
                .enumerate()
                .all(|(index, byte)| *byte == (index % 251) as u8)
        );
    }

    #[test]
    fn finish_waits_for_every_range() {
        let mut buffer = FillBuffer::zeroed(8);
        let mut ranges = buffer.split(4);
        let (_, mut kept) = ranges.pop().expect("two ranges");
        drop(ranges);
        let Err(buffer) = buffer.finish() else {
            panic!("finished while a range was alive");
        };
        kept.bytes_mut().fill(9);
        drop(kept);
        let bytes = buffer.finish().expect("no range left");
        assert_eq!(bytes.as_ref(), &[0, 0, 0, 0, 9, 9, 9, 9]);
    }

    #[test]
    fn an_empty_buffer_has_no_ranges() {
        let mut buffer = FillBuffer::zeroed(0);
        assert!(buffer.split(1 << 20).is_empty());
        assert!(buffer.finish().expect("empty").is_empty());
    }
}
