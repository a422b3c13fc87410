//! Zeroed, cache-line aligned storage for repacked weights, backed by 2 MiB
//! transparent huge pages where Linux offers them.
//!
//! Decode streams every weight byte once per token. With 4 KiB pages that is
//! a TLB miss every 64 cache lines, and the hardware prefetchers stop at
//! every page boundary. Linux's usual THP mode (`madvise`) gives huge pages
//! only to regions that ask before their first touch, so large buffers are
//! mapped on their own, 2 MiB aligned, and advised; everything else (small
//! buffers, other systems, a failed mapping) comes from the global allocator.
//! A loaded model's small matrices are then moved into one large buffer
//! together ([`super::share_pages`]).

use std::alloc::Layout;
use std::ptr::NonNull;

/// Alignment of every buffer: a tile starts on a cache line.
pub(crate) const LINE: usize = 64;
/// The huge page size, and the smallest buffer worth mapping on its own.
pub(crate) const HUGE: usize = 2 << 20;

pub(crate) struct WeightBuf {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

enum Backing {
    Heap,
    /// `size` bytes from `ptr` on are mapped for this buffer alone.
    #[cfg(target_os = "linux")]
    Mapped {
        size: usize,
    },
}

// SAFETY: the buffer is plain bytes owned by this value; shared access is
// read-only.
unsafe impl Send for WeightBuf {}
unsafe impl Sync for WeightBuf {}

impl WeightBuf {
    /// `len` zero bytes, in huge pages for every whole 2 MiB of them.
    pub(crate) fn zeroed(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if len >= HUGE {
            if let Some(buf) = Self::mapped(len) {
                return buf;
            }
        }
        Self::heap(len)
    }

    /// From the global allocator: the fallback, and the path for small
    /// buffers.
    pub(crate) fn heap(len: usize) -> Self {
        let layout = Self::heap_layout(len);
        // SAFETY: the layout's size is at least LINE, never zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        WeightBuf {
            ptr,
            len,
            backing: Backing::Heap,
        }
    }

    fn heap_layout(len: usize) -> Layout {
        Layout::from_size_align(len.max(LINE), LINE).expect("weight buffer size overflows")
    }

    /// An anonymous mapping of `len` bytes (in whole pages) that starts on a
    /// 2 MiB boundary, advised for THP before any page is touched: the last
    /// partial 2 MiB stays in small pages rather than fill a huge one with
    /// padding. None if the kernel refuses the mapping.
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Option<Self> {
        // SAFETY: sysconf only reads a system constant.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        let size = len.next_multiple_of(page);
        let over = size + HUGE;
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let head = (base as usize).next_multiple_of(HUGE) - base as usize;
        // SAFETY: head and tail lie inside the mapping just made, and the
        // aligned `size` bytes between them stay mapped. The advice is only a
        // hint: if the kernel ignores it the buffer still works in small pages.
        unsafe {
            let start = base.cast::<u8>().add(head);
            if head > 0 {
                libc::munmap(base, head);
            }
            if over - head > size {
                libc::munmap(start.add(size).cast(), over - head - size);
            }
            libc::madvise(start.cast(), size, libc::MADV_HUGEPAGE);
            Some(WeightBuf {
                ptr: NonNull::new_unchecked(start),
                len,
                backing: Backing::Mapped { size },
            })
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialized (zeroed or written) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for WeightBuf {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated in `heap` with this layout.
            Backing::Heap => unsafe {
                std::alloc::dealloc(self.ptr.as_ptr(), Self::heap_layout(self.len))
            },
            // SAFETY: the mapping made in `mapped`, unmapped once.
            #[cfg(target_os = "linux")]
            Backing::Mapped { size } => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), size);
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_writable() {
        for (what, len, mut buf) in [
            ("mapped", 5 << 20, WeightBuf::zeroed(5 << 20)),
            ("heap fallback", 5 << 20, WeightBuf::heap(5 << 20)),
            ("small", 100, WeightBuf::zeroed(100)),
        ] {
            assert_eq!(buf.as_slice().len(), len, "{what}");
            assert_eq!(buf.as_slice().as_ptr() as usize % LINE, 0, "{what}");
            assert!(buf.as_slice().iter().all(|&b| b == 0), "{what}");
            for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
                *b = i as u8;
            }
            assert!(
                buf.as_slice()
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| b == i as u8),
                "{what}"
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_start_on_a_huge_page() {
        let buf = WeightBuf::zeroed(3 << 20);
        assert!(matches!(buf.backing, Backing::Mapped { size } if size == 3 << 20));
        assert_eq!(buf.as_slice().as_ptr() as usize % HUGE, 0);
        assert!(matches!(WeightBuf::zeroed(HUGE - 1).backing, Backing::Heap));
    }
}
