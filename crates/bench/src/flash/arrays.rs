//! The conventional arrays the seeds compare against, as Linux md builds them: RAID-0
//! (chunks in order, a request's pieces issued together and waited for — the "naive
//! in-order stripe writer" of seed 003), RAID-10 (near-2 mirrors: every write to both
//! drives of a pair) and RAID-5 (left-symmetric; a partial-stripe write reads the old data
//! and parity and writes both back — read-modify-write; a full-stripe write computes
//! parity from the new data). Parity is real XOR, so what is written can be read back.

use crate::target::SynchronousTarget;
use parking_lot::Mutex;
use std::sync::Arc;
use stripelog_blockdev::{AlignedBuffer, BlockDevice};
use stripelog_engine::parity::xor_into;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayLevel {
    Raid0,
    Raid10,
    Raid5,
}

/// Stripes are locked in this many shards while a read-modify-write runs.
const STRIPE_LOCK_SHARDS: usize = 1024;

pub struct ConventionalArray {
    level: ArrayLevel,
    members: Vec<Arc<dyn BlockDevice>>,
    chunk_size_bytes: u64,
    member_size_bytes: u64,
    /// Issue a request's member I/O from one thread per member and wait for all (needed
    /// when members make callers wait, as on a paced clock); otherwise one after another.
    parallel_members: bool,
    stripe_locks: Vec<Mutex<()>>,
}

/// One member's part of a request: member, offset on it, and range of the request's data.
type Piece = (usize, u64, std::ops::Range<usize>);

impl ConventionalArray {
    pub fn new(
        level: ArrayLevel,
        members: Vec<Arc<dyn BlockDevice>>,
        chunk_size_bytes: u64,
        parallel_members: bool,
    ) -> Result<ConventionalArray, String> {
        let minimum = match level {
            ArrayLevel::Raid0 => 1,
            ArrayLevel::Raid10 | ArrayLevel::Raid5 => 2,
        };
        if members.len() < minimum || (level == ArrayLevel::Raid10 && !members.len().is_multiple_of(2)) {
            return Err(format!("{level:?} cannot be built from {} members", members.len()));
        }
        if chunk_size_bytes == 0 || !chunk_size_bytes.is_multiple_of(4096) {
            return Err("the chunk size must be a non-zero multiple of 4 KiB".into());
        }
        let smallest = members.iter().map(|member| member.size_bytes()).min().unwrap_or(0);
        let member_size_bytes = smallest / chunk_size_bytes * chunk_size_bytes;
        Ok(ConventionalArray {
            level,
            members,
            chunk_size_bytes,
            member_size_bytes,
            parallel_members,
            stripe_locks: (0..STRIPE_LOCK_SHARDS).map(|_| Mutex::new(())).collect(),
        })
    }

    fn data_members(&self) -> usize {
        match self.level {
            ArrayLevel::Raid0 => self.members.len(),
            ArrayLevel::Raid10 => self.members.len() / 2,
            ArrayLevel::Raid5 => self.members.len() - 1,
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.member_size_bytes * self.data_members() as u64
    }

    fn stripe_bytes(&self) -> u64 {
        self.chunk_size_bytes * self.data_members() as u64
    }

    /// Where logical `offset` lives: (stripe, data chunk index within the stripe, offset
    /// within the chunk).
    fn locate(&self, offset: u64) -> (u64, usize, u64) {
        let stripe = offset / self.stripe_bytes();
        let within = offset % self.stripe_bytes();
        (stripe, (within / self.chunk_size_bytes) as usize, within % self.chunk_size_bytes)
    }

    /// RAID-5 left-symmetric: the parity member of `stripe`, and the member of data chunk `index`.
    fn raid5_members(&self, stripe: u64, index: usize) -> (usize, usize) {
        let count = self.members.len();
        let parity = count - 1 - (stripe % count as u64) as usize;
        (parity, (parity + 1 + index) % count)
    }

    /// Split a request into per-chunk pieces: (stripe, chunk index, offset in chunk, data range).
    fn chunks(&self, offset: u64, length: usize) -> Vec<(u64, usize, u64, std::ops::Range<usize>)> {
        let mut pieces = Vec::new();
        let mut done = 0usize;
        while done < length {
            let (stripe, index, within) = self.locate(offset + done as u64);
            let count = ((self.chunk_size_bytes - within) as usize).min(length - done);
            pieces.push((stripe, index, within, done..done + count));
            done += count;
        }
        pieces
    }

    fn member_offset(&self, stripe: u64, within: u64) -> u64 {
        stripe * self.chunk_size_bytes + within
    }

    fn check(&self, offset: u64, length: usize) -> Result<(), String> {
        if !offset.is_multiple_of(4096) || !length.is_multiple_of(4096) {
            return Err(format!("{offset}+{length} is not 4 KiB aligned"));
        }
        if offset + length as u64 > self.size_bytes() {
            return Err(format!("{offset}+{length} is beyond the array's {} bytes", self.size_bytes()));
        }
        Ok(())
    }

    /// Write every piece (member, member offset, data); all at once when members are issued in parallel.
    fn write_pieces(&self, pieces: &[(usize, u64, &[u8])]) -> Result<(), String> {
        let write = |&(member, offset, data): &(usize, u64, &[u8])| {
            let mut buffer = AlignedBuffer::zeroed(data.len());
            buffer.as_mut_slice().copy_from_slice(data);
            self.members[member]
                .write_at(buffer.as_slice(), offset)
                .map_err(|error| format!("member {member}: {error}"))
        };
        if self.parallel_members && pieces.len() > 1 {
            std::thread::scope(|scope| {
                let handles: Vec<_> = pieces.iter().map(|piece| scope.spawn(move || write(piece))).collect();
                handles
                    .into_iter()
                    .try_for_each(|handle| handle.join().unwrap_or(Err("a member writer panicked".into())))
            })
        } else {
            pieces.iter().try_for_each(write)
        }
    }

    fn read_member(&self, member: usize, offset: u64, length: usize) -> Result<AlignedBuffer, String> {
        let mut buffer = AlignedBuffer::zeroed(length);
        self.members[member]
            .read_at(buffer.as_mut_slice(), offset)
            .map_err(|error| format!("member {member}: {error}"))?;
        Ok(buffer)
    }

    fn pieces_for_read(&self, offset: u64, length: usize) -> Vec<Piece> {
        self.chunks(offset, length)
            .into_iter()
            .map(|(stripe, index, within, range)| {
                let member = match self.level {
                    ArrayLevel::Raid0 => index,
                    // Alternate mirrors by stripe.
                    ArrayLevel::Raid10 => 2 * index + (stripe % 2) as usize,
                    ArrayLevel::Raid5 => self.raid5_members(stripe, index).1,
                };
                (member, self.member_offset(stripe, within), range)
            })
            .collect()
    }

    fn write_raid5(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        let chunks = self.chunks(offset, data.len());
        let mut position = 0;
        while position < chunks.len() {
            let stripe = chunks[position].0;
            let end =
                chunks[position..].iter().position(|piece| piece.0 != stripe).map_or(chunks.len(), |n| position + n);
            let stripe_pieces = &chunks[position..end];
            let _lock = self.stripe_locks[stripe as usize % STRIPE_LOCK_SHARDS].lock();
            let covered: usize = stripe_pieces.iter().map(|piece| piece.3.len()).sum();
            if covered as u64 == self.stripe_bytes() {
                // Full stripe: parity from the new data alone.
                let mut parity = vec![0u8; self.chunk_size_bytes as usize];
                let mut writes: Vec<(usize, u64, &[u8])> = Vec::new();
                for (_, index, within, range) in stripe_pieces {
                    xor_into(&mut parity, &data[range.clone()]);
                    writes.push((
                        self.raid5_members(stripe, *index).1,
                        self.member_offset(stripe, *within),
                        &data[range.clone()],
                    ));
                }
                let parity_member = self.raid5_members(stripe, 0).0;
                writes.push((parity_member, self.member_offset(stripe, 0), &parity));
                self.write_pieces(&writes)?;
            } else {
                // Read-modify-write of each piece: old data and old parity in, new out.
                for (_, index, within, range) in stripe_pieces {
                    let (parity_member, data_member) = self.raid5_members(stripe, *index);
                    let member_offset = self.member_offset(stripe, *within);
                    let old_data = self.read_member(data_member, member_offset, range.len())?;
                    let mut parity = self.read_member(parity_member, member_offset, range.len())?;
                    xor_into(parity.as_mut_slice(), old_data.as_slice());
                    xor_into(parity.as_mut_slice(), &data[range.clone()]);
                    self.write_pieces(&[
                        (data_member, member_offset, &data[range.clone()]),
                        (parity_member, member_offset, parity.as_slice()),
                    ])?;
                }
            }
            position = end;
        }
        Ok(())
    }
}

impl SynchronousTarget for ConventionalArray {
    fn read(&self, offset_bytes: u64, buffer: &mut [u8]) -> Result<(), String> {
        self.check(offset_bytes, buffer.len())?;
        for (member, member_offset, range) in self.pieces_for_read(offset_bytes, buffer.len()) {
            let data = self.read_member(member, member_offset, range.len())?;
            buffer[range].copy_from_slice(data.as_slice());
        }
        Ok(())
    }

    fn write(&self, offset_bytes: u64, data: &[u8]) -> Result<(), String> {
        self.check(offset_bytes, data.len())?;
        match self.level {
            ArrayLevel::Raid5 => self.write_raid5(offset_bytes, data),
            ArrayLevel::Raid0 | ArrayLevel::Raid10 => {
                let mut writes = Vec::new();
                for (stripe, index, within, range) in self.chunks(offset_bytes, data.len()) {
                    let member_offset = self.member_offset(stripe, within);
                    if self.level == ArrayLevel::Raid0 {
                        writes.push((index, member_offset, &data[range]));
                    } else {
                        writes.push((2 * index, member_offset, &data[range.clone()]));
                        writes.push((2 * index + 1, member_offset, &data[range]));
                    }
                }
                self.write_pieces(&writes)
            }
        }
    }
}

/// A [`ConventionalArray`] as a benchmark target.
pub struct ArrayTarget {
    pub array: Arc<ConventionalArray>,
    pub label: String,
}

impl crate::target::Target for ArrayTarget {
    fn size_bytes(&self) -> u64 {
        self.array.size_bytes()
    }
    fn describe(&self) -> String {
        self.label.clone()
    }
    fn writable(&self) -> bool {
        true
    }
    fn queue(&self, depth: usize, buffer_bytes: usize) -> Result<Box<dyn crate::target::IoQueue>, String> {
        Ok(Box::new(crate::target::CallerQueue::new(self.array.clone(), depth, buffer_bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stripelog_blockdev::{MemoryDevice, Prng};

    fn array(level: ArrayLevel) -> ConventionalArray {
        let members: Vec<Arc<dyn BlockDevice>> =
            (0..4).map(|_| Arc::new(MemoryDevice::new(1 << 20)) as Arc<dyn BlockDevice>).collect();
        ConventionalArray::new(level, members, 64 << 10, false).unwrap()
    }

    #[test]
    fn what_is_written_reads_back_and_raid5_parity_rebuilds_any_member() {
        for level in [ArrayLevel::Raid0, ArrayLevel::Raid10, ArrayLevel::Raid5] {
            let array = array(level);
            let mut prng = Prng::new(4);
            let mut image = vec![0u8; array.size_bytes() as usize];
            for round in 0..200 {
                let blocks = if round % 10 == 0 { 48 } else { 1 + prng.below(3) as usize };
                let offset = prng.below(array.size_bytes() / 4096 - blocks as u64) * 4096;
                let mut data = vec![0u8; blocks * 4096];
                prng.fill(&mut data);
                array.write(offset, &data).unwrap();
                image[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
            }
            let mut back = vec![0u8; image.len()];
            array.read(0, &mut back).unwrap();
            assert!(back == image, "{level:?}");
            if level == ArrayLevel::Raid5 {
                // XOR across all members of every row is zero.
                for row in (0..array.member_size_bytes).step_by(4096) {
                    let mut parity = [0u8; 4096];
                    for member in 0..4 {
                        xor_into(&mut parity, array.read_member(member, row, 4096).unwrap().as_slice());
                    }
                    assert!(parity.iter().all(|&byte| byte == 0), "row {row}");
                }
            }
        }
    }
}
