//! Output-reference sets at the cost of the read (#50): per session an [`Index`] (numbers'
//! places and call keys, extended as the session grows) and the sets already derived, kept
//! across reads in one process-wide cache bounded by [`OUTPUT_REF_CACHE_BYTES`] (least recently
//! used sessions evicted first).
//!
//! A set is immutable once its message is durable (its records name only what the request of
//! its message showed), so a cached set is the set a fresh derivation gives, byte for byte. The
//! one input that may still arrive later is a call set's own call key (the intent follows its
//! message): a call set without one is derived at every read and never kept. An index belongs
//! to one WAL incarnation; a session deleted and created again starts a new one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use super::ids::{SetId, SetSalt};
use super::index::{Coverage, Index};
use super::sets::{self, Inputs, Set};
pub use crate::limits::OUTPUT_REF_CACHE_BYTES;
use crate::lineage::read;
use crate::lineage::reader::Reader;
use crate::lineage::LineageError;
use crate::message::Role;

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// The set the id names.
    Set(Arc<Set>),
    /// No set of this session has that id (or the session renders no numbers).
    Unknown,
    /// The index cannot answer (a message out of order): derive over the whole transcript.
    Uncovered,
}

/// What keeping a session's entry did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Kept; `evicted` other sessions' entries made room.
    Kept { evicted: usize },
    /// The entry alone is over the budget: not kept (the next read starts over).
    TooLarge,
}

/// One session's kept state.
struct Entry {
    index: Index,
    sets: HashMap<(u64, Option<usize>), Arc<Set>>,
    sets_bytes: usize,
    used: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.index.bytes() + self.sets_bytes
    }
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, (Entry, usize)>,
    /// Entries by last use, oldest first.
    order: BTreeMap<u64, String>,
    total: usize,
    clock: u64,
}

/// The process's output-reference cache, shared by the op workers.
pub struct RefCache {
    budget: usize,
    inner: Mutex<Inner>,
}

impl Default for RefCache {
    fn default() -> RefCache {
        RefCache::new(OUTPUT_REF_CACHE_BYTES)
    }
}

impl RefCache {
    pub fn new(budget: usize) -> RefCache {
        RefCache { budget, inner: Mutex::new(Inner::default()) }
    }

    /// Bytes held across every session.
    pub fn bytes(&self) -> usize {
        self.inner.lock().total
    }

    /// Sessions held.
    pub fn sessions(&self) -> usize {
        self.inner.lock().entries.len()
    }

    /// The set `parse` names (given the session's salt) in the session `reader` reads.
    pub fn set(&self, reader: &Reader, parse: impl FnOnce(&SetSalt) -> Option<SetId>) -> Result<Lookup, LineageError> {
        let addr = reader.addr().to_owned();
        let fresh = Index::start(reader)?;
        let mut entry = match self.take(&addr) {
            Some(e) if e.index.incarnation == fresh.incarnation => e,
            _ => Entry { index: fresh, sets: HashMap::new(), sets_bytes: 0, used: 0 },
        };
        if entry.index.advance(reader)? == Coverage::Broken {
            return Ok(Lookup::Uncovered);
        }
        let answer = lookup(&mut entry, reader, parse);
        self.keep(addr, entry);
        answer
    }

    fn take(&self, addr: &str) -> Option<Entry> {
        let mut inner = self.inner.lock();
        let (entry, bytes) = inner.entries.remove(addr)?;
        inner.order.remove(&entry.used);
        inner.total -= bytes;
        Some(entry)
    }

    /// Keeps `entry` for `addr` (replacing one a concurrent read kept meanwhile), evicting the
    /// least recently used entries past the budget.
    fn keep(&self, addr: String, mut entry: Entry) -> Admit {
        let bytes = entry.bytes();
        if bytes > self.budget {
            return Admit::TooLarge;
        }
        let mut inner = self.inner.lock();
        if let Some((old, old_bytes)) = inner.entries.remove(&addr) {
            inner.order.remove(&old.used);
            inner.total -= old_bytes;
        }
        let mut evicted = 0;
        while inner.total + bytes > self.budget {
            let Some((_, oldest)) = inner.order.pop_first() else { break };
            if let Some((_, b)) = inner.entries.remove(&oldest) {
                inner.total -= b;
                evicted += 1;
            }
        }
        inner.clock += 1;
        entry.used = inner.clock;
        inner.order.insert(entry.used, addr.clone());
        inner.total += bytes;
        inner.entries.insert(addr, (entry, bytes));
        Admit::Kept { evicted }
    }
}

fn lookup(
    entry: &mut Entry,
    reader: &Reader,
    parse: impl FnOnce(&SetSalt) -> Option<SetId>,
) -> Result<Lookup, LineageError> {
    let Some(config) = entry.index.numbering_config() else { return Ok(Lookup::Unknown) };
    let salt = SetSalt::new(reader.addr(), &entry.index.incarnation);
    let Some(id) = parse(&salt) else { return Ok(Lookup::Unknown) };
    if id.ordinal >= entry.index.prompt_len() {
        return Ok(Lookup::Unknown);
    }
    if let Some(set) = entry.sets.get(&(id.ordinal, id.part)) {
        return Ok(Lookup::Set(Arc::clone(set)));
    }
    let inputs = Inputs { salt: &salt, tools: &config.tools, call_keys: entry.index.call_keys() };
    let Some(set) = derive(&entry.index, reader, &id, &inputs)? else { return Ok(Lookup::Unknown) };
    let set = Arc::new(set);
    if id.part.is_none() || set.descriptor.call_key.is_some() {
        entry.sets_bytes += set_bytes(&set);
        entry.sets.insert((id.ordinal, id.part), Arc::clone(&set));
    }
    Ok(Lookup::Set(set))
}

/// The set `id` from the messages it needs: its own, and those holding the parts it names.
fn derive(index: &Index, reader: &Reader, id: &SetId, inputs: &Inputs<'_>) -> Result<Option<Set>, LineageError> {
    let at = id.ordinal;
    let mut fetched = read::messages_at(reader, &BTreeSet::from([at]))?;
    let Some(message) = fetched.remove(&at).filter(|m| m.role == Role::Assistant) else { return Ok(None) };
    let Some(named) = sets::named_numbers(&message, id.part, inputs) else { return Ok(None) };
    let places: Vec<(u64, u64, usize)> =
        named.into_iter().filter_map(|n| index.place(n, at).map(|(o, p)| (n, o, p))).collect();
    let wanted: BTreeSet<u64> = places.iter().flat_map(|&(_, o, _)| [o, o + 1]).filter(|&o| o < at).collect();
    let messages = read::messages_at(reader, &wanted)?;
    let mut targets = BTreeMap::new();
    for (n, o, p) in places {
        let Some(message) = messages.get(&o) else { continue };
        if let Some(target) = sets::target_at(message, messages.get(&(o + 1)), o, p, inputs) {
            targets.insert(n, target);
        }
    }
    Ok(sets::one_set(&message, at, id.part, &targets, inputs))
}

/// Roughly the bytes a kept set holds.
fn set_bytes(set: &Set) -> usize {
    let records = serde_json::to_vec(&set.records).map_or(0, |b| b.len());
    let snapshots: usize = set.snapshots.iter().map(|(k, v)| k.len() + v.len()).sum();
    std::mem::size_of::<Set>() + 256 + records + snapshots
}
