//! Raw memory the engine hands to llama.cpp or reads files into: reserved
//! anonymous ranges whose pages are committed on first touch and released
//! on demand, an arena of shared pages that can be mapped into them,
//! page-aligned bounce buffers, and read-only file maps.

use std::alloc::{self, Layout};
use std::fs::File;
use std::io;
use std::ptr::NonNull;
use std::sync::OnceLock;

/// The memory page size the kernel maps in (`sysconf(_SC_PAGESIZE)`), read
/// once: 4 KiB on x86-64, 16 KiB on the Raspberry Pi 5's stock kernel and
/// Apple-silicon Linux, 64 KiB on many ARM servers. Page moves, releases and
/// arena runs work in these pages, and O_DIRECT windows are aligned to them
/// (a page is a multiple of every disk's logical block size).
pub fn page() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf only reads a system constant.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(FALLBACK_PAGE)
    })
}

/// The page size assumed where `sysconf` answers nothing usable.
const FALLBACK_PAGE: usize = 4096;

/// The window of whole `page`-byte pages enclosing `len` bytes at file
/// `offset`, as `(lead, window length)`: the window starts `lead` bytes
/// before the offset. O_DIRECT reads windows like this.
pub fn page_window(page: usize, offset: u64, len: usize) -> (usize, usize) {
    let lead = (offset % page as u64) as usize;
    (lead, (lead + len).next_multiple_of(page))
}

/// The whole `page`-byte pages inside `offset..offset+len` (rounded inward)
/// as an aligned `(offset, len)`; `None` when the range holds no whole page.
pub fn whole_pages_in(page: usize, offset: usize, len: usize) -> Option<(usize, usize)> {
    let start = offset.next_multiple_of(page);
    let end = (offset + len) / page * page;
    (end > start).then(|| (start, end - start))
}

/// Tells the kernel that `len` bytes at `offset` of `file` will not be read
/// through the page cache soon, so clean cached pages can be dropped.
pub fn drop_file_cache(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain advisory syscall on a descriptor we own.
    let rc = unsafe {
        libc::posix_fadvise(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED)
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Mappings left free for everything else (allocator, libraries, threads)
/// when the engine asks [`mappings_fit`].
const MAPPINGS_KEPT_FREE: usize = 16384;

/// Whether the process can hold `more` memory mappings beyond those it has
/// now and still keep [`MAPPINGS_KEPT_FREE`] under the kernel's per-process
/// limit (`vm.max_map_count`). False where either count cannot be read.
pub fn mappings_fit(more: usize) -> bool {
    let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count").ok().and_then(|s| s.trim().parse::<usize>().ok());
    let held = std::fs::read_to_string("/proc/self/maps").ok().map(|m| m.lines().count());
    match (limit, held) {
        (Some(limit), Some(held)) => held + more + MAPPINGS_KEPT_FREE <= limit,
        _ => false,
    }
}

/// A reserved, initially uncommitted range of anonymous memory
/// (`MAP_NORESERVE`): pages cost RAM only once written, and
/// [`Region::release`] gives them back.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is a plain block of process memory with no thread
// affinity. Concurrent writers must touch disjoint byte ranges, which every
// caller guarantees (one writer per (expert, projection) slice per batch).
unsafe impl Send for Region {}
// SAFETY: see Send; shared access only copies into disjoint ranges.
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `len` bytes (rounded up to whole pages).
    pub fn reserve(len: usize) -> io::Result<Region> {
        let len = len.max(1).next_multiple_of(page());
        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choosing; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Region { base, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region (never: reserve rounds up to a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start address, for rebinding a tensor's `data` pointer.
    pub fn base_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(io::Error::other(format!("range {offset}+{len} outside region of {} bytes", self.len))),
        }
    }

    /// Copies `src` into the region at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> io::Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: the range is inside the mapping (checked above), the source
        // is a separate allocation, and concurrent writers use disjoint ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Lends `len` bytes at `offset` as a mutable slice to `fill`.
    pub fn fill_with<T>(&self, offset: usize, len: usize, fill: impl FnOnce(&mut [u8]) -> T) -> io::Result<T> {
        self.check(offset, len)?;
        // SAFETY: in bounds (checked); no other slice of this range exists
        // while `fill` runs because writers use disjoint ranges and readers
        // (llama.cpp) only run after every write of the batch has finished.
        let slice = unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) };
        Ok(fill(slice))
    }

    /// Reads `file` from `file_offset` into the `len` bytes at `offset`
    /// with positioned reads until at least `need` bytes came (the file may
    /// end inside the range). For O_DIRECT page windows: the range may
    /// overlap one a concurrent call is filling, as long as both write the
    /// same file bytes there (the page windows of neighbouring slices in a
    /// region that maps the file linearly, `moe::lanes`), so the range is
    /// handed to the kernel only, never made a Rust reference.
    pub fn read_file_at(
        &self,
        file: &File,
        file_offset: u64,
        offset: usize,
        len: usize,
        need: usize,
    ) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        self.check(offset, len)?;
        let need = need.min(len);
        let mut got = 0;
        while got < need {
            let at = libc::off_t::try_from(file_offset + got as u64).map_err(io::Error::other)?;
            // SAFETY: `offset + got .. offset + len` lies inside the mapping
            // (checked above) and the descriptor is open for reading.
            let n =
                unsafe { libc::pread(file.as_raw_fd(), self.base.as_ptr().add(offset + got).cast(), len - got, at) };
            match n {
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file ends inside the slice")),
                n => got += n as usize,
            }
        }
        Ok(())
    }

    /// Returns the whole pages inside `offset..offset+len` to the kernel
    /// (rounded inward, so pages shared with neighbouring data survive).
    /// Where the range maps arena pages ([`Region::map_arena`]) only their
    /// page-table entries go: the arena keeps the pages. Returns the number
    /// of bytes released.
    pub fn release(&self, offset: usize, len: usize) -> io::Result<usize> {
        self.check(offset, len)?;
        let Some((start, len)) = Region::whole_pages(offset, len) else { return Ok(0) };
        // SAFETY: [start, start+len) is page-aligned and inside our own
        // mapping; MADV_DONTNEED on private anonymous memory only zeroes
        // those pages, and on arena pages drops this mapping's view of them.
        let rc = unsafe { libc::madvise(self.base.as_ptr().add(start).cast(), len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(len)
    }

    /// Releases every page of the region.
    pub fn release_all(&self) -> io::Result<usize> {
        self.release(0, self.len)
    }

    /// The whole pages inside `offset..offset+len` (rounded inward, as
    /// [`Region::release`] rounds), as a page-aligned `(offset, len)`;
    /// `None` when the range holds no whole page.
    pub fn whole_pages(offset: usize, len: usize) -> Option<(usize, usize)> {
        whole_pages_in(page(), offset, len)
    }

    /// Moves the physical pages behind `len` bytes at `offset` to `to_offset`
    /// of `to` (`mremap` with `MREMAP_DONTUNMAP`): the destination then holds
    /// what the source held, committed, and the source reads as zeroes with
    /// no memory behind it. Offsets and `len` must be page-aligned. This
    /// recycles an evicted entry's pages for the next one without freeing,
    /// faulting and zeroing them again. Fails where the kernel cannot move
    /// the range in one piece (before Linux 5.7, or when the source spans
    /// several mappings after earlier moves); the caller then releases it.
    #[cfg(target_os = "linux")]
    pub fn move_pages(&self, offset: usize, to: &Region, to_offset: usize, len: usize) -> io::Result<()> {
        self.check(offset, len)?;
        to.check(to_offset, len)?;
        if !(offset | to_offset | len).is_multiple_of(page()) || len == 0 {
            return Err(io::Error::other(format!(
                "page move {offset}->{to_offset} of {len} bytes is not page-aligned"
            )));
        }
        let same = std::ptr::eq(self, to);
        if same && offset < to_offset + len && to_offset < offset + len {
            return Err(io::Error::other("page move between overlapping ranges"));
        }
        // SAFETY: both ranges are page-aligned, inside mappings this process
        // owns (checked above) and disjoint. No Rust reference into either
        // exists while the engine moves pages (the graph is paused in the
        // hook and no read targets them); the source keeps its mapping and
        // reads as zero-fill afterwards, as after `release`.
        let ptr = unsafe {
            libc::mremap(
                self.base.as_ptr().add(offset).cast(),
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP,
                to.base.as_ptr().add(to_offset).cast::<libc::c_void>(),
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Page moves need Linux's `mremap`; elsewhere the caller releases.
    #[cfg(not(target_os = "linux"))]
    pub fn move_pages(&self, _offset: usize, _to: &Region, _to_offset: usize, _len: usize) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    /// Maps `len` bytes of `arena` from `arena_offset` at `offset` of the
    /// region, in place of what was there: the region then shows the
    /// arena's pages (writes through either view land in the same memory).
    /// With `populate`, their page tables are filled now rather than by
    /// faults when llama.cpp first reads them (for pages the arena has
    /// already: populating new ones would allocate and zero them here).
    /// Offsets and `len` must be page-aligned.
    pub fn map_arena(
        &self,
        offset: usize,
        arena: &Arena,
        arena_offset: usize,
        len: usize,
        populate: bool,
    ) -> io::Result<()> {
        self.check(offset, len)?;
        arena.check(arena_offset, len)?;
        page_aligned(&[offset, arena_offset, len])?;
        // SAFETY: the target range is page-aligned and inside this region's
        // own mapping (checked), which MAP_FIXED replaces; no Rust reference
        // into it exists while the store maps pages (the graph is paused in
        // the hook and no read targets the range).
        let ptr = unsafe {
            libc::mmap(
                self.base.as_ptr().add(offset).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED | if populate { libc::MAP_POPULATE } else { 0 },
                std::os::fd::AsRawFd::as_raw_fd(&arena.fd),
                arena_offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Fills the page tables of `len` bytes at `offset` (page-aligned) for
    /// pages the mapping has already (`MADV_POPULATE_READ`), so llama.cpp
    /// does not fault on them; a no-op before Linux 5.14.
    pub fn populate(&self, offset: usize, len: usize) -> io::Result<()> {
        self.check(offset, len)?;
        page_aligned(&[offset, len])?;
        const MADV_POPULATE_READ: libc::c_int = 22;
        // SAFETY: a page-aligned range inside this region's mapping; the
        // advice only fills page tables and never changes contents.
        let rc = unsafe { libc::madvise(self.base.as_ptr().add(offset).cast(), len, MADV_POPULATE_READ) };
        if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Puts fresh anonymous memory back at `offset..offset+len` (page-
    /// aligned), undoing [`Region::map_arena`]: the range reads as zeroes
    /// with no memory behind it, and the arena's pages are no longer seen
    /// here.
    pub fn unmap_arena(&self, offset: usize, len: usize) -> io::Result<()> {
        self.check(offset, len)?;
        page_aligned(&[offset, len])?;
        // SAFETY: as in map_arena; the range is replaced by a fresh private
        // anonymous mapping like the one `reserve` made.
        let ptr = unsafe {
            libc::mmap(
                self.base.as_ptr().add(offset).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Whether page moves ([`Region::move_pages`]) work here as on Linux 5.7
/// and later: the pages arrive, and the source range stays mapped for the
/// kernel too, so a later `read(2)` into it succeeds. Checked once, on a
/// scratch region. qemu-user passes `MREMAP_DONTUNMAP` to the host but
/// marks the source unmapped for the guest, so a read into it fails with
/// EFAULT; there, and on kernels without the flag, pages are not moved.
pub fn page_moves_work() -> bool {
    #[cfg(target_os = "linux")]
    {
        static WORKS: OnceLock<bool> = OnceLock::new();
        *WORKS.get_or_init(|| probe_page_moves().is_ok())
    }
    #[cfg(not(target_os = "linux"))]
    false
}

#[cfg(target_os = "linux")]
fn probe_page_moves() -> io::Result<()> {
    use std::io::Read;
    let p = page();
    let region = Region::reserve(2 * p)?;
    region.write(0, &[1])?;
    region.move_pages(0, &region, p, p)?;
    let mut arrived = 0;
    region.fill_with(p, 1, |s| arrived = s[0])?;
    if arrived != 1 {
        return Err(io::Error::other("moved page lost its bytes"));
    }
    let mut zero = File::open("/dev/zero")?;
    region.fill_with(0, p, |source| zero.read_exact(source))?
}

fn page_aligned(values: &[usize]) -> io::Result<()> {
    match values.iter().all(|v| v.is_multiple_of(page())) {
        true => Ok(()),
        false => Err(io::Error::other(format!("page mapping of {values:?} is not page-aligned"))),
    }
}

/// Shared memory the expert cache's pages come from: a memfd of fixed size,
/// mapped once as a whole (the view io_uring registers, so reads into it
/// pin nothing) and in page runs under the entries' slices in their
/// regions ([`Region::map_arena`]). Its pages stay allocated for its life.
pub struct Arena {
    fd: std::os::fd::OwnedFd,
    view: NonNull<u8>,
    len: usize,
}

// SAFETY: the arena is plain shared memory with no thread affinity; writers
// use disjoint ranges, as for Region.
unsafe impl Send for Arena {}
// SAFETY: see Send.
unsafe impl Sync for Arena {}

impl Arena {
    /// Creates an arena of `len` bytes (rounded up to whole pages), its
    /// pages not yet committed.
    pub fn new(len: usize) -> io::Result<Arena> {
        let len = len.max(1).next_multiple_of(page());
        let fd = rustix::fs::memfd_create("bmoe-expert-cache", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // SAFETY: a shared mapping of the whole memfd at an address of the
        // kernel's choosing; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let view = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Arena { fd, view, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length arena (never: `new` rounds up to a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the whole view: what io_uring registers, and where a read
    /// into the arena's bytes at `offset` writes (`view_ptr() + offset`).
    pub fn view_ptr(&self) -> *mut u8 {
        self.view.as_ptr()
    }

    /// Allocates the arena's pages for `len` bytes at `offset` (zeroed),
    /// where it has none yet. Threads may allocate ranges in parallel.
    pub fn allocate(&self, offset: usize, len: usize) -> io::Result<()> {
        self.check(offset, len)?;
        rustix::fs::fallocate(&self.fd, rustix::fs::FallocateFlags::empty(), offset as u64, len as u64)?;
        Ok(())
    }

    /// Drops the view's page-table entries for `len` bytes at `offset`
    /// (page-aligned); the arena keeps the pages. Once io_uring has
    /// registered a range (pinning its pages) it addresses them without
    /// the view, and the resident set then counts each page once, where a
    /// region maps it, not twice.
    pub fn drop_view_pages(&self, offset: usize, len: usize) -> io::Result<()> {
        self.check(offset, len)?;
        page_aligned(&[offset, len])?;
        // SAFETY: a page-aligned range inside the view; MADV_DONTNEED on a
        // shared mapping only drops this mapping's page-table entries.
        let rc = unsafe { libc::madvise(self.view.as_ptr().add(offset).cast(), len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn check(&self, offset: usize, len: usize) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(io::Error::other(format!("range {offset}+{len} outside an arena of {} bytes", self.len))),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the view mmap returned; the regions'
        // own mappings of the memfd keep their pages until they go.
        unsafe { libc::munmap(self.view.as_ptr().cast(), self.len) };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mmap returned; no references
        // into it outlive the Region.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A heap buffer aligned to the [`page`] size, as O_DIRECT reads require.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: owned heap memory with no thread affinity.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `len` bytes (rounded up to whole pages).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).next_multiple_of(page());
        let layout = Layout::from_size_align(len, page()).expect("page-aligned layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Grows to at least `len` bytes, discarding the contents.
    pub fn ensure(&mut self, len: usize) {
        if len > self.len {
            *self = AlignedBuf::new(len);
        }
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The contents, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, page()).expect("page-aligned layout");
        // SAFETY: allocated with this exact layout in `new`.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// Returns the C allocator's free pages to the system (glibc keeps what a
/// burst of allocations freed in its arenas; elsewhere this does nothing).
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_write_release_rounds_inward() {
        let r = Region::reserve(3 * page()).unwrap();
        r.write(0, &vec![7u8; 3 * page()]).unwrap();
        // Release a range that covers page 1 fully and pages 0 and 2 partly.
        assert_eq!(r.release(100, 2 * page()).unwrap(), page());
        r.fill_with(0, 3 * page(), |s| {
            assert_eq!(s[page() - 1], 7, "partial page 0 kept");
            assert!(s[page()..2 * page()].iter().all(|&b| b == 0), "page 1 released");
            assert_eq!(s[2 * page()], 7, "partial page 2 kept");
        })
        .unwrap();
        assert!(r.write(3 * page() - 1, &[1, 2]).is_err());
    }

    #[test]
    fn moved_pages_carry_their_bytes_and_leave_zeroes() {
        let a = Region::reserve(4 * page()).unwrap();
        let b = Region::reserve(4 * page()).unwrap();
        a.write(0, &vec![5u8; 4 * page()]).unwrap();
        a.move_pages(page(), &b, 2 * page(), 2 * page()).unwrap();
        b.fill_with(0, 4 * page(), |s| {
            assert!(s[..2 * page()].iter().all(|&x| x == 0), "untouched destination pages stay empty");
            assert!(s[2 * page()..].iter().all(|&x| x == 5), "moved pages hold the source's bytes");
        })
        .unwrap();
        a.fill_with(0, 4 * page(), |s| {
            assert!(s[page()..3 * page()].iter().all(|&x| x == 0), "moved-out pages read as zeroes");
            assert!(s[..page()].iter().chain(&s[3 * page()..]).all(|&x| x == 5), "the rest stays");
        })
        .unwrap();
        // The source range stays mapped and usable.
        a.write(page(), &[9u8; 16]).unwrap();
        // Within one region, to a disjoint range.
        a.move_pages(0, &a, 2 * page(), page()).unwrap();
        a.fill_with(2 * page(), page(), |s| assert!(s.iter().all(|&x| x == 5))).unwrap();
        assert!(a.move_pages(0, &a, page() / 2, page()).is_err(), "unaligned");
        assert!(a.move_pages(0, &a, 0, page()).is_err(), "overlapping");
        assert!(a.move_pages(0, &b, 4 * page(), page()).is_err(), "outside the destination");
        assert_eq!(Region::whole_pages(100, 2 * page()), Some((page(), page())));
        assert_eq!(Region::whole_pages(100, page()), None);
    }

    #[test]
    fn aligned_buf_is_page_aligned() {
        let mut b = AlignedBuf::new(10);
        assert_eq!(b.as_slice().as_ptr() as usize % page(), 0);
        b.ensure(3 * page() + 1);
        assert_eq!(b.len(), 4 * page());
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn page_moves_work_on_this_kernel() {
        // Every x86-64 machine bmoe is tested on runs Linux 5.7 or later
        // natively; only emulation (qemu-user, for aarch64) lacks them.
        assert!(page_moves_work());
    }

    /// The page sizes of the ARM kernels bmoe meets (4 KiB, 16 KiB on the
    /// Pi 5, 64 KiB on servers), whatever this machine's own page is.
    const PAGE_SIZES: [usize; 3] = [4096, 16384, 65536];

    #[test]
    fn o_direct_windows_and_whole_pages_follow_the_page_size() {
        assert!(page().is_power_of_two() && page() >= 4096, "page() is {}", page());
        for p in PAGE_SIZES {
            assert_eq!(page_window(p, 3 * p as u64 + 100, p), (100, 2 * p), "a slice across a page edge at {p}");
            assert_eq!(page_window(p, 5 * p as u64, 2 * p), (0, 2 * p), "an aligned slice is its own window at {p}");
            assert_eq!(page_window(p, 4096, 10), if p == 4096 { (0, p) } else { (4096, p) });
            assert_eq!(whole_pages_in(p, 100, 3 * p), Some((p, 2 * p)));
            assert_eq!(whole_pages_in(p, 100, p), None, "no whole page inside at {p}");
            assert_eq!(whole_pages_in(p, p, p), Some((p, p)));
            // A range aligned to 4 KiB but not to `p` holds no whole page of `p`.
            assert_eq!(whole_pages_in(p, 4096, p), if p == 4096 { Some((4096, 4096)) } else { None });
        }
    }

    #[test]
    fn pages_move_and_release_in_runs_of_larger_pages() {
        for p in PAGE_SIZES.into_iter().filter(|p| p.is_multiple_of(page())) {
            let a = Region::reserve(4 * p).unwrap();
            let b = Region::reserve(4 * p).unwrap();
            a.write(0, &vec![5u8; 4 * p]).unwrap();
            a.move_pages(p, &b, 2 * p, 2 * p).unwrap();
            b.fill_with(0, 4 * p, |s| {
                assert!(s[..2 * p].iter().all(|&x| x == 0), "untouched destination at {p}");
                assert!(s[2 * p..].iter().all(|&x| x == 5), "moved run at {p}");
            })
            .unwrap();
            let (start, len) = whole_pages_in(p, 100, 2 * p).unwrap();
            assert_eq!(a.release(start, len).unwrap(), len);
            a.fill_with(0, 4 * p, |s| {
                assert!(s[..p].iter().all(|&x| x == 5), "the page before stays at {p}");
                assert!(s[p..3 * p].iter().all(|&x| x == 0), "moved then released at {p}");
                assert!(s[3 * p..].iter().all(|&x| x == 5), "the page after stays at {p}");
            })
            .unwrap();
        }
    }
}
