//! Compressed blocks (fragments) and the packed blocks that hold several of them
//! (docs/compression.md). A fragment is a 4 KiB block compressed with LZ4 (block format);
//! a packed block is a slotted page: a table of fragments from the front, their bytes
//! from the back, readable at every moment while it is being filled. Pure functions: the
//! caller proves the packed block by its position's checksum before anything here parses
//! it, and every fragment taken out is proven again by the checksum of the block it
//! decompresses to.

use crate::layout::format::block_checksum;
use crate::layout::geometry::BLOCK_SIZE_BYTES;

pub const PACKED_MAGIC: &[u8; 4] = b"SLPK";
pub const PACKED_VERSION: u8 = 1;
/// Fragments one packed block holds at most (the index entry has 4 bits for the count).
pub const FRAGMENTS_PER_BLOCK_MAXIMUM: usize = 16;
const HEADER_BYTES: usize = 8;
const TABLE_ENTRY_BYTES: usize = 16;
/// A block is stored whole unless its fragment with its table entry saves at least this
/// share of the block (1/8): less would cost a decompression for almost no space.
pub const FRAGMENT_BYTES_MAXIMUM: usize = BLOCK_SIZE_BYTES - BLOCK_SIZE_BYTES / 8 - TABLE_ENTRY_BYTES;
/// The probe compresses this much of a block first, taken as [`PROBE_PIECES`] pieces spread
/// over the block (a block is often a header and a body, which a prefix would misjudge); a
/// block whose probe does not save the same share is stored whole without compressing it.
pub const PROBE_BYTES: usize = 1024;
pub const PROBE_PIECES: usize = 4;
/// Room for the largest output LZ4 may produce for a block (`lz4_flex` refuses a smaller
/// buffer; `get_maximum_output_size(4096)` is 4525).
pub const COMPRESS_BUFFER_BYTES: usize = BLOCK_SIZE_BYTES + BLOCK_SIZE_BYTES / 8;

/// How a block was judged when offered for compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compressed {
    /// The fragment is the first `length` bytes of the output buffer.
    Fragment { length: usize },
    /// The probe (a sample spread over the block) did not save enough: the block was not
    /// compressed.
    RefusedByProbe,
    /// Compressed whole, it did not save enough.
    TooLarge,
}

/// Compress the 4096-byte `block` into `output` (at least [`COMPRESS_BUFFER_BYTES`]).
pub fn compress(block: &[u8], output: &mut [u8]) -> Compressed {
    debug_assert_eq!(block.len(), BLOCK_SIZE_BYTES);
    debug_assert!(output.len() >= COMPRESS_BUFFER_BYTES);
    let probe_limit = PROBE_BYTES - PROBE_BYTES / 8;
    let (piece_bytes, stride) = (PROBE_BYTES / PROBE_PIECES, BLOCK_SIZE_BYTES / PROBE_PIECES);
    let mut sample = [0u8; PROBE_BYTES];
    for (piece, target) in sample.chunks_exact_mut(piece_bytes).enumerate() {
        target.copy_from_slice(&block[piece * stride..piece * stride + piece_bytes]);
    }
    match lz4_flex::block::compress_into(&sample, output) {
        Ok(length) if length <= probe_limit => {}
        _ => return Compressed::RefusedByProbe,
    }
    match lz4_flex::block::compress_into(block, output) {
        Ok(length) if length <= FRAGMENT_BYTES_MAXIMUM => Compressed::Fragment { length },
        _ => Compressed::TooLarge,
    }
}

/// A fragment's share of its packed block in sixteenths (256 bytes), its table entry
/// included, rounded up: what the index entry records and the segment's live count adds
/// (docs/compression.md). An estimate of the space it holds, on the high side (packing
/// leaves some of a block unused); what matters is that a fragment's reference adds and
/// removes the same amount.
pub fn sixteenths(length: usize) -> u8 {
    let unit = BLOCK_SIZE_BYTES / crate::layout::format::SIXTEENTHS_PER_BLOCK as usize;
    (length + TABLE_ENTRY_BYTES).div_ceil(unit).clamp(1, crate::layout::format::SIXTEENTHS_PER_BLOCK as usize) as u8
}

/// One fragment's table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentEntry {
    pub logical_block: u64,
    /// Byte offset of the fragment inside the packed block.
    pub start: u16,
    pub length: u16,
    /// Block checksum (`format::block_checksum`) of the 4096-byte block it decompresses to.
    pub checksum: u32,
}

pub use crate::error::PackedProblem;

/// Start an empty packed block in `block` (4096 bytes).
pub fn initialize(block: &mut [u8]) {
    block.fill(0);
    block[0..4].copy_from_slice(PACKED_MAGIC);
    block[4] = PACKED_VERSION;
}

/// The fragment count of a packed block being filled (or proven).
pub fn fragment_count(block: &[u8]) -> usize {
    block[5] as usize
}

fn table_entry(block: &[u8], index: usize) -> FragmentEntry {
    let at = HEADER_BYTES + index * TABLE_ENTRY_BYTES;
    FragmentEntry {
        logical_block: u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes")),
        start: u16::from_le_bytes(block[at + 8..at + 10].try_into().expect("2 bytes")),
        length: u16::from_le_bytes(block[at + 10..at + 12].try_into().expect("2 bytes")),
        checksum: u32::from_le_bytes(block[at + 12..at + 16].try_into().expect("4 bytes")),
    }
}

/// Where the next fragment's bytes would end: the lowest start so far (the block's end
/// when empty).
fn low_water(block: &[u8]) -> usize {
    (0..fragment_count(block)).map(|index| table_entry(block, index).start as usize).min().unwrap_or(BLOCK_SIZE_BYTES)
}

/// Where a fragment of `length` bytes would start in the packed block being filled, if it
/// fits.
fn start_of_next(block: &[u8], length: usize) -> Option<usize> {
    let count = fragment_count(block);
    let low_water = low_water(block);
    (count < FRAGMENTS_PER_BLOCK_MAXIMUM && HEADER_BYTES + (count + 1) * TABLE_ENTRY_BYTES + length <= low_water)
        .then(|| low_water - length)
}

/// Whether a fragment of `length` bytes fits in the packed block being filled.
pub fn fits(block: &[u8], length: usize) -> bool {
    start_of_next(block, length).is_some()
}

/// Add `fragment` (of the block `logical_block` whose block checksum is `checksum`) to the
/// packed block being filled: its index, or `None` when it does not fit.
pub fn append(block: &mut [u8], logical_block: u64, fragment: &[u8], checksum: u32) -> Option<usize> {
    if fragment.is_empty() {
        return None;
    }
    let start = start_of_next(block, fragment.len())?;
    let index = fragment_count(block);
    block[start..start + fragment.len()].copy_from_slice(fragment);
    let at = HEADER_BYTES + index * TABLE_ENTRY_BYTES;
    block[at..at + 8].copy_from_slice(&logical_block.to_le_bytes());
    block[at + 8..at + 10].copy_from_slice(&(start as u16).to_le_bytes());
    block[at + 10..at + 12].copy_from_slice(&(fragment.len() as u16).to_le_bytes());
    block[at + 12..at + 16].copy_from_slice(&checksum.to_le_bytes());
    block[5] = index as u8 + 1;
    Some(index)
}

/// The table of a packed block, checked: magic, version, count, and every fragment's
/// bytes inside the block, after the table and overlapping no other.
pub fn table(block: &[u8]) -> Result<Vec<FragmentEntry>, PackedProblem> {
    if block.len() != BLOCK_SIZE_BYTES || &block[0..4] != PACKED_MAGIC || block[4] != PACKED_VERSION {
        return Err(PackedProblem::NotPacked);
    }
    let count = fragment_count(block);
    if !(1..=FRAGMENTS_PER_BLOCK_MAXIMUM).contains(&count) {
        return Err(PackedProblem::BadCount(count as u8));
    }
    let table_end = HEADER_BYTES + count * TABLE_ENTRY_BYTES;
    let entries: Vec<FragmentEntry> = (0..count).map(|index| table_entry(block, index)).collect();
    let mut extents: Vec<(usize, usize, usize)> = entries
        .iter()
        .enumerate()
        .map(|(index, entry)| (entry.start as usize, entry.start as usize + entry.length as usize, index))
        .collect();
    extents.sort_unstable();
    let mut previous_end = table_end;
    for (start, end, index) in extents {
        if start < previous_end || end > BLOCK_SIZE_BYTES || start == end {
            return Err(PackedProblem::BadExtent(index));
        }
        previous_end = end;
    }
    Ok(entries)
}

/// Decompress the fragment of `logical_block` (the last one with that address: an older
/// version in the same block comes first) into `out` (4096 bytes) and prove it by its
/// recorded checksum. `block` must already be proven by its position's checksum.
pub fn extract(block: &[u8], logical_block: u64, out: &mut [u8]) -> Result<(), PackedProblem> {
    let (entries, index) = find(block, logical_block)?;
    extract_index(block, &entries, index, out)
}

/// The checked table of a packed block and the index of `logical_block`'s fragment in it:
/// the last one with that address (an older version in the same block comes first).
pub fn find(block: &[u8], logical_block: u64) -> Result<(Vec<FragmentEntry>, usize), PackedProblem> {
    let entries = table(block)?;
    let index = entries
        .iter()
        .rposition(|entry| entry.logical_block == logical_block)
        .ok_or(PackedProblem::Missing(logical_block))?;
    Ok((entries, index))
}

/// Decompress fragment `index` of a block whose `entries` came from [`table`].
pub fn extract_index(
    block: &[u8],
    entries: &[FragmentEntry],
    index: usize,
    out: &mut [u8],
) -> Result<(), PackedProblem> {
    let entry = entries[index];
    let bytes = &block[entry.start as usize..entry.start as usize + entry.length as usize];
    match lz4_flex::block::decompress_into(bytes, out) {
        Ok(length) if length == BLOCK_SIZE_BYTES => {}
        _ => return Err(PackedProblem::Undecodable(index)),
    }
    if block_checksum(out) != entry.checksum {
        return Err(PackedProblem::WrongContent(index));
    }
    Ok(())
}

/// The bytes of fragment `index` as stored (the cleaner moves them without decompressing).
pub fn fragment_bytes<'a>(block: &'a [u8], entries: &[FragmentEntry], index: usize) -> &'a [u8] {
    let entry = entries[index];
    &block[entry.start as usize..entry.start as usize + entry.length as usize]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A fragment's share rounds up, table entry included, and stays within 1 … 16.
    #[test]
    fn sixteenths_round_up() {
        assert_eq!(sixteenths(1), 1);
        assert_eq!(sixteenths(240), 1);
        assert_eq!(sixteenths(241), 2);
        assert_eq!(sixteenths(FRAGMENT_BYTES_MAXIMUM), 14);
        assert_eq!(sixteenths(BLOCK_SIZE_BYTES), 16);
    }

    /// A block whose first `varied` bytes are pseudo-random and the rest a repeated byte.
    fn block_with(seed: u64, varied: usize) -> Vec<u8> {
        let mut state = seed | 1;
        (0..BLOCK_SIZE_BYTES)
            .map(|index| {
                if index < varied {
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

    fn compressed(block: &[u8]) -> Option<Vec<u8>> {
        let mut output = vec![0u8; COMPRESS_BUFFER_BYTES];
        match compress(block, &mut output) {
            Compressed::Fragment { length } => Some(output[..length].to_vec()),
            _ => None,
        }
    }

    #[test]
    fn the_output_buffer_holds_what_lz4_may_produce() {
        assert!(COMPRESS_BUFFER_BYTES >= lz4_flex::block::get_maximum_output_size(BLOCK_SIZE_BYTES));
    }

    #[test]
    fn random_data_is_refused_by_the_probe_and_a_random_tail_by_the_whole_compression() {
        let mut output = vec![0u8; COMPRESS_BUFFER_BYTES];
        assert_eq!(compress(&block_with(7, BLOCK_SIZE_BYTES), &mut output), Compressed::RefusedByProbe);
        // Compressible where the probe looks, random elsewhere: the probe passes, the block
        // does not save 1/8.
        let mut block = block_with(9, BLOCK_SIZE_BYTES);
        let stride = BLOCK_SIZE_BYTES / PROBE_PIECES;
        for piece in 0..PROBE_PIECES {
            block[piece * stride..piece * stride + PROBE_BYTES / PROBE_PIECES / 2].fill(1);
        }
        assert_eq!(compress(&block, &mut output), Compressed::TooLarge);
        assert!(
            matches!(compress(&block_with(3, 1024), &mut output), Compressed::Fragment { length } if length <= 1100)
        );
    }

    #[test]
    fn four_quarter_random_blocks_share_one_packed_block_and_each_comes_back() {
        let blocks: Vec<Vec<u8>> = (0..5).map(|seed| block_with(seed + 11, 900)).collect();
        let mut packed = vec![0u8; BLOCK_SIZE_BYTES];
        initialize(&mut packed);
        let mut stored = 0;
        for (logical_block, block) in blocks.iter().enumerate() {
            let fragment = compressed(block).expect("compressible");
            if append(&mut packed, logical_block as u64 * 10, &fragment, block_checksum(block)).is_some() {
                stored += 1;
            }
        }
        assert_eq!(stored, 4, "four fragments of ~920 bytes fit, the fifth does not");
        let mut out = vec![0u8; BLOCK_SIZE_BYTES];
        for (logical_block, block) in blocks.iter().enumerate().take(4) {
            extract(&packed, logical_block as u64 * 10, &mut out).expect("extracts");
            assert_eq!(&out, block);
        }
        assert_eq!(extract(&packed, 40, &mut out), Err(PackedProblem::Missing(40)));
    }

    #[test]
    fn the_later_version_of_a_block_in_the_same_packed_block_is_the_one_read() {
        let (older, newer) = (block_with(1, 300), block_with(2, 300));
        let mut packed = vec![0u8; BLOCK_SIZE_BYTES];
        initialize(&mut packed);
        for block in [&older, &newer] {
            append(&mut packed, 5, &compressed(block).unwrap(), block_checksum(block)).unwrap();
        }
        let mut out = vec![0u8; BLOCK_SIZE_BYTES];
        extract(&packed, 5, &mut out).unwrap();
        assert_eq!(out, newer);
    }

    #[test]
    fn sixteen_fragments_at_most() {
        let block = vec![0x33u8; BLOCK_SIZE_BYTES];
        let fragment = compressed(&block).unwrap();
        let mut packed = vec![0u8; BLOCK_SIZE_BYTES];
        initialize(&mut packed);
        let appended =
            (0..40).filter(|&lba| append(&mut packed, lba, &fragment, block_checksum(&block)).is_some()).count();
        assert_eq!(appended, FRAGMENTS_PER_BLOCK_MAXIMUM);
        assert_eq!(table(&packed).unwrap().len(), FRAGMENTS_PER_BLOCK_MAXIMUM);
    }

    #[test]
    fn damage_is_named_not_returned() {
        let block = block_with(5, 500);
        let fragment = compressed(&block).unwrap();
        let mut packed = vec![0u8; BLOCK_SIZE_BYTES];
        initialize(&mut packed);
        append(&mut packed, 1, &fragment, block_checksum(&block)).unwrap();
        let mut out = vec![0u8; BLOCK_SIZE_BYTES];

        let mut wrong_checksum = packed.clone();
        wrong_checksum[HEADER_BYTES + 12] ^= 1;
        assert_eq!(extract(&wrong_checksum, 1, &mut out), Err(PackedProblem::WrongContent(0)));

        let mut overlapping_table = packed.clone();
        let at = HEADER_BYTES + 8;
        overlapping_table[at..at + 2].copy_from_slice(&10u16.to_le_bytes());
        assert_eq!(table(&overlapping_table), Err(PackedProblem::BadExtent(0)));

        let mut beyond = packed.clone();
        beyond[at + 2..at + 4].copy_from_slice(&4000u16.to_le_bytes());
        assert_eq!(table(&beyond), Err(PackedProblem::BadExtent(0)));

        let mut no_magic = packed.clone();
        no_magic[0] = b'X';
        assert_eq!(table(&no_magic), Err(PackedProblem::NotPacked));

        let mut too_many = packed.clone();
        too_many[5] = 17;
        assert_eq!(table(&too_many), Err(PackedProblem::BadCount(17)));
    }

    proptest! {
        /// Whatever the bytes of a proven packed block say, parsing and extracting never
        /// panic: a damaged table or fragment is an error.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), BLOCK_SIZE_BYTES),
                                       count in 0u8..20, logical_block in 0u64..4) {
            let mut block = bytes;
            block[0..4].copy_from_slice(PACKED_MAGIC);
            block[4] = PACKED_VERSION;
            block[5] = count;
            let mut out = vec![0u8; BLOCK_SIZE_BYTES];
            let _ = extract(&block, logical_block, &mut out);
        }

        /// Blocks of any compressibility, packed in order, all come back as written.
        #[test]
        fn packed_blocks_round_trip(varied in proptest::collection::vec(0usize..BLOCK_SIZE_BYTES, 1..40)) {
            let mut packs: Vec<Vec<u8>> = Vec::new();
            let mut written = Vec::new();
            for (logical_block, varied) in varied.into_iter().enumerate() {
                let block = block_with(logical_block as u64 + 1, varied);
                let Some(fragment) = compressed(&block) else { continue };
                let fits_last = packs.last().is_some_and(|pack| fits(pack, fragment.len()));
                if !fits_last {
                    let mut pack = vec![0u8; BLOCK_SIZE_BYTES];
                    initialize(&mut pack);
                    packs.push(pack);
                }
                let pack = packs.last_mut().unwrap();
                prop_assert!(append(pack, logical_block as u64, &fragment, block_checksum(&block)).is_some());
                written.push((packs.len() - 1, logical_block as u64, block));
            }
            let mut out = vec![0u8; BLOCK_SIZE_BYTES];
            for (pack, logical_block, block) in written {
                prop_assert!(extract(&packs[pack], logical_block, &mut out).is_ok());
                prop_assert_eq!(&out, &block);
            }
        }
    }
}
