//! Heap buffers aligned for O_DIRECT.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment of every buffer, offset and length on the member I/O path. 4096 satisfies
/// O_DIRECT on drives with 512-byte and 4096-byte logical sectors alike.
pub const IO_ALIGNMENT_BYTES: usize = 4096;

/// An owned, zero-initialised byte buffer whose address is `IO_ALIGNMENT_BYTES`-aligned.
pub struct AlignedBuffer {
    pointer: NonNull<u8>,
    length_bytes: usize,
}

// SAFETY: AlignedBuffer uniquely owns its allocation (like Vec<u8>); shared references
// only give out `&[u8]`, so sending or sharing it between threads is sound.
unsafe impl Send for AlignedBuffer {}
// SAFETY: see above; `&AlignedBuffer` only permits reads.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// Allocate `length_bytes` (rounded up to the alignment; at least one block) of zeros.
    pub fn zeroed(length_bytes: usize) -> Self {
        let length_bytes = length_bytes.max(IO_ALIGNMENT_BYTES).next_multiple_of(IO_ALIGNMENT_BYTES);
        let layout =
            Layout::from_size_align(length_bytes, IO_ALIGNMENT_BYTES).expect("aligned buffer layout: size fits isize");
        // SAFETY: layout has non-zero size (at least IO_ALIGNMENT_BYTES).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let pointer = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuffer { pointer, length_bytes }
    }

    pub fn len(&self) -> usize {
        self.length_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.length_bytes == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: pointer is valid for length_bytes initialised bytes for self's lifetime.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.length_bytes) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.length_bytes) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        let layout =
            Layout::from_size_align(self.length_bytes, IO_ALIGNMENT_BYTES).expect("layout was valid at allocation");
        // SAFETY: allocated in `zeroed` with exactly this layout, freed once.
        unsafe { alloc::dealloc(self.pointer.as_ptr(), layout) }
    }
}

impl std::ops::Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for AlignedBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_rounded_up() {
        for length in [1, 4096, 5000, 1 << 20] {
            let buffer = AlignedBuffer::zeroed(length);
            assert_eq!(buffer.as_ptr() as usize % IO_ALIGNMENT_BYTES, 0);
            assert!(buffer.len() >= length);
            assert_eq!(buffer.len() % IO_ALIGNMENT_BYTES, 0);
            assert!(buffer.iter().all(|&byte| byte == 0));
        }
    }
}
