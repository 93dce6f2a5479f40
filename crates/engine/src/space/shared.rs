//! The shared-block table (docs/deduplication.md, decisions 1, 3, 8 and 9): record `r`
//! says where the one copy of a block shared by several logical blocks lies (a
//! data-space position) and how many logical blocks refer to it (1 …
//! [`REFERENCES_MAXIMUM`]). The index maps each of those logical blocks to the record,
//! so the cleaner moves a shared copy by rewriting one record. A record whose last
//! reference goes is free, but its number is reused only once the batch that freed it is
//! durable and no reader can still hold it ([`SharedTable::release_through`]); until then
//! a reader that resolved the record still finds the copy it named.
//!
//! Records are 8 bytes as the shared table's pages hold them: the low 51 bits the copy's
//! position + 1 (0: free), bit 51 set when the copy is a fragment (a one-block unit
//! compressed into a packed block, keyed there by [`fragment_key`]) with its share in
//! sixteenths less one in bits 52–55, the top 8 bits the reference count.

/// References one copy takes at most (dm-vdo's bound): the next duplicate starts a new
/// record, so one bad block never costs more than this many logical blocks.
pub const REFERENCES_MAXIMUM: u8 = 254;
const POSITION_BITS: u32 = 51;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;
const FRAGMENT_BIT: u64 = 1 << 51;
const SHARE_SHIFT: u32 = 52;
const REFERENCES_SHIFT: u32 = 56;

pub use crate::layout::packed::record_key as fragment_key;

/// One record, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedRecord {
    /// Where the copy lies.
    pub position: u64,
    /// Logical blocks that refer to it.
    pub references: u8,
    /// `Some(share)`: the copy is a fragment keyed [`fragment_key`] in the packed block at
    /// `position`, taking `share` sixteenths of a block (1 … 16); `None`: a whole block.
    pub fragment: Option<u8>,
}

impl SharedRecord {
    /// The record as a shared table page holds it (0: free).
    pub fn pack(record: Option<SharedRecord>) -> u64 {
        match record {
            None => 0,
            Some(record) => {
                let fragment = record.fragment.map_or(0, |share| {
                    assert!((1..=16).contains(&share), "a fragment's share is 1 … 16 sixteenths, not {share}");
                    FRAGMENT_BIT | ((share as u64 - 1) << SHARE_SHIFT)
                });
                ((record.references as u64) << REFERENCES_SHIFT) | fragment | (record.position + 1)
            }
        }
    }

    /// The record a shared table page holds (`None`: free). The share bits of a whole
    /// copy are zero.
    pub fn unpack(value: u64) -> Option<SharedRecord> {
        let position = value & POSITION_MASK;
        let fragment = (value & FRAGMENT_BIT != 0).then(|| ((value >> SHARE_SHIFT) & 15) as u8 + 1);
        (position != 0).then(|| SharedRecord {
            position: position - 1,
            references: (value >> REFERENCES_SHIFT) as u8,
            fragment,
        })
    }

    /// Whether a shared table page's value is one `pack` writes: a free record is all
    /// zero, a whole copy's share bits are zero.
    pub fn well_formed(value: u64) -> bool {
        let position = value & POSITION_MASK;
        match position {
            0 => value == 0,
            _ => value & FRAGMENT_BIT != 0 || (value >> SHARE_SHIFT) & 15 == 0,
        }
    }

    /// The live units the copy counts in its segment: its share when a fragment, a whole
    /// block (`units_per_block`) otherwise.
    pub fn live_units(&self, units_per_block: u64) -> u64 {
        self.fragment.map_or(units_per_block, u64::from)
    }

    /// The copy's content as a mapping would name it (the fragment keyed by the record).
    pub fn content(&self) -> crate::index::map::Mapping {
        match self.fragment {
            Some(sixteenths) => crate::index::map::Mapping::Fragment { position: self.position, sixteenths },
            None => crate::index::map::Mapping::Data { position: self.position },
        }
    }
}

/// Why a reference could not be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareRefused {
    /// The record is free (the copy died meanwhile).
    Free,
    /// The record has [`REFERENCES_MAXIMUM`] references.
    Full,
}

/// Records in one shared table page (a 4 KiB block less its 64-byte header and CRC).
pub const RECORDS_PER_PAGE: u64 = crate::layout::checkpoint::SHARED_RECORDS_PER_PAGE as u64;

/// The records, in RAM (8 bytes per shared copy, as the segment table keeps its records),
/// written by checkpoints as pages of [`RECORDS_PER_PAGE`] whose records changed.
#[derive(Default)]
pub struct SharedTable {
    records: Vec<u64>,
    /// Free record numbers that may be reused now, lowest last.
    reusable: Vec<u64>,
    /// Records freed (with the serial number of their freeing), not reusable before the
    /// reuse fence has been passed after their freeing: a reader may still hold one.
    quarantined: Vec<(u64, u64)>,
    /// Frees so far (the serial numbers of `quarantined`).
    frees: u64,
    /// Pages whose records changed since the last checkpoint took them.
    dirty_pages: std::collections::BTreeSet<u64>,
    /// Records in use.
    in_use: u64,
    /// Of those, copies that are fragments, and the sixteenths they take.
    fragment_copies: u64,
    fragment_sixteenths: u64,
}

impl SharedTable {
    pub fn get(&self, record: u64) -> Option<SharedRecord> {
        self.records.get(record as usize).copied().and_then(SharedRecord::unpack)
    }

    /// A new record for a copy at `position` (`fragment`: its share when a fragment), with
    /// no reference yet (the caller adds the blocks that share it): a reusable number,
    /// else the next one.
    pub fn allocate(&mut self, position: u64, fragment: Option<u8>) -> u64 {
        let record = self.reusable.pop().unwrap_or(self.records.len() as u64);
        // (Only `release_through`, past the reuse fence, makes a freed number reusable.)
        assert!(self.get(record).is_none(), "record {record} is reused while in use");
        assert!(self.reusable.last().is_none_or(|&next| next > record), "records are reused lowest first");
        self.born(record, position, fragment);
        record
    }

    /// Record `record` is (re)born with its copy at `position` (`fragment`: its share when
    /// a fragment) and no reference: what a shared copy's summary entry (kind 10, or 15
    /// for a fragment) says, in the write path and in replay.
    pub fn born(&mut self, record: u64, position: u64, fragment: Option<u8>) {
        // (Beyond, the copy's position would spill into the share bits.)
        assert!(position < POSITION_MASK, "record {record}: position {position} fits a record");
        if record as usize >= self.records.len() {
            self.records.resize(record as usize + 1, 0);
        }
        if self.records[record as usize] == 0 {
            self.in_use += 1;
        }
        self.set(record, SharedRecord::pack(Some(SharedRecord { position, references: 0, fragment })));
        self.reusable.retain(|&free| free != record);
        self.quarantined.retain(|&(_, free)| free != record);
        assert!(self.in_use <= self.records.len() as u64, "records in use fit the table");
    }

    fn set(&mut self, record: u64, value: u64) {
        self.replace(record, value);
        self.dirty_pages.insert(record / RECORDS_PER_PAGE);
    }

    /// Put `value` in record `record`, keeping the fragment copies' counts.
    fn replace(&mut self, record: u64, value: u64) {
        let share = |value: u64| SharedRecord::unpack(value).and_then(|record| record.fragment);
        if let Some(old) = share(self.records[record as usize]) {
            self.fragment_copies -= 1;
            self.fragment_sixteenths -= old as u64;
        }
        if let Some(new) = share(value) {
            self.fragment_copies += 1;
            self.fragment_sixteenths += new as u64;
        }
        self.records[record as usize] = value;
    }

    /// The number [`SharedTable::allocate`] gives next (a compressed copy's fragment is
    /// keyed by it before its position is known).
    pub fn next_record(&self) -> u64 {
        self.reusable.last().copied().unwrap_or(self.records.len() as u64)
    }

    /// Copies in use that are fragments, and the sixteenths of a block they take.
    pub fn fragment_copies(&self) -> (u64, u64) {
        (self.fragment_copies, self.fragment_sixteenths)
    }

    /// What the copies in use take, in sixteenths of a block: whole copies 16 each,
    /// fragment copies their share.
    pub fn stored_sixteenths(&self) -> u64 {
        let sixteenths = crate::layout::format::SIXTEENTHS_PER_BLOCK as u64;
        (self.in_use - self.fragment_copies) * sixteenths + self.fragment_sixteenths
    }

    /// Blocks the copies in use hold: [`SharedTable::stored_sixteenths`] rounded up.
    pub fn held_blocks(&self) -> u64 {
        self.stored_sixteenths().div_ceil(crate::layout::format::SIXTEENTHS_PER_BLOCK as u64)
    }

    /// One more logical block refers to `record`.
    pub fn add_reference(&mut self, record: u64) -> Result<(), ShareRefused> {
        let mut current = self.get(record).ok_or(ShareRefused::Free)?;
        assert!(self.in_use > 0, "record {record}: a record holding a copy is counted in use");
        if current.references >= REFERENCES_MAXIMUM {
            return Err(ShareRefused::Full);
        }
        current.references += 1;
        self.set(record, SharedRecord::pack(Some(current)));
        Ok(())
    }

    /// A logical block that referred to `record` no longer does (overwritten, trimmed):
    /// the record as it was when that was the last reference (its copy is dead; the record
    /// is free but quarantined until [`SharedTable::release_through`] lets it go).
    pub fn remove_reference(&mut self, record: u64) -> Option<SharedRecord> {
        let mut current = self.get(record)?;
        current.references = current.references.saturating_sub(1);
        if current.references > 0 {
            self.set(record, SharedRecord::pack(Some(current)));
            return None;
        }
        self.set(record, 0);
        assert!(self.in_use > 0, "record {record}: a freed record was counted in use");
        self.in_use -= 1;
        self.frees += 1;
        self.quarantined.push((self.frees, record));
        Some(current)
    }

    /// The cleaner moved record `record`'s copy to `position` (`fragment`: its share when
    /// a fragment; a copy stays what it was born as).
    pub fn moved(&mut self, record: u64, position: u64, fragment: Option<u8>) {
        assert!(self.get(record).is_some(), "record {record}: only a copy in use is moved");
        assert!(position < POSITION_MASK, "record {record}: position {position} fits a record");
        if let Some(mut current) = self.get(record) {
            assert_eq!(
                current.fragment.is_some(),
                fragment.is_some(),
                "record {record}: a copy moves as what it was born as"
            );
            current.position = position;
            current.fragment = fragment;
            self.set(record, SharedRecord::pack(Some(current)));
        }
    }

    /// Records freed up to serial `serial` ([`SharedTable::quarantined_through`] before
    /// the caller passed the reuse fence) may be reused: no reader holds them.
    pub fn release_through(&mut self, serial: u64) {
        assert!(serial <= self.frees, "a release names free {serial} of {}", self.frees);
        // Quarantined in the order freed: the released ones come first.
        let released = self.quarantined.partition_point(|&(freed, _)| freed <= serial);
        for &(_, record) in &self.quarantined[..released] {
            assert_eq!(
                self.records[record as usize], 0,
                "record {record}: a released record holds no copy and no reference"
            );
        }
        self.reusable.extend(self.quarantined.drain(..released).map(|(_, record)| record));
        self.reusable.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// The serial of the latest free still quarantined (`None`: none is).
    pub fn quarantined_through(&self) -> Option<u64> {
        self.quarantined.last().map(|&(serial, _)| serial)
    }

    /// Records in use.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// RAM the records take (8 bytes per number up to the highest used).
    pub fn memory_bytes(&self) -> u64 {
        self.records.capacity() as u64 * 8
    }

    /// The packed records of page `page` ([`RECORDS_PER_PAGE`] of them, zero beyond the
    /// table).
    pub fn page(&self, page: u64) -> Vec<u64> {
        let first = (page * RECORDS_PER_PAGE) as usize;
        (first..first + RECORDS_PER_PAGE as usize)
            .map(|record| self.records.get(record).copied().unwrap_or(0))
            .collect()
    }

    /// The pages changed since the last call, in order (a checkpoint's snapshot takes them).
    pub fn take_dirty_pages(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.dirty_pages).into_iter().collect()
    }

    /// Pages a checkpoint took and could not commit: written again by the next one.
    pub fn mark_dirty(&mut self, pages: impl IntoIterator<Item = u64>) {
        self.dirty_pages.extend(pages);
    }

    /// Install page `page` as a checkpoint wrote it (mount): `false` when a record is
    /// not a valid one (a copy with no reference). Free numbers below the table's end are
    /// reusable.
    pub fn install_page(&mut self, page: u64, values: &[u64]) -> bool {
        assert!(
            values.len() as u64 <= RECORDS_PER_PAGE,
            "page {page}: a page holds {RECORDS_PER_PAGE} records at most"
        );
        let first = page * RECORDS_PER_PAGE;
        for (offset, &value) in values.iter().enumerate() {
            if value == 0 {
                continue;
            }
            match SharedRecord::unpack(value) {
                Some(record)
                    if record.references > 0
                        && record.references <= REFERENCES_MAXIMUM
                        && SharedRecord::well_formed(value) => {}
                _ => return false,
            }
            let record = first + offset as u64;
            if record as usize >= self.records.len() {
                self.records.resize(record as usize + 1, 0);
            }
            if self.records[record as usize] == 0 {
                self.in_use += 1;
            }
            self.replace(record, value);
        }
        assert!(self.in_use <= self.records.len() as u64, "records in use fit the table");
        true
    }

    /// After mount installed or rebuilt every record: the free numbers become reusable.
    /// Pages replay changed stay dirty: the mount's checkpoint writes them.
    pub fn finish_loading(&mut self) {
        self.reusable =
            (0..self.records.len() as u64).rev().filter(|&record| self.records[record as usize] == 0).collect();
        self.quarantined.clear();
        assert_eq!(
            self.reusable.len() as u64 + self.in_use,
            self.records.len() as u64,
            "every record number is in use or reusable"
        );
    }

    /// Every record in use, with its number.
    pub fn in_use_records(&self) -> impl Iterator<Item = (u64, SharedRecord)> + '_ {
        self.records
            .iter()
            .enumerate()
            .filter_map(|(record, &value)| Some((record as u64, SharedRecord::unpack(value)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A record's life: born, shared, bounded, freed by its last reference and reused
    /// only after the freeing batch is durable.
    #[test]
    fn a_record_is_shared_bounded_freed_and_reused_only_when_durable() {
        let mut table = SharedTable::default();
        let record = table.allocate(1000, None);
        assert_eq!(table.get(record), Some(SharedRecord { position: 1000, references: 0, fragment: None }));
        for _ in 0..REFERENCES_MAXIMUM {
            table.add_reference(record).expect("under the bound");
        }
        assert_eq!(table.add_reference(record), Err(ShareRefused::Full));
        table.moved(record, 2000, None);
        assert_eq!(table.get(record).unwrap().position, 2000, "the cleaner's move rewrites one record");
        for _ in 1..REFERENCES_MAXIMUM {
            assert_eq!(table.remove_reference(record), None);
        }
        let before = table.quarantined_through();
        assert_eq!(
            table.remove_reference(record).map(|freed| freed.position),
            Some(2000),
            "the last reference frees the copy"
        );
        assert_eq!(table.get(record), None);
        assert_eq!(table.add_reference(record), Err(ShareRefused::Free));
        assert_ne!(table.allocate(3000, None), record, "not reused before the reuse fence is passed");
        table.release_through(before.unwrap_or(0));
        assert_ne!(table.allocate(3001, None), record, "freed after the fence was entered");
        table.release_through(table.quarantined_through().expect("quarantined"));
        assert_eq!(table.allocate(3002, Some(5)), record, "reused once the fence is passed");
        assert_eq!(table.in_use(), 3);
    }

    proptest! {
        /// Records pack and unpack as they were, for any position below 2^51 − 1, any count
        /// and any share, and what `pack` writes is well formed.
        #[test]
        fn records_pack_and_unpack(position in 0u64..POSITION_MASK, references in 0u8..=255, share in 0u8..=16) {
            let record = SharedRecord { position, references, fragment: (share > 0).then_some(share) };
            let packed = SharedRecord::pack(Some(record));
            prop_assert_eq!(SharedRecord::unpack(packed), Some(record));
            prop_assert!(SharedRecord::well_formed(packed));
            prop_assert_eq!(SharedRecord::unpack(0), None);
        }

        /// Against a model of counts: any sequence of allocations, references added and
        /// removed keeps every record's count equal to the model's, never reuses a record
        /// that is in use, and frees a copy exactly when its last reference goes.
        #[test]
        fn counts_follow_a_model(steps in proptest::collection::vec((0u8..4, 0usize..8), 1..300)) {
            let mut table = SharedTable::default();
            let mut model: Vec<(u64, u64)> = Vec::new(); // (record, references) in use
            let mut sequence = 0u64;
            for (action, pick) in steps {
                sequence += 1;
                match action {
                    0 => {
                        let record = table.allocate(sequence, (pick > 3).then_some(pick as u8));
                        prop_assert!(model.iter().all(|&(used, _)| used != record), "reused a record in use");
                        table.add_reference(record).unwrap();
                        model.push((record, 1));
                    }
                    1 if !model.is_empty() => {
                        let index = pick % model.len();
                        match table.add_reference(model[index].0) {
                            Ok(()) => model[index].1 += 1,
                            Err(refused) => prop_assert_eq!((refused, model[index].1), (ShareRefused::Full, REFERENCES_MAXIMUM as u64)),
                        }
                    }
                    2 if !model.is_empty() => {
                        let index = pick % model.len();
                        let freed = table.remove_reference(model[index].0);
                        model[index].1 -= 1;
                        prop_assert_eq!(freed.is_some(), model[index].1 == 0);
                        if model[index].1 == 0 {
                            model.remove(index);
                        }
                    }
                    _ => {
                        let through = table.quarantined_through().unwrap_or(0);
                        table.release_through(through.saturating_sub(pick as u64));
                    }
                }
                for &(record, references) in &model {
                    prop_assert_eq!(table.get(record).map(|found| found.references as u64), Some(references));
                }
                prop_assert_eq!(table.in_use(), model.len() as u64);
            }
        }
    }
}
