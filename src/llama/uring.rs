//! io_uring reads into registered memory (used by `moe::lanes`). The
//! expert cache's arena ([`Arena`]) is registered in chunks, each the
//! first time a read lands in it, so an O_DIRECT read into it
//! (`READ_FIXED`) pins no pages: the kernel pinned them at registration.
//! (Registering it all at open would allocate and zero the whole budget
//! before the first token.) One ring, the [`Registrar`]'s, pins each chunk
//! once; the lanes' rings share its registration (Linux 6.12), or register
//! the chunk themselves on older kernels. A slice's page window is read as
//! up to three parts submitted together: the partial page before the
//! slice's whole pages and the one after (the region's own pages, shared
//! with the neighbouring slices, read as plain reads) and the whole pages
//! between them, which live in the arena.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use io_uring::{IoUring, opcode, types};

use super::memory::{Arena, Region, page};

/// The arena is registered in chunks of this size (or larger, for an
/// arena of more chunks than the kernel's table holds).
const CHUNK: usize = 2 << 20;

/// Most buffers the kernel registers with one ring.
const MAX_BUFFERS: usize = 16384;

/// Submission queue entries per ring: a slice takes three, or more when
/// its whole pages cross chunk boundaries; a lane submits several slices.
const RING_ENTRIES: u32 = 64;

/// Where a slice's whole pages live: `len` bytes at `region_offset` of its
/// region are the arena's bytes at `arena_offset`.
#[derive(Clone)]
pub struct FixedSpan {
    /// Page-aligned start in the region.
    pub region_offset: usize,
    /// Page-aligned length.
    pub len: usize,
    /// Page-aligned start in the arena.
    pub arena_offset: usize,
    /// The arena.
    pub arena: Arc<Arena>,
    /// Fill the span's page tables in the region once it is read (the run
    /// was mapped without, its pages being new then).
    pub populate: bool,
}

/// A page window to read: `len` bytes of the file at `file_offset` into
/// `region` at `region_offset`, of which at least the first `need` must
/// come (the file may end inside the window's last page).
pub struct Window<'a> {
    /// O_DIRECT descriptor of the file.
    pub fd: RawFd,
    /// Page-aligned file offset of the window.
    pub file_offset: u64,
    /// The destination region.
    pub region: &'a Region,
    /// Page-aligned start in the region.
    pub region_offset: usize,
    /// Page-aligned length.
    pub len: usize,
    /// Bytes that must be read.
    pub need: usize,
}

/// One read of a window's part.
#[derive(Clone, Copy)]
struct Part {
    fd: RawFd,
    file_offset: u64,
    dst: *mut u8,
    len: usize,
    need: usize,
    /// Registered buffer index, for a part in the arena.
    buf: Option<u16>,
}

/// An arena's chunk layout and a ring with an empty table for its chunks
/// (Linux 5.13 and later).
struct Table {
    ring: IoUring,
    arena: Arc<Arena>,
    chunk: usize,
    registered: Vec<bool>,
}

impl Table {
    fn new(arena: &Arc<Arena>) -> io::Result<Table> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let chunk = CHUNK.max(arena.len().div_ceil(MAX_BUFFERS).next_multiple_of(page()));
        let n = arena.len().div_ceil(chunk);
        ring.submitter().register_buffers_sparse(n as u32)?;
        Ok(Table { ring, arena: arena.clone(), chunk, registered: vec![false; n] })
    }

    /// The chunks a span touches.
    fn chunks(&self, span: &FixedSpan) -> std::ops::Range<usize> {
        match span.len {
            0 => 0..0,
            len => span.arena_offset / self.chunk..(span.arena_offset + len - 1) / self.chunk + 1,
        }
    }

    /// Pins chunk `c` into this ring's table (allocating any of its pages
    /// the arena lacks, zeroed, as a page fault would).
    fn pin(&mut self, c: usize) -> io::Result<()> {
        let at = c * self.chunk;
        let len = (self.arena.len() - at).min(self.chunk);
        // SAFETY: `at` is inside the arena's view.
        let iov = libc::iovec { iov_base: unsafe { self.arena.view_ptr().add(at) }.cast(), iov_len: len };
        // SAFETY: the iovec lies inside the arena's view, which this ring
        // keeps alive (the Arc) for as long as it is registered.
        unsafe { self.ring.submitter().register_buffers_update(c as u32, &[iov], None) }
            .map_err(|e| explain_registration(e, len))?;
        self.registered[c] = true;
        // Pinned: io_uring needs no mapping of the pages now, and without
        // the view's entries the resident set counts each page once, where
        // a region maps it.
        self.arena.drop_view_pages(at, len)
    }
}

/// The ring that pins the arena's chunks, once each, for every lane.
pub struct Registrar(Mutex<Table>);

impl Registrar {
    /// A registrar for `arena`, nothing pinned yet.
    pub fn new(arena: &Arc<Arena>) -> io::Result<Arc<Registrar>> {
        Ok(Arc::new(Registrar(Mutex::new(Table::new(arena)?))))
    }

    /// Pins chunk `c` if no ring has yet. Returns the registrar ring's
    /// descriptor, to share the chunk from.
    fn ensure(&self, c: usize) -> io::Result<RawFd> {
        let mut t = self.0.lock().map_err(|_| io::Error::other("io_uring registrar lock poisoned"))?;
        if !t.registered[c] {
            t.pin(c)?;
        }
        Ok(t.ring.as_raw_fd())
    }
}

/// A lane's ring, with the arena's chunks registered as reads need them.
pub struct Ring {
    table: Table,
    registrar: Arc<Registrar>,
    /// False once the kernel refused to share a chunk (before Linux 6.12):
    /// the ring then pins chunks itself.
    share: bool,
}

impl Ring {
    /// Sets up a lane's ring over the registrar's arena.
    pub fn new(registrar: &Arc<Registrar>) -> io::Result<Ring> {
        let arena = registrar.0.lock().map_err(|_| io::Error::other("io_uring registrar lock poisoned"))?.arena.clone();
        Ok(Ring { table: Table::new(&arena)?, registrar: registrar.clone(), share: true })
    }

    /// Makes the arena's chunks that `span` touches usable by this ring:
    /// shared from the registrar, which pins each chunk once, or pinned
    /// here where the kernel cannot share them.
    pub fn register_for(&mut self, span: &FixedSpan) -> io::Result<()> {
        for c in self.table.chunks(span) {
            if self.table.registered.get(c) != Some(&false) {
                continue;
            }
            // Allocating the chunk's pages (zeroing them) here, outside the
            // registrar, lets lanes do it in parallel; the registrar then
            // only pins pages that exist.
            let at = c * self.table.chunk;
            self.table.arena.allocate(at, (self.table.arena.len() - at).min(self.table.chunk))?;
            let from = self.registrar.ensure(c)?;
            if self.share {
                let flags = types::CloneBuffersFlags::DST_REPLACE;
                let shared =
                    self.table.ring.submitter().register_buffers_clone_offset(from, c as u32, c as u32, 1, flags);
                if shared.is_ok() {
                    self.table.registered[c] = true;
                    continue;
                }
                self.share = false;
            }
            self.table.pin(c)?;
        }
        Ok(())
    }

    /// Reads `w`, the page window of a slice whose whole pages are `span`
    /// (inside the window): [`Self::read_windows`] of one.
    pub fn read_window(&mut self, w: &Window, span: &FixedSpan) -> io::Result<()> {
        self.read_windows(&[(w, span)])
    }

    /// Reads each page window `w` of a slice whose whole pages are `span`
    /// (inside the window), with O_DIRECT: the whole pages straight into
    /// the arena from registered memory, the partial pages around them
    /// into the region. Every part of every window goes to the kernel in
    /// as few submissions as the queue allows, so the storage sees them
    /// together and this thread waits once.
    pub fn read_windows(&mut self, windows: &[(&Window, &FixedSpan)]) -> io::Result<()> {
        let mut parts = Vec::with_capacity(4 * windows.len());
        for &(w, span) in windows {
            self.split(w, span, &mut parts)?;
        }
        self.read_parts(parts)?;
        for &(w, span) in windows.iter().filter(|(_, span)| span.populate) {
            w.region.populate(span.region_offset, span.len)?;
        }
        Ok(())
    }

    /// Appends the reads of one window: the partial page before the span,
    /// the span's arena chunks, the partial page after it.
    fn split(&self, w: &Window, span: &FixedSpan, parts: &mut Vec<Part>) -> io::Result<()> {
        let (arena, chunk) = (&self.table.arena, self.table.chunk);
        let w_end = w.region_offset + w.len;
        let s_end = span.region_offset + span.len;
        if span.region_offset < w.region_offset || s_end > w_end || w_end > w.region.len() {
            return Err(io::Error::other("fixed span outside the read window"));
        }
        if !Arc::ptr_eq(&span.arena, arena) || span.arena_offset + span.len > arena.len() {
            return Err(io::Error::other("fixed span outside the registered arena"));
        }
        if !self.table.chunks(span).all(|c| self.table.registered[c]) {
            return Err(io::Error::other("fixed span in an arena chunk not registered"));
        }
        let mut push = |from: usize, len: usize, dst: *mut u8, buf: Option<u16>| {
            if len == 0 {
                return;
            }
            let rel = from - w.region_offset;
            let need = w.need.saturating_sub(rel).min(len);
            parts.push(Part { fd: w.fd, file_offset: w.file_offset + rel as u64, dst, len, need, buf });
        };
        let base = w.region.base_ptr();
        // SAFETY (pointer arithmetic here and below): every offset is inside
        // the region or the arena, checked above.
        push(w.region_offset, span.region_offset - w.region_offset, unsafe { base.add(w.region_offset) }, None);
        let mut done = 0;
        while done < span.len {
            let at = span.arena_offset + done;
            let len = (span.len - done).min(chunk - at % chunk);
            let dst = unsafe { arena.view_ptr().add(at) };
            push(span.region_offset + done, len, dst, Some((at / chunk) as u16));
            done += len;
        }
        push(s_end, w_end - s_end, unsafe { base.add(s_end) }, None);
        Ok(())
    }

    /// Submits the parts (a queue's worth at a time), waits for them, and
    /// goes on with the rest of any part the kernel cut short (at page
    /// boundaries only: O_DIRECT cannot resume inside a page). Nothing is
    /// in flight when this returns, error or not.
    fn read_parts(&mut self, mut parts: Vec<Part>) -> io::Result<()> {
        let mut failed = None;
        while !parts.is_empty() {
            let mut again = Vec::new();
            for group in parts.chunks(RING_ENTRIES as usize) {
                let submitted = self.submit(group)?;
                let mut seen = 0;
                while seen < submitted {
                    let Some(cqe) = self.table.ring.completion().next() else {
                        match self.table.ring.submit_and_wait(submitted - seen) {
                            // A signal (Ctrl-C) cut the wait short: wait again.
                            Err(e) if e.kind() != io::ErrorKind::Interrupted => return Err(e),
                            _ => continue,
                        }
                    };
                    seen += 1;
                    match advance(group[cqe.user_data() as usize], cqe.result()) {
                        Ok(Some(rest)) => again.push(rest),
                        Ok(None) => {}
                        Err(e) => {
                            failed.get_or_insert(e);
                        }
                    }
                }
                if failed.is_some() {
                    break;
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            parts = again;
        }
        Ok(())
    }

    /// Queues one read per part and submits them; returns how many.
    fn submit(&mut self, parts: &[Part]) -> io::Result<usize> {
        {
            let mut sq = self.table.ring.submission();
            if parts.len() > sq.capacity() - sq.len() {
                return Err(io::Error::other(format!(
                    "{} reads do not fit the io_uring submission queue",
                    parts.len()
                )));
            }
            for (i, p) in parts.iter().enumerate() {
                let len = u32::try_from(p.len).map_err(io::Error::other)?;
                let fd = types::Fd(p.fd);
                let entry = match p.buf {
                    Some(buf) => opcode::ReadFixed::new(fd, p.dst, len, buf).offset(p.file_offset).build(),
                    None => opcode::Read::new(fd, p.dst, len).offset(p.file_offset).build(),
                };
                // SAFETY: each destination is inside a live mapping (the
                // region or the arena, both kept alive by the caller and
                // this ring) that no one else writes until the reads end.
                unsafe { sq.push(&entry.user_data(i as u64)) }
                    .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            }
        }
        // A signal can interrupt the call; what it did not submit stays
        // queued, and the next call submits it.
        while let Err(e) = self.table.ring.submit() {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(parts.len())
    }
}

/// What a completed part leaves to read: nothing (`None`), or the rest of
/// a part the kernel cut short at a page boundary.
fn advance(p: Part, result: i32) -> io::Result<Option<Part>> {
    if result < 0 {
        let e = io::Error::from_raw_os_error(-result);
        return match e.kind() {
            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Ok(Some(p)),
            _ => Err(e),
        };
    }
    let n = result as usize;
    if n >= p.need {
        return Ok(None);
    }
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file ends inside the slice"));
    }
    if !n.is_multiple_of(page()) {
        return Err(io::Error::other(format!("O_DIRECT read cut short inside a page ({n} bytes)")));
    }
    // SAFETY: `n < len`, so the rest starts inside the part.
    let dst = unsafe { p.dst.add(n) };
    Ok(Some(Part { file_offset: p.file_offset + n as u64, dst, len: p.len - n, need: p.need - n, ..p }))
}

/// Says what a refused registration means: usually the locked-memory limit.
fn explain_registration(e: io::Error, bytes: usize) -> io::Error {
    if e.raw_os_error() == Some(libc::ENOMEM) {
        return io::Error::other(format!(
            "registering {} MiB with io_uring needs that much locked memory; {}",
            bytes >> 20,
            memlock_limit()
        ));
    }
    io::Error::new(e.kind(), format!("registering the cache's memory with io_uring: {e}"))
}

/// The locked-memory limit, in words.
fn memlock_limit() -> String {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock).current;
    let limit = limit.map_or("unlimited".to_string(), |l| format!("{} KiB", l / 1024));
    format!("RLIMIT_MEMLOCK is {limit} (raise it with `ulimit -l`)")
}

/// Checks that registering `bytes` can succeed: the process may lock
/// memory without limit (`CAP_IPC_LOCK`), or its locked-memory limit,
/// raised to the hard limit where it is lower, covers them (io_uring
/// counts registered pages as locked).
pub fn check_lockable(bytes: usize) -> io::Result<()> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    if has_ipc_lock() {
        return Ok(());
    }
    let mut limit = getrlimit(Resource::Memlock);
    if limit.current.is_some_and(|c| c < bytes as u64) && limit.maximum != limit.current {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Memlock, limit);
    }
    match getrlimit(Resource::Memlock).current {
        Some(c) if c < bytes as u64 => {
            Err(io::Error::other(format!("io_uring would lock the cache's {} MiB; {}", bytes >> 20, memlock_limit())))
        }
        _ => Ok(()),
    }
}

/// Whether the process holds `CAP_IPC_LOCK` (bit 14 of `CapEff`).
fn has_ipc_lock() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim);
    eff.and_then(|hex| u64::from_str_radix(hex, 16).ok()).is_some_and(|caps| caps & (1 << 14) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    /// True (said on stderr) where the kernel refuses io_uring outright
    /// (ENOSYS under qemu-user, EPERM under a seccomp filter): the tests
    /// below then have nothing to check. Any other failure is the tests'.
    fn io_uring_refused() -> bool {
        match IoUring::new(2) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                eprintln!("io_uring is refused here ({e}): not checked");
                true
            }
            _ => false,
        }
    }

    /// A file of `len` patterned bytes, its bytes, and an O_DIRECT descriptor.
    fn patterned(dir: &std::path::Path, len: usize) -> (Vec<u8>, std::fs::File) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let path = dir.join("f.bin");
        std::fs::File::create(&path).unwrap().write_all(&bytes).unwrap();
        let direct = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
        (bytes, direct)
    }

    /// Reads the window of `slice` (file offset, length) into a region laid
    /// out like the file, with the slice's whole pages in the arena at
    /// `arena_offset`, and checks every byte of the slice.
    fn read_and_check(bytes: &[u8], direct: &std::fs::File, slice: (usize, usize), arena_offset: usize) {
        let (offset, len) = slice;
        let region = Region::reserve(bytes.len() + 2 * page()).unwrap();
        let arena = Arc::new(Arena::new(8 << 20).unwrap());
        let (whole_at, whole_len) = Region::whole_pages(offset, len).unwrap();
        region.map_arena(whole_at, &arena, arena_offset, whole_len, false).unwrap();
        let registrar = Registrar::new(&arena).unwrap();
        let mut ring = Ring::new(&registrar).unwrap();
        let span =
            FixedSpan { region_offset: whole_at, len: whole_len, arena_offset, arena: arena.clone(), populate: true };
        ring.register_for(&span).unwrap();
        let (lead, window) = crate::llama::memory::page_window(page(), offset as u64, len);
        let start = offset - lead;
        let w = Window {
            fd: std::os::fd::AsRawFd::as_raw_fd(direct),
            file_offset: start as u64,
            region: &region,
            region_offset: start,
            len: window,
            need: lead + len,
        };
        ring.read_window(&w, &span).unwrap();
        let mut got = vec![0u8; len];
        region.fill_with(offset, len, |r| got.copy_from_slice(r)).unwrap();
        assert!(got == bytes[offset..offset + len], "slice {slice:?} at arena offset {arena_offset}");
    }

    #[test]
    fn windows_land_whole_pages_in_the_arena_and_edges_in_the_region() {
        if io_uring_refused() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (bytes, direct) = patterned(dir.path(), 5 * page() + 100);
        // Partial pages at both ends, the file ending inside the last one.
        read_and_check(&bytes, &direct, (page() / 2, 4 * page() + 100 - page() / 2 + page()), 3 * page());
        // Page-aligned at both ends: no edge reads.
        read_and_check(&bytes, &direct, (page(), 3 * page()), 0);
    }

    #[test]
    fn a_span_across_registered_chunks_is_read_in_pieces() {
        if io_uring_refused() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (bytes, direct) = patterned(dir.path(), 64 * page());
        // Whole pages from 2 MiB - 8 KiB: two pages in the first chunk, the rest in the second.
        read_and_check(&bytes, &direct, (100, 20 * page()), CHUNK - 2 * page());
    }

    #[test]
    fn a_span_outside_the_registered_chunks_is_refused() {
        if io_uring_refused() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (_, direct) = patterned(dir.path(), 4 * page());
        let region = Region::reserve(8 * page()).unwrap();
        let arena = Arc::new(Arena::new(8 << 20).unwrap());
        let mut ring = Ring::new(&Registrar::new(&arena).unwrap()).unwrap();
        let span =
            FixedSpan { region_offset: 0, len: 4 * page(), arena_offset: 0, arena: arena.clone(), populate: false };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&direct);
        let w = Window { fd, file_offset: 0, region: &region, region_offset: 0, len: 4 * page(), need: 4 * page() };
        let e = ring.read_window(&w, &span).unwrap_err().to_string();
        assert!(e.contains("not registered"), "{e}");
        let other = Arc::new(Arena::new(page()).unwrap());
        ring.register_for(&span).unwrap();
        let e = ring.read_window(&w, &FixedSpan { arena: other, ..span }).unwrap_err().to_string();
        assert!(e.contains("outside the registered arena"), "{e}");
    }
}
