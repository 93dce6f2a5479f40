//! Compressed units (fragments) and the packed blocks that hold them (docs/compression.md,
//! docs/on-disk-format.md "Packed block (version 2)"). A fragment is a unit of 1 … 4
//! consecutive logical blocks compressed with LZ4 (block format); packed blocks hold
//! fragment bytes from the front and their table from the end, and a fragment that does
//! not fit in the rest of a block continues at the start of the next ones. Pure functions:
//! the caller proves every packed block by its position's checksum before anything here
//! parses it, and every unit taken out is proven again by its own checksum.

use crate::layout::geometry::BLOCK_SIZE_BYTES;

pub const PACKED_MAGIC: &[u8; 4] = b"SLPK";
pub const PACKED_VERSION: u8 = 2;
/// Fragments that start in one packed block at most (a block's 16 sixteenths).
pub const FRAGMENTS_PER_BLOCK_MAXIMUM: usize = 16;
/// Logical blocks one fragment holds at most (its live mask is 4 bits of a byte).
pub const BLOCKS_PER_UNIT_MAXIMUM: usize = 4;
pub const UNIT_BYTES_MAXIMUM: usize = BLOCKS_PER_UNIT_MAXIMUM * BLOCK_SIZE_BYTES;
const HEADER_BYTES: usize = 8;
pub const TABLE_ENTRY_BYTES: usize = 20;
/// Bytes of a fragment a block it continues into holds at most (all but the header).
pub const CONTINUATION_BYTES_MAXIMUM: usize = BLOCK_SIZE_BYTES - HEADER_BYTES;
/// Bytes of a fragment an empty packed block takes (its table entry counted).
pub const EMPTY_BLOCK_ROOM_BYTES: usize = BLOCK_SIZE_BYTES - HEADER_BYTES - TABLE_ENTRY_BYTES;
/// Packed blocks one fragment occupies at most: its start block (where at least
/// [`SPILL_START_BYTES_MINIMUM`] of it lies) and the blocks it continues into.
pub const BLOCKS_PER_FRAGMENT_MAXIMUM: usize = 5;
/// A fragment starts in the block being filled only when at least this much of it fits
/// there; less would cost a read of one more block for a few bytes saved.
pub const SPILL_START_BYTES_MINIMUM: usize = 128;
/// The probe compresses this share of a unit first (a quarter), taken as
/// [`PROBE_PIECES_PER_BLOCK`] pieces per block spread over it (a block is often a header
/// and a body, which a prefix would misjudge); a unit whose probe does not save an eighth
/// is stored whole without compressing the rest.
pub const PROBE_PIECES_PER_BLOCK: usize = 4;
pub const PROBE_PIECE_BYTES: usize = 256;
/// Room for the largest output LZ4 may produce for a unit (`lz4_flex` refuses a smaller
/// buffer; `get_maximum_output_size(16384)` is 16 464).
pub const COMPRESS_BUFFER_BYTES: usize = UNIT_BYTES_MAXIMUM + UNIT_BYTES_MAXIMUM / 8;

/// The most bytes a fragment of a unit of `blocks` blocks may take: it and its table
/// entry must save at least an eighth of the unit, or the unit is stored whole (less
/// would cost a decompression for almost no space).
pub fn fragment_bytes_maximum(blocks: usize) -> usize {
    let unit = blocks * BLOCK_SIZE_BYTES;
    unit - unit / 8 - TABLE_ENTRY_BYTES
}

/// The key a shared copy stored as a fragment (shared-block record `record`'s) has in its
/// packed block's table, where a fragment of clients' blocks has its first logical block:
/// bit 63 and the record (no logical block reaches bit 63).
pub fn record_key(record: u64) -> u64 {
    assert!(record >> 62 == 0, "record {record} fits a fragment key");
    1 << 63 | record
}

/// How a unit was judged when offered for compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compressed {
    /// The fragment is the first `length` bytes of the output buffer.
    Fragment { length: usize },
    /// The probe (a sample spread over the unit) did not save enough: not compressed.
    RefusedByProbe,
    /// Compressed whole, it did not save enough.
    TooLarge,
}

/// Compress `unit` (1 … 4 whole blocks) into `output` (at least [`compress_buffer_bytes`]
/// of the unit's length; [`COMPRESS_BUFFER_BYTES`] serves any unit).
pub fn compress(unit: &[u8], output: &mut [u8]) -> Compressed {
    debug_assert!(unit.len().is_multiple_of(BLOCK_SIZE_BYTES) && unit.len() <= UNIT_BYTES_MAXIMUM && !unit.is_empty());
    debug_assert!(output.len() >= compress_buffer_bytes(unit.len()));
    let pieces = unit.len() / BLOCK_SIZE_BYTES * PROBE_PIECES_PER_BLOCK;
    let stride = unit.len() / pieces;
    let mut sample = [0u8; UNIT_BYTES_MAXIMUM / 4];
    let sample = &mut sample[..pieces * PROBE_PIECE_BYTES];
    for (piece, target) in sample.chunks_exact_mut(PROBE_PIECE_BYTES).enumerate() {
        target.copy_from_slice(&unit[piece * stride..piece * stride + PROBE_PIECE_BYTES]);
    }
    match lz4_flex::block::compress_into(sample, output) {
        Ok(length) if length <= sample.len() - sample.len() / 8 => {}
        _ => return Compressed::RefusedByProbe,
    }
    match lz4_flex::block::compress_into(unit, output) {
        Ok(length) if length <= fragment_bytes_maximum(unit.len() / BLOCK_SIZE_BYTES) => {
            Compressed::Fragment { length }
        }
        _ => Compressed::TooLarge,
    }
}

/// The output buffer [`compress`] needs for a unit of `unit_bytes`.
pub fn compress_buffer_bytes(unit_bytes: usize) -> usize {
    unit_bytes + unit_bytes / 8
}

/// Compress `unit` again without the probe (the cleaner, repacking the live blocks of a
/// unit whose other blocks died, which it zeroed): the fragment's length in `output`, or
/// `None` when it would not save an eighth.
pub fn recompress(unit: &[u8], output: &mut [u8]) -> Option<usize> {
    match lz4_flex::block::compress_into(unit, output) {
        Ok(length) if length <= fragment_bytes_maximum(unit.len() / BLOCK_SIZE_BYTES) => Some(length),
        _ => None,
    }
}

/// The checksum of a unit's decompressed bytes (CRC32C of the `n × 4096` bytes).
pub fn unit_checksum(unit: &[u8]) -> u32 {
    crc32c::crc32c(unit)
}

/// Each logical block's share of the space its fragment takes, in sixteenths of a block
/// (256 bytes): the fragment's bytes and table entry, rounded up, divided among the
/// `blocks` it serves when written, rounded up, within 1 … 16. What the index entry records and the segment's
/// live count adds (docs/compression.md): an estimate on the high side; what matters is
/// that a block's reference adds and removes the same amount.
pub fn sixteenths(length: usize, blocks: usize) -> u8 {
    let sixteenth = BLOCK_SIZE_BYTES / crate::layout::format::SIXTEENTHS_PER_BLOCK as usize;
    let total = (length + TABLE_ENTRY_BYTES).div_ceil(sixteenth);
    total.div_ceil(blocks.max(1)).clamp(1, crate::layout::format::SIXTEENTHS_PER_BLOCK as usize) as u8
}

/// One fragment's table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentEntry {
    /// The first logical block of its unit.
    pub first_logical_block: u64,
    /// Byte offset of the fragment's start inside the block whose table holds the entry.
    pub start: u16,
    pub length: u16,
    /// [`unit_checksum`] of the `blocks × 4096` bytes it decompresses to.
    pub checksum: u32,
    /// Logical blocks in its unit, 1 … 4.
    pub blocks: u8,
    /// Bit `j`: logical block `first_logical_block + j` is served by this fragment.
    pub mask: u8,
}

impl FragmentEntry {
    /// Whether this fragment serves `logical_block`.
    pub fn serves(&self, logical_block: u64) -> bool {
        logical_block
            .checked_sub(self.first_logical_block)
            .is_some_and(|place| place < self.blocks as u64 && self.mask & (1 << place) != 0)
    }
}

pub use crate::error::PackedProblem;

/// Start a packed block in `block` (4096 bytes) whose first `continuation` bytes after
/// the header will continue a fragment of an earlier block.
pub fn initialize(block: &mut [u8], continuation: usize) {
    debug_assert!(continuation <= CONTINUATION_BYTES_MAXIMUM);
    block.fill(0);
    block[0..4].copy_from_slice(PACKED_MAGIC);
    block[4] = PACKED_VERSION;
    block[6..8].copy_from_slice(&(continuation as u16).to_le_bytes());
}

/// The number of fragments that start in a packed block.
pub fn fragment_count(block: &[u8]) -> usize {
    block[5] as usize
}

/// The bytes after the header that continue a fragment of an earlier block.
pub fn continuation_length(block: &[u8]) -> usize {
    u16::from_le_bytes([block[6], block[7]]) as usize
}

fn table_start(count: usize) -> usize {
    BLOCK_SIZE_BYTES - count * TABLE_ENTRY_BYTES
}

fn table_entry(block: &[u8], index: usize) -> FragmentEntry {
    let at = table_start(index + 1);
    FragmentEntry {
        first_logical_block: u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes")),
        start: u16::from_le_bytes([block[at + 8], block[at + 9]]),
        length: u16::from_le_bytes([block[at + 10], block[at + 11]]),
        checksum: u32::from_le_bytes(block[at + 12..at + 16].try_into().expect("4 bytes")),
        blocks: block[at + 16],
        mask: block[at + 17],
    }
}

/// Where the next fragment would start in a block being filled: after the last one's
/// bytes, or after the continuation.
fn front(block: &[u8]) -> usize {
    match fragment_count(block) {
        0 => HEADER_BYTES + continuation_length(block),
        count => {
            let last = table_entry(block, count - 1);
            last.start as usize + last.length as usize
        }
    }
}

/// Bytes of a new fragment the block being filled can take (its table entry counted);
/// 0 when it takes no more fragments. A fragment longer than this spills into the next
/// blocks, and the block then takes no further fragment.
pub fn room(block: &[u8]) -> usize {
    let count = fragment_count(block);
    if count >= FRAGMENTS_PER_BLOCK_MAXIMUM {
        return 0;
    }
    table_start(count + 1).saturating_sub(front(block))
}

/// Start `fragment` (the unit of `blocks` logical blocks from `first_logical_block`, of
/// which the blocks in `mask` are served, with [`unit_checksum`] `checksum`) in the block
/// being filled: writes its table entry and as many of its bytes as fit. Returns the
/// bytes written; the rest go into the next blocks with [`continue_fragment`]. The caller
/// checked that the block has [`room`].
pub fn start_fragment(
    block: &mut [u8],
    first_logical_block: u64,
    blocks: u8,
    mask: u8,
    fragment: &[u8],
    checksum: u32,
) -> usize {
    debug_assert!(room(block) > 0 && !fragment.is_empty());
    let index = fragment_count(block);
    let start = front(block);
    let at = table_start(index + 1);
    let placed = fragment.len().min(at - start);
    block[start..start + placed].copy_from_slice(&fragment[..placed]);
    block[at..at + 8].copy_from_slice(&first_logical_block.to_le_bytes());
    block[at + 8..at + 10].copy_from_slice(&(start as u16).to_le_bytes());
    block[at + 10..at + 12].copy_from_slice(&(fragment.len() as u16).to_le_bytes());
    block[at + 12..at + 16].copy_from_slice(&checksum.to_le_bytes());
    block[at + 16] = blocks;
    block[at + 17] = mask;
    block[at + 18..at + 20].fill(0);
    block[5] = index as u8 + 1;
    placed
}

/// Start a packed block in `block` with the first bytes of `rest`, the remainder of a
/// fragment that spilled from the block before it. Returns the bytes it took.
pub fn continue_fragment(block: &mut [u8], rest: &[u8]) -> usize {
    let taken = rest.len().min(CONTINUATION_BYTES_MAXIMUM);
    initialize(block, taken);
    block[HEADER_BYTES..HEADER_BYTES + taken].copy_from_slice(&rest[..taken]);
    taken
}

/// The blocks after its start block that a fragment of `length` bytes starting with
/// `in_first` bytes in its start block continues into.
pub fn blocks_after(length: usize, in_first: usize) -> usize {
    length.saturating_sub(in_first).div_ceil(CONTINUATION_BYTES_MAXIMUM)
}

/// The header of a packed block, checked: (fragment count, continuation length).
fn header(block: &[u8]) -> Result<(usize, usize), PackedProblem> {
    if block.len() != BLOCK_SIZE_BYTES || &block[0..4] != PACKED_MAGIC || block[4] != PACKED_VERSION {
        return Err(PackedProblem::NotPacked);
    }
    let (count, continuation) = (fragment_count(block), continuation_length(block));
    if count > FRAGMENTS_PER_BLOCK_MAXIMUM || HEADER_BYTES + continuation > table_start(count) {
        return Err(PackedProblem::BadCount(count as u8));
    }
    Ok((count, continuation))
}

/// The table of a packed block, checked: magic, version, count, continuation, and every
/// fragment after the one before it and before the table (the last may run on into the
/// next blocks), of a valid unit size, mask and length.
pub fn table(block: &[u8]) -> Result<Vec<FragmentEntry>, PackedProblem> {
    let (count, continuation) = header(block)?;
    let end = table_start(count);
    let mut previous_end = HEADER_BYTES + continuation;
    let mut entries = Vec::with_capacity(count);
    for index in 0..count {
        let entry = table_entry(block, index);
        let (start, length) = (entry.start as usize, entry.length as usize);
        let unit_valid = (1..=BLOCKS_PER_UNIT_MAXIMUM as u8).contains(&entry.blocks)
            && entry.mask != 0
            && entry.mask >> entry.blocks == 0
            && length <= fragment_bytes_maximum(entry.blocks as usize);
        let last = index + 1 == count;
        if !unit_valid || length == 0 || start < previous_end || start >= end || (!last && start + length > end) {
            return Err(PackedProblem::BadExtent(index));
        }
        previous_end = start + length;
        entries.push(entry);
    }
    Ok(entries)
}

/// The checked table of a packed block and the index of the fragment serving
/// `logical_block`: the last one (an older version in the same block comes first).
pub fn find(block: &[u8], logical_block: u64) -> Result<(Vec<FragmentEntry>, usize), PackedProblem> {
    let entries = table(block)?;
    let index =
        entries.iter().rposition(|entry| entry.serves(logical_block)).ok_or(PackedProblem::Missing(logical_block))?;
    Ok((entries, index))
}

/// How many blocks after `block` fragment `index` (from [`table`]) continues into.
pub fn following_blocks(entries: &[FragmentEntry], index: usize) -> usize {
    let entry = entries[index];
    let in_first = table_start(entries.len()) - entry.start as usize;
    blocks_after(entry.length as usize, in_first)
}

/// The stored bytes of fragment `index` of `block` (entries from [`table`]), taken from
/// it and from `following`, the [`following_blocks`] blocks after it, each checked to
/// continue it.
pub fn gather<B: AsRef<[u8]>>(
    block: &[u8],
    entries: &[FragmentEntry],
    index: usize,
    following: &[B],
) -> Result<Vec<u8>, PackedProblem> {
    let entry = entries[index];
    let (start, length) = (entry.start as usize, entry.length as usize);
    let in_first = length.min(table_start(entries.len()) - start);
    if following.len() != blocks_after(length, in_first) {
        return Err(PackedProblem::BrokenContinuation(index));
    }
    let mut bytes = Vec::with_capacity(length);
    bytes.extend_from_slice(&block[start..start + in_first]);
    for next in following {
        let next = next.as_ref();
        let rest = length - bytes.len();
        let (count, continuation) = header(next).map_err(|_| PackedProblem::BrokenContinuation(index))?;
        let full = rest > CONTINUATION_BYTES_MAXIMUM;
        if continuation != rest.min(CONTINUATION_BYTES_MAXIMUM) || (full && count != 0) {
            return Err(PackedProblem::BrokenContinuation(index));
        }
        bytes.extend_from_slice(&next[HEADER_BYTES..HEADER_BYTES + continuation]);
    }
    Ok(bytes)
}

/// Decompress the stored `bytes` of the fragment `entry` (fragment `index` of its block's
/// table, which errors name) into `unit` (at least `blocks × 4096` bytes) and prove it by
/// the entry's checksum.
pub fn decompress(bytes: &[u8], entry: FragmentEntry, index: usize, unit: &mut [u8]) -> Result<(), PackedProblem> {
    let unit_bytes = entry.blocks as usize * BLOCK_SIZE_BYTES;
    let unit = &mut unit[..unit_bytes];
    match lz4_flex::block::decompress_into(bytes, unit) {
        Ok(length) if length == unit_bytes => {}
        _ => return Err(PackedProblem::Undecodable(index)),
    }
    if unit_checksum(unit) != entry.checksum {
        return Err(PackedProblem::WrongContent(index));
    }
    Ok(())
}

/// Take `logical_block` out of fragment `index` of `block` (and the `following` blocks it
/// continues into) into `out` (4096 bytes), proven by the unit's checksum. Every block
/// must already be proven by its position's checksum.
pub fn extract<B: AsRef<[u8]>>(
    block: &[u8],
    entries: &[FragmentEntry],
    index: usize,
    following: &[B],
    logical_block: u64,
    out: &mut [u8],
) -> Result<(), PackedProblem> {
    let bytes = gather(block, entries, index, following)?;
    let mut unit = [0u8; UNIT_BYTES_MAXIMUM];
    decompress(&bytes, entries[index], index, &mut unit)?;
    let place = (logical_block - entries[index].first_logical_block) as usize;
    out.copy_from_slice(&unit[place * BLOCK_SIZE_BYTES..(place + 1) * BLOCK_SIZE_BYTES]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A block's share rounds up, table entry included, divided among its unit's blocks,
    /// and stays within 1 … 16.
    #[test]
    fn sixteenths_round_up() {
        assert_eq!(sixteenths(1, 1), 1);
        assert_eq!(sixteenths(236, 1), 1);
        assert_eq!(sixteenths(237, 1), 2);
        assert_eq!(sixteenths(fragment_bytes_maximum(1), 1), 14);
        assert_eq!(sixteenths(BLOCK_SIZE_BYTES, 1), 16);
        assert_eq!(sixteenths(fragment_bytes_maximum(4), 4), 14);
        assert_eq!(sixteenths(1000, 4), 1);
        assert_eq!(sixteenths(5000, 4), 5);
    }

    #[test]
    fn bounds_hold() {
        for blocks in 1..=BLOCKS_PER_UNIT_MAXIMUM {
            let unit_bytes = blocks * BLOCK_SIZE_BYTES;
            assert!(compress_buffer_bytes(unit_bytes) >= lz4_flex::block::get_maximum_output_size(unit_bytes));
        }
        assert_eq!(COMPRESS_BUFFER_BYTES, compress_buffer_bytes(UNIT_BYTES_MAXIMUM));
        assert_eq!(
            BLOCKS_PER_FRAGMENT_MAXIMUM,
            1 + blocks_after(fragment_bytes_maximum(BLOCKS_PER_UNIT_MAXIMUM), SPILL_START_BYTES_MINIMUM)
        );
        assert_eq!(EMPTY_BLOCK_ROOM_BYTES, {
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            initialize(&mut block, 0);
            room(&block)
        });
    }

    /// `blocks` blocks whose first `varied` bytes each are pseudo-random and the rest a
    /// repeated byte.
    fn unit_with(seed: u64, blocks: usize, varied: usize) -> Vec<u8> {
        let mut state = seed | 1;
        (0..blocks * BLOCK_SIZE_BYTES)
            .map(|index| {
                if index % BLOCK_SIZE_BYTES < varied {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                } else {
                    0x5A
                }
            })
            .collect()
    }

    fn compressed(unit: &[u8]) -> Option<Vec<u8>> {
        let mut output = vec![0u8; COMPRESS_BUFFER_BYTES];
        match compress(unit, &mut output) {
            Compressed::Fragment { length } => Some(output[..length].to_vec()),
            _ => None,
        }
    }

    /// Packed blocks in a row, filled as a batch fills them.
    #[derive(Default)]
    struct Stream {
        blocks: Vec<Vec<u8>>,
    }

    impl Stream {
        /// Add a fragment; returns the index of the block it starts in.
        fn add(&mut self, first: u64, blocks: u8, mask: u8, fragment: &[u8], checksum: u32) -> usize {
            let room = self.blocks.last().map_or(0, |block| room(block));
            if !(room >= fragment.len() || room >= SPILL_START_BYTES_MINIMUM) {
                let mut block = vec![0u8; BLOCK_SIZE_BYTES];
                initialize(&mut block, 0);
                self.blocks.push(block);
            }
            let start = self.blocks.len() - 1;
            let mut placed = start_fragment(&mut self.blocks[start], first, blocks, mask, fragment, checksum);
            while placed < fragment.len() {
                let mut block = vec![0u8; BLOCK_SIZE_BYTES];
                placed += continue_fragment(&mut block, &fragment[placed..]);
                self.blocks.push(block);
            }
            start
        }

        fn read(&self, start: usize, logical_block: u64) -> Result<Vec<u8>, PackedProblem> {
            let (entries, index) = find(&self.blocks[start], logical_block)?;
            let count = following_blocks(&entries, index);
            let following = &self.blocks[start + 1..(start + 1 + count).min(self.blocks.len())];
            let mut out = vec![0u8; BLOCK_SIZE_BYTES];
            extract(&self.blocks[start], &entries, index, following, logical_block, &mut out)?;
            Ok(out)
        }
    }

    #[test]
    fn random_data_is_refused_by_the_probe_and_a_random_tail_by_the_whole_compression() {
        let mut output = vec![0u8; COMPRESS_BUFFER_BYTES];
        assert_eq!(compress(&unit_with(7, 1, BLOCK_SIZE_BYTES), &mut output), Compressed::RefusedByProbe);
        assert_eq!(compress(&unit_with(7, 4, BLOCK_SIZE_BYTES), &mut output), Compressed::RefusedByProbe);
        // Compressible where the probe looks, random elsewhere: the probe passes, the unit
        // does not save 1/8.
        let mut unit = unit_with(9, 2, BLOCK_SIZE_BYTES);
        let pieces = 2 * PROBE_PIECES_PER_BLOCK;
        let stride = unit.len() / pieces;
        for piece in 0..pieces {
            unit[piece * stride..piece * stride + PROBE_PIECE_BYTES / 2].fill(1);
        }
        assert_eq!(compress(&unit, &mut output), Compressed::TooLarge);
        assert!(
            matches!(compress(&unit_with(3, 1, 1024), &mut output), Compressed::Fragment { length } if length <= 1100)
        );
    }

    /// Units of 4 blocks that compress to ~1.5 blocks each continue into the next blocks,
    /// and every block of every unit comes back.
    #[test]
    fn fragments_continue_into_the_next_blocks_and_each_block_comes_back() {
        let mut stream = Stream::default();
        let mut written = Vec::new();
        for unit_number in 0..6u64 {
            let unit = unit_with(unit_number + 11, 4, 1500);
            let fragment = compressed(&unit).expect("compressible");
            assert!(fragment.len() > BLOCK_SIZE_BYTES, "the test needs fragments larger than a block");
            let start = stream.add(unit_number * 4, 4, 0b1111, &fragment, unit_checksum(&unit));
            written.push((start, unit_number * 4, unit));
        }
        let fragment_bytes: usize = written.len() * compressed(&written[0].2).unwrap().len();
        assert!(
            stream.blocks.len() * BLOCK_SIZE_BYTES < fragment_bytes + 6 * 64 + BLOCK_SIZE_BYTES,
            "packed to the byte"
        );
        for (start, first, unit) in &written {
            for place in 0..4 {
                let out = stream.read(*start, first + place).expect("comes back");
                assert_eq!(&out[..], &unit[place as usize * BLOCK_SIZE_BYTES..(place as usize + 1) * BLOCK_SIZE_BYTES]);
            }
        }
        assert_eq!(stream.read(written[0].0, 99), Err(PackedProblem::Missing(99)));
    }

    /// The later version of a block in the same packed block is the one read, and a
    /// fragment serves only the blocks of its mask.
    #[test]
    fn the_later_version_and_the_mask_decide_which_fragment_serves_a_block() {
        let (older, newer) = (unit_with(1, 2, 300), unit_with(2, 1, 300));
        let mut stream = Stream::default();
        let first = stream.add(4, 2, 0b11, &compressed(&older).unwrap(), unit_checksum(&older));
        let second = stream.add(5, 1, 0b1, &compressed(&newer).unwrap(), unit_checksum(&newer));
        assert_eq!(first, second);
        assert_eq!(stream.read(first, 5).unwrap(), newer);
        assert_eq!(stream.read(first, 4).unwrap(), older[..BLOCK_SIZE_BYTES]);
        // Moved by the cleaner with only its second block live: it no longer serves the first.
        let mut moved = Stream::default();
        let start = moved.add(4, 2, 0b10, &compressed(&older).unwrap(), unit_checksum(&older));
        assert_eq!(moved.read(start, 4), Err(PackedProblem::Missing(4)));
        assert_eq!(moved.read(start, 5).unwrap(), older[BLOCK_SIZE_BYTES..]);
    }

    #[test]
    fn sixteen_fragments_at_most() {
        let block = vec![0x33u8; BLOCK_SIZE_BYTES];
        let fragment = compressed(&block).unwrap();
        let mut packed = vec![0u8; BLOCK_SIZE_BYTES];
        initialize(&mut packed, 0);
        let mut appended = 0;
        for lba in 0..40 {
            if room(&packed) < fragment.len() {
                break;
            }
            start_fragment(&mut packed, lba, 1, 1, &fragment, unit_checksum(&block));
            appended += 1;
        }
        assert_eq!(appended, FRAGMENTS_PER_BLOCK_MAXIMUM);
        assert_eq!(table(&packed).unwrap().len(), FRAGMENTS_PER_BLOCK_MAXIMUM);
    }

    #[test]
    fn damage_is_named_not_returned() {
        let unit = unit_with(5, 4, 1500);
        let fragment = compressed(&unit).unwrap();
        let mut stream = Stream::default();
        let small = unit_with(6, 1, 500);
        stream.add(100, 1, 1, &compressed(&small).unwrap(), unit_checksum(&small));
        stream.add(0, 4, 0b1111, &fragment, unit_checksum(&unit));
        assert!(stream.blocks.len() >= 2);
        let entry_at = |index: usize| BLOCK_SIZE_BYTES - (index + 1) * TABLE_ENTRY_BYTES;
        let read = |blocks: Vec<Vec<u8>>, logical_block: u64| Stream { blocks }.read(0, logical_block);

        let mut wrong_checksum = stream.blocks.clone();
        wrong_checksum[0][entry_at(1) + 12] ^= 1;
        assert_eq!(read(wrong_checksum, 1), Err(PackedProblem::WrongContent(1)));

        let mut overlapping = stream.blocks.clone();
        overlapping[0][entry_at(1) + 8..entry_at(1) + 10].copy_from_slice(&10u16.to_le_bytes());
        assert_eq!(table(&overlapping[0]), Err(PackedProblem::BadExtent(1)));

        let mut first_runs_over = stream.blocks.clone();
        first_runs_over[0][entry_at(0) + 10..entry_at(0) + 12].copy_from_slice(&4000u16.to_le_bytes());
        assert_eq!(table(&first_runs_over[0]), Err(PackedProblem::BadExtent(0)));

        let mut bad_unit = stream.blocks.clone();
        bad_unit[0][entry_at(1) + 16] = 5;
        assert_eq!(table(&bad_unit[0]), Err(PackedProblem::BadExtent(1)));

        let mut broken = stream.blocks.clone();
        broken[1][6] ^= 1;
        assert_eq!(read(broken, 1), Err(PackedProblem::BrokenContinuation(1)));

        let mut missing = stream.blocks.clone();
        missing.truncate(1);
        assert_eq!(read(missing, 1), Err(PackedProblem::BrokenContinuation(1)));

        let mut no_magic = stream.blocks.clone();
        no_magic[0][0] = b'X';
        assert_eq!(table(&no_magic[0]), Err(PackedProblem::NotPacked));

        let mut too_many = stream.blocks.clone();
        too_many[0][5] = 17;
        assert_eq!(table(&too_many[0]), Err(PackedProblem::BadCount(17)));
    }

    proptest! {
        /// Whatever the bytes of proven packed blocks say, parsing and extracting never
        /// panic: a damaged table or fragment is an error.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 2 * BLOCK_SIZE_BYTES),
                                       count in 0u8..20, continuation in 0u16..5000, logical_block in 0u64..4) {
            let mut blocks: Vec<Vec<u8>> = bytes.chunks(BLOCK_SIZE_BYTES).map(<[u8]>::to_vec).collect();
            for block in &mut blocks {
                block[0..4].copy_from_slice(PACKED_MAGIC);
                block[4] = PACKED_VERSION;
            }
            blocks[0][5] = count;
            blocks[1][6..8].copy_from_slice(&continuation.to_le_bytes());
            let _ = Stream { blocks }.read(0, logical_block);
        }

        /// Units of any size and compressibility, packed in order, all come back as written.
        #[test]
        fn packed_blocks_round_trip(units in proptest::collection::vec((1usize..=4, 0usize..BLOCK_SIZE_BYTES), 1..30)) {
            let mut stream = Stream::default();
            let mut written = Vec::new();
            let mut first = 0u64;
            for (number, (blocks, varied)) in units.into_iter().enumerate() {
                let unit = unit_with(number as u64 + 1, blocks, varied);
                if let Some(fragment) = compressed(&unit) {
                    let mask = ((1u16 << blocks) - 1) as u8;
                    let start = stream.add(first, blocks as u8, mask, &fragment, unit_checksum(&unit));
                    written.push((start, first, unit));
                }
                first += blocks as u64;
            }
            for (start, first, unit) in written {
                for (place, block) in unit.chunks_exact(BLOCK_SIZE_BYTES).enumerate() {
                    let out = stream.read(start, first + place as u64);
                    prop_assert!(out.is_ok(), "{:?}", out);
                    prop_assert_eq!(&out.unwrap()[..], block);
                }
            }
        }
    }
}
