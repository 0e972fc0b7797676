//! The cursors of the paged listings: what a page's `next_cursor` says and how
//! the next request's `cursor` is read back.
//!
//! A cursor is the sort key of the last item returned, as text: `e:AT:ID` for
//! experiments (newest first), `SORT:INDEX` or `SORT:VALUE:INDEX` for trials
//! (the value's bits in hex, exact where a decimal would round), `n:ID` for
//! nodes, `q:NAME` for queues, `m:SEQ` for metric reports. Clients treat them
//! as opaque; decoding accepts exactly what encoding writes (no sign, no spaces)
//! and refuses a cursor of another order, so an edited or mixed-up cursor is
//! a clear 400, never a page from somewhere unexpected.

use std::cmp::Ordering;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, NodeId};

/// A cursor the client sent that this API did not hand out for this listing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    /// Not a cursor at all (edited, truncated, or from another listing).
    #[error("not a cursor this listing handed out; start again without one")]
    Malformed,
    /// A cursor of the same listing in another order.
    #[error(
        "a cursor of sort order `{cursor}`, not `{wanted}`: keep the sort a listing started with"
    )]
    OtherSort {
        /// The order the cursor was made for.
        cursor: String,
        /// The order asked for now.
        wanted: &'static str,
    },
}

/// Where a listing of experiments (newest first) continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExperimentCursor {
    pub(super) submitted_at: UnixMillis,
    pub(super) id: ExperimentId,
}

impl ExperimentCursor {
    /// The cursor's text.
    pub fn encode(&self) -> String {
        format!("e:{}:{}", self.submitted_at, self.id)
    }

    /// A cursor from its text.
    pub fn decode(text: &str) -> Result<Self, CursorError> {
        let rest = text.strip_prefix("e:").ok_or(CursorError::Malformed)?;
        let (at, id) = rest.split_once(':').ok_or(CursorError::Malformed)?;
        Ok(Self {
            submitted_at: at.parse().map_err(|_| CursorError::Malformed)?,
            id: id.parse().map_err(|_| CursorError::Malformed)?,
        })
    }

    /// Newest first, then by id: later in the listing is larger.
    pub(super) fn key(&self) -> (std::cmp::Reverse<UnixMillis>, ExperimentId) {
        (std::cmp::Reverse(self.submitted_at), self.id)
    }
}

/// The order of a trial listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialSort {
    /// By trial index, oldest first (the default).
    Id,
    /// By trial index, newest first.
    IdDesc,
    /// By a metric's last value, smallest first; trials without it last.
    Metric,
    /// By a metric's last value, largest first; trials without it last.
    MetricDesc,
}

impl TrialSort {
    /// Every order, by name.
    pub const ALL: [Self; 4] = [Self::Id, Self::IdDesc, Self::Metric, Self::MetricDesc];

    /// The name the `sort=` parameter uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Id => "id",
            Self::IdDesc => "-id",
            Self::Metric => "metric",
            Self::MetricDesc => "-metric",
        }
    }

    /// The order named `text`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|sort| sort.as_str() == text)
    }

    pub(super) fn by_metric(self) -> bool {
        matches!(self, Self::Metric | Self::MetricDesc)
    }
}

/// An `f64` ordered by [`f64::total_cmp`].
#[derive(Debug, Clone, Copy)]
struct TotalF64(f64);

impl PartialEq for TotalF64 {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for TotalF64 {}

impl PartialOrd for TotalF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TotalF64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A trial's place in a listing: later in the listing is larger. One shape for
/// every order, so one heap and one comparison serve them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct SortKey {
    /// Trials without the metric come after those with it, in both directions.
    missing: bool,
    /// The metric's value, negated for a descending sort; 0 when not sorting by
    /// a metric or when missing.
    value: TotalF64,
    /// The trial index, negated for `-id`; ties of a metric break by index.
    index: i64,
}

impl SortKey {
    pub(super) fn new(sort: TrialSort, index: u32, value: Option<f64>) -> Self {
        let value = value.filter(|value| !value.is_nan());
        let (missing, value) = match (sort, value) {
            (TrialSort::Metric, Some(value)) => (false, value),
            (TrialSort::MetricDesc, Some(value)) => (false, -value),
            (TrialSort::Metric | TrialSort::MetricDesc, None) => (true, 0.0),
            (TrialSort::Id | TrialSort::IdDesc, _) => (false, 0.0),
        };
        let index = i64::from(index);
        Self {
            missing,
            value: TotalF64(value),
            index: if sort == TrialSort::IdDesc {
                -index
            } else {
                index
            },
        }
    }
}

/// Where a trial listing continues: the order and the last trial's key in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrialCursor {
    pub(super) sort: TrialSort,
    pub(super) index: u32,
    /// The last trial's metric value, for metric orders (`None`: it had none).
    pub(super) value: Option<f64>,
}

impl TrialCursor {
    /// The cursor's text: `SORT:INDEX`, or `SORT:VALUE:INDEX` with the value's
    /// bits in hex (exact, unlike a decimal) or `none`.
    pub fn encode(&self) -> String {
        if self.sort.by_metric() {
            let value = self.value.map_or_else(
                || "none".to_owned(),
                |value| format!("{:016x}", value.to_bits()),
            );
            format!("{}:{value}:{}", self.sort.as_str(), self.index)
        } else {
            format!("{}:{}", self.sort.as_str(), self.index)
        }
    }

    /// A cursor from its text, for a listing in order `sort`.
    pub fn decode(text: &str, sort: TrialSort) -> Result<Self, CursorError> {
        let (sort_name, rest) = text.split_once(':').ok_or(CursorError::Malformed)?;
        let cursor_sort = TrialSort::parse(sort_name).ok_or(CursorError::Malformed)?;
        let (value, index) = if cursor_sort.by_metric() {
            let (value, index) = rest.split_once(':').ok_or(CursorError::Malformed)?;
            let value = match value {
                "none" => None,
                bits if bits.len() == 16 => Some(f64::from_bits(
                    u64::from_str_radix(bits, 16).map_err(|_| CursorError::Malformed)?,
                )),
                _ => return Err(CursorError::Malformed),
            };
            (value, index)
        } else {
            (None, rest)
        };
        // `u32::from_str` takes a leading `+`; a cursor this module wrote never has one.
        if !index.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(CursorError::Malformed);
        }
        let index = index.parse().map_err(|_| CursorError::Malformed)?;
        if cursor_sort != sort {
            return Err(CursorError::OtherSort {
                cursor: cursor_sort.as_str().to_owned(),
                wanted: sort.as_str(),
            });
        }
        Ok(Self { sort, index, value })
    }

    pub(super) fn key(&self) -> SortKey {
        SortKey::new(self.sort, self.index, self.value)
    }
}

/// Where a listing of nodes (by id) continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCursor(pub(super) NodeId);

impl NodeCursor {
    /// The cursor's text.
    pub fn encode(&self) -> String {
        format!("n:{}", self.0)
    }

    /// A cursor from its text.
    pub fn decode(text: &str) -> Result<Self, CursorError> {
        let id = text.strip_prefix("n:").ok_or(CursorError::Malformed)?;
        id.parse().map(Self).map_err(|_| CursorError::Malformed)
    }
}

/// Where a listing of queues (by name) continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueCursor(pub(super) String);

impl QueueCursor {
    /// The cursor's text.
    pub fn encode(&self) -> String {
        format!("q:{}", self.0)
    }

    /// A cursor from its text.
    pub fn decode(text: &str) -> Result<Self, CursorError> {
        let name = text.strip_prefix("q:").ok_or(CursorError::Malformed)?;
        Ok(Self(name.to_owned()))
    }
}

/// Where a listing of a trial's metric reports (in arrival order) continues:
/// the registry's sequence number of the last report returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricCursor(pub u64);

impl MetricCursor {
    /// The cursor's text.
    pub fn encode(&self) -> String {
        format!("m:{}", self.0)
    }

    /// A cursor from its text.
    pub fn decode(text: &str) -> Result<Self, CursorError> {
        let seq = text.strip_prefix("m:").ok_or(CursorError::Malformed)?;
        if !seq.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(CursorError::Malformed);
        }
        seq.parse().map(Self).map_err(|_| CursorError::Malformed)
    }
}
