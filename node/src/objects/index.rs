//! The store's in-memory index: which objects exist, where, who owns them, and
//! how many bytes each tier is charged.
//!
//! No I/O: the store decides what to write from what this returns, and tells it
//! what happened. Everything here runs under the store's lock, so it must stay
//! cheap (no hashing, no copying of object bytes).
//!
//! Invariant: `memory_used`, `disk_used` and the counts always equal a recount
//! of `entries` by location, and `lru` holds exactly the `Memory` entries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};

use memmap2::Mmap;
use xp_runtime::ids::ObjectId;

use super::error::StoreError;
use super::object_bytes::ObjectBytes;
use super::types::{ObjectInfo, Owner, StoreLimits, StoreStats, Tier};

/// One stored object.
#[derive(Debug)]
struct Entry {
    size: u64,
    owners: BTreeSet<Owner>,
    pinned: bool,
    location: Location,
}

/// Where an entry's bytes are.
#[derive(Debug)]
enum Location {
    /// In memory; `tick` is its place in the LRU order.
    Memory { bytes: Arc<[u8]>, tick: u64 },
    /// Still in memory and charged to it, while its file is being written.
    Spilling { bytes: Arc<[u8]>, generation: u64 },
    /// In its file. `generation` changes with every file written for this id, so
    /// a check done without the lock can tell whether it saw the current file;
    /// `mapped` is the last verified map, reused while some reader holds it.
    Disk { generation: u64, mapped: Weak<Mmap> },
}

/// A memory object chosen to move to disk; its bytes stay readable meanwhile.
#[derive(Debug)]
pub(crate) struct Victim {
    pub(crate) id: ObjectId,
    pub(crate) bytes: Arc<[u8]>,
    pub(crate) size: u64,
    pub(crate) generation: u64,
}

/// How a new memory object can get its room.
#[derive(Debug)]
pub(crate) enum MemoryPlan {
    /// It fits as things are.
    Fits,
    /// It fits once these victims are on disk; their disk space is reserved.
    Spill(Vec<Victim>),
    /// Nothing that can spill would make room (or the disk cannot take it).
    NoRoom,
}

/// What a lookup found.
#[derive(Debug)]
pub(crate) enum Lookup {
    Absent,
    /// Bytes that can be returned as they are.
    Ready(ObjectBytes),
    /// A disk object whose file must be mapped and verified first.
    OnDisk {
        generation: u64,
    },
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Index {
    limits: StoreLimits,
    entries: HashMap<ObjectId, Entry>,
    /// Memory entries by last use, oldest first.
    lru: BTreeMap<u64, ObjectId>,
    next_tick: u64,
    next_generation: u64,
    memory_used: u64,
    memory_objects: u64,
    disk_used: u64,
    disk_objects: u64,
    /// Disk bytes promised to writes in progress.
    disk_reserved: u64,
}

impl Index {
    pub(crate) fn new(limits: StoreLimits) -> Self {
        Self {
            limits,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            next_tick: 0,
            next_generation: 0,
            memory_used: 0,
            memory_objects: 0,
            disk_used: 0,
            disk_objects: 0,
            disk_reserved: 0,
        }
    }

    pub(crate) fn ids(&self) -> Vec<ObjectId> {
        self.entries.keys().copied().collect()
    }

    pub(crate) fn stats(&self) -> StoreStats {
        StoreStats {
            memory_bytes: self.memory_used,
            memory_objects: self.memory_objects,
            disk_bytes: self.disk_used,
            disk_objects: self.disk_objects,
        }
    }

    pub(crate) fn info(&self, id: &ObjectId) -> Option<ObjectInfo> {
        let entry = self.entries.get(id)?;
        Some(ObjectInfo {
            size: entry.size,
            tier: match entry.location {
                Location::Memory { .. } | Location::Spilling { .. } => Tier::Memory,
                Location::Disk { .. } => Tier::Disk,
            },
            owners: entry.owners.iter().cloned().collect(),
            pinned: entry.pinned,
        })
    }

    /// Disk bytes neither used nor reserved.
    pub(crate) fn disk_available(&self) -> u64 {
        self.limits
            .disk_bytes
            .saturating_sub(self.disk_used + self.disk_reserved)
    }

    /// The object's bytes, or what must happen to get them; a memory hit counts
    /// as a use for the LRU order.
    pub(crate) fn lookup(&mut self, id: &ObjectId) -> Lookup {
        let Some(entry) = self.entries.get_mut(id) else {
            return Lookup::Absent;
        };
        match &mut entry.location {
            Location::Memory { bytes, tick } => {
                let object_bytes = ObjectBytes::shared(Arc::clone(bytes));
                self.lru.remove(tick);
                *tick = self.next_tick;
                self.lru.insert(self.next_tick, *id);
                self.next_tick += 1;
                Lookup::Ready(object_bytes)
            }
            Location::Spilling { bytes, .. } => {
                Lookup::Ready(ObjectBytes::shared(Arc::clone(bytes)))
            }
            Location::Disk { generation, mapped } => match mapped.upgrade() {
                Some(map) => Lookup::Ready(ObjectBytes::mapped(map)),
                None => Lookup::OnDisk {
                    generation: *generation,
                },
            },
        }
    }

    /// Keeps a verified map for later lookups, if the entry still names the file
    /// that was mapped.
    pub(crate) fn remember_map(&mut self, id: &ObjectId, generation: u64, map: &Arc<Mmap>) {
        if let Some(Entry {
            location:
                Location::Disk {
                    generation: current,
                    mapped,
                },
            ..
        }) = self.entries.get_mut(id)
            && *current == generation
        {
            *mapped = Arc::downgrade(map);
        }
    }

    pub(crate) fn is_disk_generation(&self, id: &ObjectId, generation: u64) -> bool {
        matches!(
            self.entries.get(id),
            Some(Entry { location: Location::Disk { generation: current, .. }, .. }) if *current == generation
        )
    }

    /// The generation of the object's file, if it is on disk.
    pub(crate) fn disk_generation(&self, id: &ObjectId) -> Option<u64> {
        match self.entries.get(id) {
            Some(Entry {
                location: Location::Disk { generation, .. },
                ..
            }) => Some(*generation),
            _ => None,
        }
    }

    pub(crate) fn is_on_disk(&self, id: &ObjectId) -> bool {
        matches!(
            self.entries.get(id),
            Some(Entry {
                location: Location::Disk { .. },
                ..
            })
        )
    }

    pub(crate) fn is_spilling(&self, id: &ObjectId, generation: u64) -> bool {
        matches!(
            self.entries.get(id),
            Some(Entry { location: Location::Spilling { generation: current, .. }, .. }) if *current == generation
        )
    }

    /// Adds `owner` if the object exists (a memory object counts as used);
    /// returns whether it exists.
    pub(crate) fn add_owner(&mut self, id: &ObjectId, owner: &Owner) -> bool {
        let Some(entry) = self.entries.get_mut(id) else {
            return false;
        };
        if !entry.owners.contains(owner) {
            entry.owners.insert(owner.clone());
        }
        if let Location::Memory { tick, .. } = &mut entry.location {
            self.lru.remove(tick);
            *tick = self.next_tick;
            self.lru.insert(self.next_tick, *id);
            self.next_tick += 1;
        }
        true
    }

    /// Sets the pin; returns whether the object exists.
    pub(crate) fn set_pinned(&mut self, id: &ObjectId, pinned: bool) -> bool {
        match self.entries.get_mut(id) {
            Some(entry) => {
                entry.pinned = pinned;
                true
            }
            None => false,
        }
    }

    /// Whether the object exists with no owner and no pin.
    pub(crate) fn is_collectable(&self, id: &ObjectId) -> bool {
        self.entries
            .get(id)
            .is_some_and(|entry| entry.owners.is_empty() && !entry.pinned)
    }

    /// Removes `owner` from one object; returns whether it had that owner.
    pub(crate) fn remove_owner(&mut self, id: &ObjectId, owner: &Owner) -> bool {
        self.entries
            .get_mut(id)
            .is_some_and(|entry| entry.owners.remove(owner))
    }

    /// Removes `owner` from every object; returns the objects it left collectable.
    pub(crate) fn remove_owner_everywhere(&mut self, owner: &Owner) -> Vec<ObjectId> {
        let mut collectable = Vec::new();
        for (id, entry) in &mut self.entries {
            if entry.owners.remove(owner) && entry.owners.is_empty() && !entry.pinned {
                collectable.push(*id);
            }
        }
        collectable.sort();
        collectable
    }

    /// Whether `size` more bytes fit the memory tier without evicting.
    pub(crate) fn memory_fits(&self, size: u64) -> bool {
        self.memory_used + size <= self.limits.memory_bytes
    }

    /// Decides how a new memory object of `size` bytes gets its room: as is, by
    /// spilling the least recently used objects (marked spilling here, with their
    /// disk space reserved), or not at all.
    pub(crate) fn plan_memory(&mut self, size: u64) -> MemoryPlan {
        if size > self.limits.memory_bytes {
            return MemoryPlan::NoRoom;
        }
        if self.memory_fits(size) {
            return MemoryPlan::Fits;
        }
        let needed = self.memory_used + size - self.limits.memory_bytes;
        let mut chosen = Vec::new();
        let mut freed = 0;
        for id in self.lru.values() {
            if freed >= needed {
                break;
            }
            let size = self.entries.get(id).map_or(0, |entry| entry.size);
            // Spilling an empty object frees nothing.
            if size > 0 {
                chosen.push(*id);
                freed += size;
            }
        }
        if freed < needed || freed > self.disk_available() {
            return MemoryPlan::NoRoom;
        }
        let mut victims = Vec::with_capacity(chosen.len());
        for id in chosen {
            let generation = self.next_generation;
            self.next_generation += 1;
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            if let Location::Memory { bytes, tick } = &entry.location {
                self.lru.remove(tick);
                victims.push(Victim {
                    id,
                    bytes: Arc::clone(bytes),
                    size: entry.size,
                    generation,
                });
                entry.location = Location::Spilling {
                    bytes: Arc::clone(bytes),
                    generation,
                };
            }
        }
        self.disk_reserved += victims.iter().map(|victim| victim.size).sum::<u64>();
        MemoryPlan::Spill(victims)
    }

    /// A victim's file is in place: it moves from the memory to the disk tier.
    /// Nothing happens if it was deleted (or deleted and put again) meanwhile.
    pub(crate) fn complete_spill(&mut self, id: &ObjectId, generation: u64) {
        let Some(entry) = self.entries.get_mut(id) else {
            return;
        };
        if !matches!(entry.location, Location::Spilling { generation: current, .. } if current == generation)
        {
            return;
        }
        entry.location = Location::Disk {
            generation,
            mapped: Weak::new(),
        };
        self.memory_used -= entry.size;
        self.memory_objects -= 1;
        self.disk_used += entry.size;
        self.disk_objects += 1;
    }

    /// A victim could not be written: it stays a memory object, now counted as
    /// the most recently used so the next eviction tries others first.
    pub(crate) fn revert_spill(&mut self, id: &ObjectId, generation: u64) {
        let Some(entry) = self.entries.get_mut(id) else {
            return;
        };
        let Location::Spilling {
            bytes,
            generation: current,
        } = &entry.location
        else {
            return;
        };
        if *current != generation {
            return;
        }
        let tick = self.next_tick;
        self.next_tick += 1;
        entry.location = Location::Memory {
            bytes: Arc::clone(bytes),
            tick,
        };
        self.lru.insert(tick, *id);
    }

    /// Inserts a new memory object; the caller checked that it fits.
    pub(crate) fn insert_memory(&mut self, id: ObjectId, bytes: Arc<[u8]>, owner: Owner) {
        let size = bytes.len() as u64;
        assert!(
            self.memory_fits(size),
            "memory object inserted without room"
        );
        let tick = self.next_tick;
        self.next_tick += 1;
        self.lru.insert(tick, id);
        self.memory_used += size;
        self.memory_objects += 1;
        let previous = self.entries.insert(
            id,
            Entry {
                size,
                owners: BTreeSet::from([owner]),
                pinned: false,
                location: Location::Memory { bytes, tick },
            },
        );
        assert!(previous.is_none(), "object {id} inserted twice");
    }

    /// Reserves disk space for a write about to start, or says why there is none.
    pub(crate) fn reserve_disk(&mut self, size: u64) -> Result<(), StoreError> {
        self.check_disk_room(size)?;
        self.disk_reserved += size;
        Ok(())
    }

    pub(crate) fn unreserve_disk(&mut self, size: u64) {
        self.disk_reserved -= size;
    }

    pub(crate) fn check_disk_room(&self, size: u64) -> Result<(), StoreError> {
        let available = self.disk_available();
        if size > available {
            return Err(StoreError::Full {
                needed: size,
                available,
                limit: self.limits.disk_bytes,
            });
        }
        Ok(())
    }

    /// Indexes a new disk object whose file is in place; the caller checked room.
    pub(crate) fn insert_disk(&mut self, id: ObjectId, size: u64, owner: Owner) {
        self.insert_disk_entry(id, size, BTreeSet::from([owner]));
    }

    /// Indexes a file found at open: no owners, no pin, and no room check, since
    /// the file is already there.
    pub(crate) fn insert_recovered(&mut self, id: ObjectId, size: u64) {
        self.insert_disk_entry(id, size, BTreeSet::new());
    }

    fn insert_disk_entry(&mut self, id: ObjectId, size: u64, owners: BTreeSet<Owner>) {
        let generation = self.next_generation;
        self.next_generation += 1;
        self.disk_used += size;
        self.disk_objects += 1;
        let previous = self.entries.insert(
            id,
            Entry {
                size,
                owners,
                pinned: false,
                location: Location::Disk {
                    generation,
                    mapped: Weak::new(),
                },
            },
        );
        assert!(previous.is_none(), "object {id} inserted twice");
    }

    /// Drops an entry and its charge; the caller deals with its file.
    pub(crate) fn remove(&mut self, id: &ObjectId) {
        let Some(entry) = self.entries.remove(id) else {
            return;
        };
        match entry.location {
            Location::Memory { tick, .. } => {
                self.lru.remove(&tick);
                self.memory_used -= entry.size;
                self.memory_objects -= 1;
            }
            Location::Spilling { .. } => {
                self.memory_used -= entry.size;
                self.memory_objects -= 1;
            }
            Location::Disk { .. } => {
                self.disk_used -= entry.size;
                self.disk_objects -= 1;
            }
        }
    }

    /// Stats counted again from the entries, and the ids of disk entries, for
    /// tests to compare with [`stats`](Self::stats) and the directory.
    #[cfg(test)]
    pub(crate) fn recount(&self) -> (StoreStats, BTreeSet<ObjectId>) {
        let mut stats = StoreStats::default();
        let mut on_disk = BTreeSet::new();
        for (id, entry) in &self.entries {
            match entry.location {
                Location::Memory { .. } | Location::Spilling { .. } => {
                    stats.memory_bytes += entry.size;
                    stats.memory_objects += 1;
                }
                Location::Disk { .. } => {
                    stats.disk_bytes += entry.size;
                    stats.disk_objects += 1;
                    on_disk.insert(*id);
                }
            }
        }
        assert_eq!(
            self.lru.len() as u64,
            self.entries
                .values()
                .filter(|entry| matches!(entry.location, Location::Memory { .. }))
                .count() as u64
        );
        assert_eq!(
            self.disk_reserved, 0,
            "no write is in progress when tests recount"
        );
        (stats, on_disk)
    }
}
