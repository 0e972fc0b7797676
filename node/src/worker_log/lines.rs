//! Splitting a worker's output into bounded lines as chunks arrive, so metric
//! and checkpoint lines are parsed as soon as they end.
//!
//! Not here: reading the pipe or writing the log (the worker's pump does both
//! with whole chunks), and parsing lines (`xp_runtime::metric_line`).
//!
//! Invariants: at most `max` bytes of a line are held, however long it is; a line
//! longer than `max` comes out once, as [`Line::TooLong`] when it ends, so the
//! next line starts cleanly; a line wholly inside one chunk is not copied.

/// One line of output.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// A line of at most the limit, with its newline unless it ended the output.
    Whole(&'a [u8]),
    /// A line longer than the limit: its first `max` bytes and its whole length.
    TooLong {
        /// The line's beginning.
        start: &'a [u8],
        /// The line's length in bytes, newline included.
        len: usize,
    },
}

/// A sans-io line splitter over chunks of output.
#[derive(Debug)]
pub(crate) struct LineSplitter {
    max: usize,
    /// The current line's first bytes (at most `max`) when it spans chunks.
    carried: Vec<u8>,
    /// The current line's length so far.
    len: usize,
    /// The last line returned borrowed `carried`: clear it before going on.
    returned: bool,
}

impl LineSplitter {
    /// A splitter for lines of at most `max` bytes, newline included.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            carried: Vec::new(),
            len: 0,
            returned: false,
        }
    }

    /// Takes bytes of `input` up to and including its first newline: how many
    /// were taken, and the line they ended, if they ended one.
    pub(crate) fn next<'a>(&'a mut self, input: &'a [u8]) -> (usize, Option<Line<'a>>) {
        self.forget_returned();
        let newline = input.iter().position(|byte| *byte == b'\n');
        let taken = newline.map_or(input.len(), |at| at + 1);
        let piece = &input[..taken];
        let before = self.len;
        self.len += taken;
        if newline.is_some() && before == 0 && taken <= self.max {
            self.len = 0;
            return (taken, Some(Line::Whole(piece)));
        }
        let room = self.max.saturating_sub(self.carried.len());
        self.carried
            .extend_from_slice(&piece[..piece.len().min(room)]);
        if newline.is_none() {
            return (taken, None);
        }
        (taken, Some(self.take_line()))
    }

    /// The last line, when the output ended without a newline.
    pub(crate) fn finish(&mut self) -> Option<Line<'_>> {
        self.forget_returned();
        (self.len > 0).then(|| self.take_line())
    }

    fn take_line(&mut self) -> Line<'_> {
        let len = std::mem::take(&mut self.len);
        self.returned = true;
        if len > self.max {
            Line::TooLong {
                start: &self.carried,
                len,
            }
        } else {
            Line::Whole(&self.carried)
        }
    }

    fn forget_returned(&mut self) {
        if self.returned {
            self.carried.clear();
            self.returned = false;
        }
    }
}
