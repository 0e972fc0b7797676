//! [`ObjectBytes`]: an object's bytes as handed to readers, without copying them
//! out of the tier they live in.
//!
//! Not here: checking the bytes against their id (the store does that before it
//! hands them out) or charging them to a tier.
//!
//! Invariant: the bytes never change while any clone is held; a map is only of a
//! file the store never writes again.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;

/// An object's bytes: shared memory from the memory tier or a read-only map of
/// the object's file, and in both cases cheap to clone.
///
/// Holding one keeps the bytes valid after the object is evicted or deleted (the
/// memory stays shared; an unlinked file stays mapped), so the store's tier
/// totals do not count bytes that readers still hold.
#[derive(Clone)]
pub struct ObjectBytes(Repr);

#[derive(Clone)]
enum Repr {
    Shared(Arc<[u8]>),
    Mapped(Arc<Mmap>),
}

impl ObjectBytes {
    pub(crate) fn shared(bytes: Arc<[u8]>) -> Self {
        Self(Repr::Shared(bytes))
    }

    pub(crate) fn mapped(map: Arc<Mmap>) -> Self {
        Self(Repr::Mapped(map))
    }

    /// Whether these bytes are a map of the object's file rather than memory.
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Repr::Mapped(_))
    }
}

impl Deref for ObjectBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Shared(bytes) => bytes,
            Repr::Mapped(map) => map,
        }
    }
}

impl AsRef<[u8]> for ObjectBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for ObjectBytes {
    /// Shows the length and the kind, never the contents, which may be gigabytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectBytes")
            .field("len", &self.len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}
