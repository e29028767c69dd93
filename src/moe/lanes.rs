//! Read lanes: N threads (the eval thread is lane 0), each with its own
//! file descriptors and page-aligned bounce buffer, reading expert slices
//! with positioned reads. O_DIRECT is used when the storage serves it
//! correctly, verified at open against a buffered read of the same bytes.
//!
//! O_DIRECT reads whole pages. A slice whose file offset and destination
//! are congruent modulo the page size, in a region that maps the file
//! linearly around it ([`ReadJob::linear`]), is read as its enclosing
//! page window straight into place: the window's extra bytes are the
//! file's neighbouring bytes landing where they belong (the neighbours'
//! own slots, or slack), so nothing is copied. Two such windows may share
//! an edge page and write the same bytes into it. Any other slice goes
//! through the lane's bounce buffer and is copied out.
//!
//! With the expert cache's arena registered ([`ReadLanes::use_arena`]), a
//! page window whose whole pages live in the arena ([`ReadJob::fixed`]) is
//! read through the lane's io_uring instead ([`crate::llama::uring`]): no
//! page of it is pinned per read. A worker lane with a ring takes up to
//! [`RING_BATCH`] reads at once and submits them together.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::partial::PartialCopy;
use crate::llama::Repacker;
use crate::llama::memory::{self, AlignedBuf, Arena, Region, page};
use crate::llama::uring::{FixedSpan, Registrar, Ring, Window};

/// Most reads a worker lane with an io_uring takes and submits together.
const RING_BATCH: usize = 8;

/// Name prefix of the worker lanes' threads.
pub const LANE_THREAD_PREFIX: &str = "bmoe-read-";

/// One slice to read: `len` bytes at `offset` in shard `shard`, into
/// `region` at `region_offset`.
#[derive(Clone)]
pub struct ReadJob {
    /// Shard index.
    pub shard: usize,
    /// Absolute file offset.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Destination.
    pub region: Arc<Region>,
    /// Destination offset.
    pub region_offset: usize,
    /// The region holds the file's bytes at linear places around this
    /// slice (up to the enclosing pages): a read may write the neighbouring
    /// file bytes there too.
    pub linear: bool,
    /// Write the slice repacked for the CPU's kernels, not as the file has it.
    pub repack: Option<Arc<Repacker>>,
    /// The slice's whole pages are the registered arena's, here: an
    /// O_DIRECT read in place goes through io_uring into them.
    pub fixed: Option<FixedSpan>,
    /// Once repacked, also write the slice into this partial copy.
    pub copy_into: Option<CopyInto>,
}

/// Where a slice repacked as it is read goes besides the cache: expert
/// `expert` of bank `bank` of a partial repacked copy.
#[derive(Clone)]
pub struct CopyInto {
    /// The copy.
    pub copy: Arc<PartialCopy>,
    /// The bank's index in the copy.
    pub bank: usize,
    /// The expert.
    pub expert: usize,
}

/// What a batch of reads moved.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadStats {
    /// Bytes requested.
    pub bytes: u64,
    /// Bytes actually transferred from storage (O_DIRECT windows round outward).
    pub window_bytes: u64,
    /// Slices read.
    pub slices: u64,
    /// Of those, slices copied (or repacked) out of a bounce buffer, not
    /// read in place.
    pub bounced: u64,
    /// Of those, slices read in place through io_uring into registered
    /// memory (no page pinned per read).
    pub fixed: u64,
}

impl std::ops::AddAssign for ReadStats {
    fn add_assign(&mut self, o: ReadStats) {
        self.bytes += o.bytes;
        self.window_bytes += o.window_bytes;
        self.slices += o.slices;
        self.bounced += o.bounced;
        self.fixed += o.fixed;
    }
}

struct LaneFile {
    direct: Option<File>,
    buffered: File,
}

/// One lane's private descriptors, buffer and ring.
struct Lane {
    files: Vec<LaneFile>,
    bounce: AlignedBuf,
    /// Set once the arena is registered ([`ReadLanes::use_arena`]).
    ring: Option<Ring>,
}

impl Lane {
    fn open(paths: &[PathBuf], direct: &[bool]) -> io::Result<Lane> {
        let mut files = Vec::with_capacity(paths.len());
        for (p, &d) in paths.iter().zip(direct) {
            let buffered = File::open(p).map_err(|e| with_path(e, p))?;
            let direct = if d { Some(open_direct(p)?) } else { None };
            files.push(LaneFile { direct, buffered });
        }
        Ok(Lane { files, bounce: AlignedBuf::new(1 << 20), ring: None })
    }

    fn read(&mut self, job: &ReadJob) -> io::Result<ReadStats> {
        self.read_many(std::slice::from_ref(job)).pop().unwrap_or_else(|| Err(io::Error::other("no read result")))
    }

    /// Reads `jobs`, one result each: those io_uring serves (O_DIRECT page
    /// windows in place, whole pages in the registered arena) together in
    /// one submission, the rest with positioned reads.
    fn read_many(&mut self, jobs: &[ReadJob]) -> Vec<io::Result<ReadStats>> {
        let mut results: Vec<Option<io::Result<ReadStats>>> = jobs.iter().map(|_| None).collect();
        let fixed = self.fixed_windows(jobs);
        if !fixed.is_empty()
            && let Some(ring) = &mut self.ring
        {
            let windows: Vec<(&Window, &FixedSpan)> = fixed.iter().map(|(_, w, span)| (w, *span)).collect();
            let read = ring.read_windows(&windows);
            for (i, w, _) in &fixed {
                results[*i] = Some(match &read {
                    Ok(()) => Ok(ReadStats {
                        bytes: jobs[*i].len as u64,
                        window_bytes: w.len as u64,
                        slices: 1,
                        fixed: 1,
                        ..ReadStats::default()
                    }),
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                });
            }
        }
        jobs.iter().zip(results).map(|(job, r)| r.unwrap_or_else(|| self.read_plain(job))).collect()
    }

    /// The jobs the lane's ring can read, by index, with their windows: an
    /// O_DIRECT page window in place whose whole pages are an arena run
    /// ([`ReadJob::fixed`]), its chunks registered. If registration is
    /// refused mid-run (locked memory ran out) the lane reads as before
    /// from then on: the pages are mapped, so positioned reads fill them
    /// all the same.
    fn fixed_windows<'j>(&mut self, jobs: &'j [ReadJob]) -> Vec<(usize, Window<'j>, &'j FixedSpan)> {
        use std::os::fd::AsRawFd;
        let mut fixed = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let (Some(ring), Some(span), Some(direct), None) =
                (&mut self.ring, &job.fixed, &self.files[job.shard].direct, &job.repack)
            else {
                continue;
            };
            let Some((lead, wlen)) = in_place_window(job) else { continue };
            if ring.register_for(span).is_err() {
                self.ring = None;
                return Vec::new();
            }
            let window = Window {
                fd: direct.as_raw_fd(),
                file_offset: job.offset - lead as u64,
                region: &job.region,
                region_offset: job.region_offset - lead,
                len: wlen,
                need: lead + job.len,
            };
            fixed.push((i, window, span));
        }
        fixed
    }

    /// Reads a job with positioned reads.
    fn read_plain(&mut self, job: &ReadJob) -> io::Result<ReadStats> {
        let f = &self.files[job.shard];
        let mut stats =
            ReadStats { bytes: job.len as u64, window_bytes: job.len as u64, slices: 1, ..ReadStats::default() };
        if let Some(repacker) = &job.repack {
            // Repacking writes other bytes than the file's: through the
            // bounce buffer, never as a page window into the region.
            let (window, slice) = self.read_bounced(job)?;
            stats.window_bytes = window;
            stats.bounced = 1;
            let src = &self.bounce.as_slice()[slice];
            job.region
                .fill_with(job.region_offset, job.len, |dst| {
                    repacker.repack(src, dst)?;
                    if let Some(c) = &job.copy_into {
                        c.copy.write(c.bank, c.expert, dst);
                    }
                    Ok::<(), String>(())
                })?
                .map_err(io::Error::other)?;
            return Ok(stats);
        }
        let Some(direct) = &f.direct else {
            job.region.fill_with(job.region_offset, job.len, |dst| f.buffered.read_exact_at(dst, job.offset))??;
            return Ok(stats);
        };
        if let Some((lead, wlen)) = in_place_window(job) {
            stats.window_bytes = wlen as u64;
            job.region.read_file_at(
                direct,
                job.offset - lead as u64,
                job.region_offset - lead,
                wlen,
                lead + job.len,
            )?;
        } else {
            let (window, slice) = self.read_bounced(job)?;
            stats.window_bytes = window;
            job.region.write(job.region_offset, &self.bounce.as_slice()[slice])?;
            stats.bounced = 1;
        }
        Ok(stats)
    }

    /// Reads the job's slice into the bounce buffer (with O_DIRECT, its
    /// enclosing page window). Returns the bytes transferred and where the
    /// slice sits in the buffer.
    fn read_bounced(&mut self, job: &ReadJob) -> io::Result<(u64, std::ops::Range<usize>)> {
        let f = &self.files[job.shard];
        let Some(direct) = &f.direct else {
            self.bounce.ensure(job.len);
            f.buffered.read_exact_at(&mut self.bounce.as_mut_slice()[..job.len], job.offset)?;
            return Ok((job.len as u64, 0..job.len));
        };
        let (lead, wlen) = memory::page_window(page(), job.offset, job.len);
        let need = lead + job.len;
        let start = job.offset - lead as u64;
        self.bounce.ensure(wlen);
        let buf = &mut self.bounce.as_mut_slice()[..wlen];
        let mut got = 0;
        while got < need {
            let n = match direct.read_at(&mut buf[got..], start + got as u64) {
                // A signal (Ctrl-C) cut the read short: read again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                read => read?,
            };
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file ends inside the slice"));
            }
            got += n;
        }
        Ok((wlen as u64, lead..need))
    }
}

/// The enclosing page window of an O_DIRECT job that can be read straight
/// into place, as `(lead, window length)`: `lead` bytes before the slice.
fn in_place_window(job: &ReadJob) -> Option<(usize, usize)> {
    let (lead, wlen) = memory::page_window(page(), job.offset, job.len);
    let in_place = (job.linear || (lead == 0 && job.len == wlen))
        && job.region_offset % page() == lead
        && job.region_offset - lead + wlen <= job.region.len();
    in_place.then_some((lead, wlen))
}

fn open_direct(p: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(p)
}

fn with_path(e: io::Error, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

/// Checks that O_DIRECT opens and returns the same bytes as a buffered read.
fn direct_works(p: &Path) -> Result<(), String> {
    let direct = open_direct(p).map_err(|e| format!("cannot open with O_DIRECT ({e})"))?;
    let buffered = File::open(p).map_err(|e| e.to_string())?;
    let size = buffered.metadata().map_err(|e| e.to_string())?.len();
    let at = (size / 2) / page() as u64 * page() as u64;
    let len = (size - at).min(page() as u64) as usize;
    let mut a = AlignedBuf::new(page());
    let mut b = vec![0u8; len];
    let n = direct.read_at(a.as_mut_slice(), at).map_err(|e| format!("O_DIRECT read failed ({e})"))?;
    buffered.read_exact_at(&mut b, at).map_err(|e| e.to_string())?;
    if n < len || a.as_slice()[..len] != b[..] {
        return Err("O_DIRECT returned different bytes than a buffered read".into());
    }
    Ok(())
}

/// The lanes' work. Urgent reads (a layer about to compute needs them) go
/// first; read-ahead reads run in submission order behind them, and a
/// ticket (the absolute index just past a submission's last job) says when
/// a submission has landed: every read-ahead job before it is done.
struct Shared {
    urgent: Vec<ReadJob>,
    urgent_next: usize,
    urgent_done: usize,
    ahead: Vec<ReadJob>,
    /// Absolute index of `ahead[0]`.
    ahead_base: u64,
    ahead_next: usize,
    ahead_done: usize,
    ahead_finished: Vec<bool>,
    /// `ahead[..ahead_landed]` are all done.
    ahead_landed: usize,
    stats: ReadStats,
    error: Option<io::Error>,
    shutdown: bool,
    /// Rings for the worker lanes (index = lane - 1), each taken by its
    /// lane before its next read.
    rings: Vec<Option<Ring>>,
}

/// Which job a lane took (read-ahead by absolute index).
#[derive(Clone, Copy)]
enum Taken {
    Urgent,
    Ahead(u64),
}

impl Shared {
    fn new() -> Shared {
        Shared {
            urgent: Vec::new(),
            urgent_next: 0,
            urgent_done: 0,
            ahead: Vec::new(),
            ahead_base: 0,
            ahead_next: 0,
            ahead_done: 0,
            ahead_finished: Vec::new(),
            ahead_landed: 0,
            stats: ReadStats::default(),
            error: None,
            shutdown: false,
            rings: Vec::new(),
        }
    }

    /// The next job to read, urgent first, read-ahead only below the
    /// absolute index `ahead_limit`; none once a read has failed.
    fn take(&mut self, ahead_limit: u64) -> Option<(Taken, ReadJob)> {
        if self.error.is_some() {
            return None;
        }
        if let Some(job) = self.urgent.get(self.urgent_next) {
            self.urgent_next += 1;
            return Some((Taken::Urgent, job.clone()));
        }
        let i = self.ahead_next;
        let job = self.ahead.get(i).filter(|_| self.ahead_base + (i as u64) < ahead_limit)?;
        self.ahead_next += 1;
        Some((Taken::Ahead(self.ahead_base + i as u64), job.clone()))
    }

    /// Up to `limit` jobs to read together ([`Self::take`], in order).
    fn take_many(&mut self, limit: usize) -> Vec<(Taken, ReadJob)> {
        std::iter::from_fn(|| self.take(u64::MAX)).take(limit).collect()
    }

    fn finish(&mut self, taken: Taken, r: io::Result<ReadStats>) {
        match taken {
            Taken::Urgent => self.urgent_done += 1,
            Taken::Ahead(at) => {
                let i = (at - self.ahead_base) as usize;
                self.ahead_done += 1;
                self.ahead_finished[i] = true;
                while self.ahead_finished.get(self.ahead_landed) == Some(&true) {
                    self.ahead_landed += 1;
                }
            }
        }
        match r {
            Ok(st) => self.stats += st,
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
    }

    /// Reads started and not finished.
    fn busy(&self) -> bool {
        self.urgent_done < self.urgent_next || self.ahead_done < self.ahead_next
    }

    /// Every job submitted so far is done.
    fn all_done(&self) -> bool {
        self.urgent_done == self.urgent.len() && self.ahead_landed == self.ahead.len()
    }

    /// Read-ahead up to `ticket` has landed.
    fn landed(&self, ticket: u64) -> bool {
        self.ahead_base + self.ahead_landed as u64 >= ticket
    }

    /// Drops the landed read-ahead from the front (tickets and the indices
    /// of reads in flight are absolute, so they stay valid).
    fn compact(&mut self) {
        let n = self.ahead_landed;
        self.ahead.drain(..n);
        self.ahead_finished.drain(..n);
        self.ahead_base += n as u64;
        self.ahead_next -= n;
        self.ahead_done -= n;
        self.ahead_landed = 0;
    }

    /// Forgets finished work (tickets stay absolute) and, after an error
    /// once nothing is in flight, every job that did not start.
    fn clear(&mut self) {
        self.ahead_base += self.ahead.len() as u64;
        self.ahead.clear();
        self.ahead_finished.clear();
        (self.ahead_next, self.ahead_done, self.ahead_landed) = (0, 0, 0);
        self.urgent.clear();
        (self.urgent_next, self.urgent_done) = (0, 0);
    }
}

struct Pool {
    state: Mutex<Shared>,
    work: Condvar,
    finished: Condvar,
    /// CPU time the lanes have spent on reads (system calls, page pinning,
    /// bounce copies, repacking), nanoseconds.
    cpu_ns: std::sync::atomic::AtomicU64,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.state.lock().expect("read pool lock")
    }

    /// Runs a read on this thread, adding the CPU time it took to the
    /// lanes' total.
    fn timed<T>(&self, read: impl FnOnce() -> T) -> T {
        let start = thread_cpu_ns();
        let out = read();
        self.cpu_ns.fetch_add(thread_cpu_ns().saturating_sub(start), std::sync::atomic::Ordering::Relaxed);
        out
    }
}

/// The set of read lanes.
pub struct ReadLanes {
    paths: Vec<PathBuf>,
    lane0: Lane,
    pool: Arc<Pool>,
    workers: Vec<JoinHandle<()>>,
    direct: Vec<bool>,
}

impl ReadLanes {
    /// Opens `lanes` lanes over `paths`. With `want_direct`, each file uses
    /// O_DIRECT if it passes the check; otherwise buffered reads, and a
    /// notice saying why is returned.
    pub fn open(paths: &[PathBuf], lanes: usize, want_direct: bool) -> io::Result<(ReadLanes, Vec<String>)> {
        let mut notices = Vec::new();
        let direct: Vec<bool> = paths
            .iter()
            .map(|p| {
                want_direct
                    && match direct_works(p) {
                        Ok(()) => true,
                        Err(why) => {
                            notices.push(format!("{}: {why}; using buffered reads", p.display()));
                            false
                        }
                    }
            })
            .collect();
        let lane0 = Lane::open(paths, &direct)?;
        let pool = Arc::new(Pool {
            state: Mutex::new(Shared::new()),
            work: Condvar::new(),
            finished: Condvar::new(),
            cpu_ns: Default::default(),
        });
        let mut workers = Vec::new();
        for i in 1..lanes.max(1) {
            let mut lane = Lane::open(paths, &direct)?;
            let pool = pool.clone();
            let paths = paths.to_vec();
            let handle = std::thread::Builder::new()
                .name(format!("{LANE_THREAD_PREFIX}{i}"))
                .spawn(move || worker(&pool, &mut lane, i, &paths))?;
            workers.push(handle);
        }
        Ok((ReadLanes { paths: paths.to_vec(), lane0, pool, workers, direct }, notices))
    }

    /// CPU time the lanes have spent reading so far, nanoseconds: what
    /// each read costs the machine's cores besides the wait for storage.
    pub fn cpu_ns(&self) -> u64 {
        self.pool.cpu_ns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Registers `arena` with an io_uring for every lane: from then on a
    /// job with a [`ReadJob::fixed`] span reads its whole pages through
    /// it. Needs O_DIRECT (registered buffers serve direct reads) and
    /// nothing in flight; on an error no lane uses io_uring.
    pub fn use_arena(&mut self, arena: &Arc<Arena>) -> io::Result<()> {
        if !self.o_direct() {
            return Err(io::Error::other("reads are buffered, not O_DIRECT"));
        }
        let registrar = Registrar::new(arena)?;
        let first = Ring::new(&registrar)?;
        let mut rings = Vec::with_capacity(self.workers.len());
        for _ in &self.workers {
            rings.push(Some(Ring::new(&registrar)?));
        }
        self.lane0.ring = Some(first);
        self.pool.lock().rings = rings;
        Ok(())
    }

    /// True when every file is read with O_DIRECT.
    pub fn o_direct(&self) -> bool {
        self.direct.iter().all(|&d| d)
    }

    /// Number of lanes, the eval thread included.
    pub fn lanes(&self) -> usize {
        self.workers.len() + 1
    }

    /// Asks the kernel to drop cached pages of a byte range of a shard.
    pub fn drop_cached(&self, shard: usize, offset: u64, len: u64) -> io::Result<()> {
        crate::llama::memory::drop_file_cache(&self.lane0.files[shard].buffered, offset, len)
    }

    /// Reads every job, using all lanes, and returns when they are done;
    /// read-ahead in flight keeps going behind them. An error of any read
    /// (read-ahead included) is returned once nothing is in flight, and
    /// read-ahead that had not started is dropped: see [`Self::wait_for`].
    pub fn read_all(&mut self, jobs: Vec<ReadJob>) -> io::Result<ReadStats> {
        if jobs.is_empty() {
            // A layer that hit everything: wake no lane.
            return Ok(ReadStats::default());
        }
        if self.workers.is_empty() || jobs.len() == 1 {
            let mut stats = ReadStats::default();
            for job in &jobs {
                match self.pool.timed(|| self.lane0.read(job)) {
                    Ok(st) => stats += st,
                    Err(e) => {
                        let e = self.explain(e, job);
                        // Nothing may still be writing when the caller cleans up.
                        let _ = self.wait();
                        return Err(e);
                    }
                }
            }
            return Ok(stats);
        }
        {
            let mut s = self.pool.lock();
            s.urgent = jobs;
            (s.urgent_next, s.urgent_done) = (0, 0);
        }
        self.pool.work.notify_all();
        self.drain(0, |s| s.urgent_done == s.urgent.len())
    }

    /// Queues `jobs` as read-ahead on the worker lanes and returns at once
    /// with a ticket for [`Self::wait_for`]. With a single lane nothing
    /// runs until a wait, which reads the jobs itself.
    pub fn submit(&mut self, jobs: Vec<ReadJob>) -> u64 {
        let empty = jobs.is_empty();
        let ticket = {
            let mut s = self.pool.lock();
            s.compact();
            let n = s.ahead.len() + jobs.len();
            s.ahead.extend(jobs);
            s.ahead_finished.resize(n, false);
            s.ahead_base + n as u64
        };
        if !empty {
            self.pool.work.notify_all();
        }
        ticket
    }

    /// Waits until the read-ahead submitted up to `ticket` has landed,
    /// reading its unstarted jobs on this thread (lane 0) meanwhile; later
    /// submissions keep going. Returns what the lanes moved since the last
    /// wait. On an error of any read it waits until nothing is in flight,
    /// drops every job that did not start, and returns the error: the
    /// caller must then treat all read-ahead as not read.
    pub fn wait_for(&mut self, ticket: u64) -> io::Result<ReadStats> {
        self.drain(ticket, |s| s.landed(ticket))
    }

    /// The ticket up to which read-ahead has landed without an error, as it
    /// stands now (`None` after an error, which a wait reports).
    pub fn landed(&self) -> Option<u64> {
        let s = self.pool.lock();
        s.error.is_none().then(|| s.ahead_base + s.ahead_landed as u64)
    }

    /// Waits for everything submitted ([`Self::wait_for`] of the latest ticket).
    pub fn wait(&mut self) -> io::Result<ReadStats> {
        self.drain(u64::MAX, Shared::all_done)
    }

    /// Reads jobs here until `done` (urgent ones, and read-ahead below
    /// `ahead_limit`), then waits for the lanes; see [`Self::wait_for`].
    fn drain(&mut self, ahead_limit: u64, done: impl Fn(&Shared) -> bool) -> io::Result<ReadStats> {
        loop {
            let taken = {
                let mut s = self.pool.lock();
                if done(&s) || s.error.is_some() {
                    break;
                }
                s.take(ahead_limit)
            };
            match taken {
                Some((t, job)) => {
                    let r = self.pool.timed(|| self.lane0.read(&job)).map_err(|e| self.explain(e, &job));
                    self.pool.lock().finish(t, r);
                }
                None => {
                    // Everything this wait needs has started: wait for the lanes.
                    let mut s = self.pool.lock();
                    while !done(&s) && s.error.is_none() {
                        s = self.pool.finished.wait(s).expect("read pool lock");
                    }
                }
            }
        }
        let mut s = self.pool.lock();
        if let Some(e) = s.error.take() {
            // Workers take nothing while the error is set (now taken): stop them first.
            s.error = Some(io::Error::other("stopping after a failed read"));
            while s.busy() {
                s = self.pool.finished.wait(s).expect("read pool lock");
            }
            s.clear();
            s.stats = ReadStats::default();
            s.error = None;
            return Err(e);
        }
        if s.all_done() {
            s.clear();
        }
        Ok(std::mem::take(&mut s.stats))
    }

    fn explain(&self, e: io::Error, job: &ReadJob) -> io::Error {
        explain(e, &self.paths, job)
    }
}

fn explain(e: io::Error, paths: &[PathBuf], job: &ReadJob) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("reading {} bytes at offset {} of {}: {e}", job.len, job.offset, paths[job.shard].display()),
    )
}

fn worker(pool: &Pool, lane: &mut Lane, index: usize, paths: &[PathBuf]) {
    loop {
        let batch = {
            let mut s = pool.lock();
            loop {
                if s.shutdown {
                    return;
                }
                if let Some(ring) = s.rings.get_mut(index - 1).and_then(Option::take) {
                    lane.ring = Some(ring);
                }
                // A lane with a ring submits several reads at once.
                let batch = s.take_many(if lane.ring.is_some() { RING_BATCH } else { 1 });
                if !batch.is_empty() {
                    break batch;
                }
                s = pool.work.wait(s).expect("read pool lock");
            }
        };
        let jobs: Vec<ReadJob> = batch.iter().map(|(_, job)| job.clone()).collect();
        let results = pool.timed(|| lane.read_many(&jobs));
        let mut s = pool.lock();
        for ((taken, job), r) in batch.into_iter().zip(results) {
            s.finish(taken, r.map_err(|e| explain(e, paths, &job)));
        }
        drop(s);
        pool.finished.notify_all();
    }
}

/// CPU time of the calling thread, nanoseconds.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

impl Drop for ReadLanes {
    fn drop(&mut self) {
        if let Ok(mut s) = self.pool.state.lock() {
            s.shutdown = true;
        }
        self.pool.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sample_file(dir: &Path, len: usize) -> (PathBuf, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let p = dir.join("data.bin");
        File::create(&p).unwrap().write_all(&data).unwrap();
        (p, data)
    }

    #[test]
    fn lanes_read_exact_bytes_direct_and_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = sample_file(dir.path(), 300_000);
        for (lanes, direct) in [(1, false), (1, true), (4, true), (3, false)] {
            let (mut r, _) = ReadLanes::open(std::slice::from_ref(&p), lanes, direct).unwrap();
            let region = Arc::new(Region::reserve(300_000).unwrap());
            // Unaligned offsets and lengths, including the file's last byte.
            let cuts = [(0usize, 1000usize), (1000, 5000), (6000, 70_001), (76_001, 223_999)];
            let jobs = cuts
                .iter()
                .map(|&(o, l)| ReadJob {
                    shard: 0,
                    offset: o as u64,
                    len: l,
                    region: region.clone(),
                    region_offset: o,
                    linear: true,
                    repack: None,
                    fixed: None,
                    copy_into: None,
                })
                .collect();
            let st = r.read_all(jobs).unwrap();
            assert_eq!(st.bytes, 300_000);
            assert!(r.cpu_ns() > 0, "reads on lanes={lanes} direct={direct} cost no CPU time");
            // The region maps the file linearly: O_DIRECT windows land in place.
            assert_eq!(st.bounced, 0, "lanes={lanes} direct={direct}");
            region.fill_with(0, 300_000, |s| assert!(s == &data[..], "lanes={lanes} direct={direct}")).unwrap();
        }
    }

    #[test]
    fn unaligned_slices_elsewhere_go_through_the_bounce_buffer_and_spill_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = sample_file(dir.path(), 40_000);
        let (mut r, _) = ReadLanes::open(std::slice::from_ref(&p), 2, true).unwrap();
        assert!(r.o_direct());
        let region = Arc::new(Region::reserve(8 * page()).unwrap());
        region.write(0, &vec![0xAB; 8 * page()]).unwrap();
        // Congruent but not declared linear; declared linear but not congruent.
        let cuts = [(5000usize, 5000 % page() + page(), 3000usize, false), (9000, 4 * page() + 7, 2000, true)];
        let jobs = cuts
            .iter()
            .map(|&(o, at, l, linear)| ReadJob {
                shard: 0,
                offset: o as u64,
                len: l,
                region: region.clone(),
                region_offset: at,
                linear,
                repack: None,
                fixed: None,
                copy_into: None,
            })
            .collect();
        let st = r.read_all(jobs).unwrap();
        assert_eq!((st.slices, st.bounced), (2, 2));
        let mut expect = vec![0xABu8; 8 * page()];
        for &(o, at, l, _) in &cuts {
            expect[at..at + l].copy_from_slice(&data[o..o + l]);
        }
        region.fill_with(0, 8 * page(), |s| assert!(s == &expect[..], "bytes outside the slices changed")).unwrap();
    }

    #[test]
    fn page_aligned_slices_read_straight_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = sample_file(dir.path(), 64 * page() + 100);
        for lanes in [1, 3] {
            let (mut r, _) = ReadLanes::open(std::slice::from_ref(&p), lanes, true).unwrap();
            assert!(r.o_direct());
            let region = Arc::new(Region::reserve(64 * page()).unwrap());
            // Aligned slices, one of them landing at another offset than it was read from.
            let cuts =
                [(0, 0, 8 * page()), (8 * page(), 40 * page(), 24 * page()), (32 * page(), 8 * page(), 32 * page())];
            let jobs = cuts
                .iter()
                .map(|&(o, at, l)| ReadJob {
                    shard: 0,
                    offset: o as u64,
                    len: l,
                    region: region.clone(),
                    region_offset: at,
                    linear: false,
                    repack: None,
                    fixed: None,
                    copy_into: None,
                })
                .collect();
            let st = r.read_all(jobs).unwrap();
            assert_eq!((st.bytes, st.window_bytes, st.bounced), (64 * page() as u64, 64 * page() as u64, 0));
            for &(o, at, l) in &cuts {
                region.fill_with(at, l, |s| assert!(s == &data[o..o + l], "lanes={lanes} slice at {o}")).unwrap();
            }
        }
    }

    #[test]
    fn submitted_reads_land_by_wait_and_errors_surface_there() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = sample_file(dir.path(), 200_000);
        for lanes in [1, 2, 4] {
            let (mut r, _) = ReadLanes::open(std::slice::from_ref(&p), lanes, true).unwrap();
            let region = Arc::new(Region::reserve(200_000).unwrap());
            let jobs: Vec<ReadJob> = (0..10)
                .map(|i| ReadJob {
                    shard: 0,
                    offset: i * 20_000,
                    len: 20_000,
                    region: region.clone(),
                    region_offset: i as usize * 20_000,
                    linear: false,
                    repack: None,
                    fixed: None,
                    copy_into: None,
                })
                .collect();
            r.submit(jobs);
            assert_eq!(r.wait().unwrap().bytes, 200_000, "lanes={lanes}");
            region.fill_with(0, 200_000, |s| assert!(s == &data[..], "lanes={lanes}")).unwrap();
            // Nothing in flight: waiting again moves nothing.
            assert_eq!(r.wait().unwrap().bytes, 0);
            // A failing background batch reports at wait, and the lanes go on working.
            let bad = ReadJob {
                shard: 0,
                offset: 199_000,
                len: 5_000,
                region: region.clone(),
                region_offset: 0,
                linear: false,
                repack: None,
                fixed: None,
                copy_into: None,
            };
            r.submit(vec![bad]);
            assert!(r.wait().unwrap_err().to_string().contains("offset 199000"));
            let good = ReadJob {
                shard: 0,
                offset: 0,
                len: 1_000,
                region: region.clone(),
                region_offset: 0,
                linear: false,
                repack: None,
                fixed: None,
                copy_into: None,
            };
            assert_eq!(r.read_all(vec![good]).unwrap().bytes, 1_000);
        }
    }

    #[test]
    fn tickets_wait_for_their_own_submission_and_urgent_reads_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = sample_file(dir.path(), 400_000);
        let job = |region: &Arc<Region>, i: u64, len: usize| ReadJob {
            shard: 0,
            offset: i * 20_000,
            len,
            region: region.clone(),
            region_offset: i as usize * 20_000,
            linear: false,
            repack: None,
            fixed: None,
            copy_into: None,
        };
        for lanes in [1, 2, 4] {
            let (mut r, _) = ReadLanes::open(std::slice::from_ref(&p), lanes, true).unwrap();
            let region = Arc::new(Region::reserve(400_000).unwrap());
            let first = r.submit((0..5).map(|i| job(&region, i, 20_000)).collect());
            let second = r.submit((5..10).map(|i| job(&region, i, 20_000)).collect());
            assert!(second > first);
            // Urgent reads land while read-ahead may still be in flight.
            let urgent = r.read_all((15..20).map(|i| job(&region, i, 20_000)).collect()).unwrap();
            assert!(urgent.bytes >= 100_000, "lanes={lanes}: {} bytes", urgent.bytes);
            region.fill_with(300_000, 100_000, |s| assert!(s == &data[300_000..400_000])).unwrap();
            r.wait_for(first).unwrap();
            region.fill_with(0, 100_000, |s| assert!(s == &data[..100_000], "lanes={lanes}")).unwrap();
            // More read-ahead behind what is in flight, then everything.
            let third = r.submit((10..15).map(|i| job(&region, i, 20_000)).collect());
            r.wait_for(third).unwrap();
            region.fill_with(0, 300_000, |s| assert!(s == &data[..300_000], "lanes={lanes}")).unwrap();
            assert_eq!(r.wait().unwrap().bytes, 0, "nothing left in flight");
            // A failing read-ahead job fails the next wait, whichever ticket it waits for,
            // drops what did not start, and leaves the lanes working.
            let bad = job(&region, 19, 5_000);
            let bad = ReadJob { offset: 399_000, ..bad };
            let failing = r.submit(vec![bad]);
            let after = r.submit((0..5).map(|i| job(&region, i, 20_000)).collect());
            assert!(r.wait_for(after).is_err(), "lanes={lanes}");
            assert!(failing < after);
            assert_eq!(r.wait().unwrap().bytes, 0);
            let again = r.submit(vec![job(&region, 1, 20_000)]);
            assert_eq!(r.wait_for(again).unwrap().bytes, 20_000);
        }
    }

    #[test]
    fn o_direct_falls_back_with_a_notice_where_unsupported() {
        // procfs refuses O_DIRECT (EINVAL) but serves positioned buffered reads;
        // /proc/version does not change while we read it.
        let p = PathBuf::from("/proc/version");
        let expected = std::fs::read(&p).unwrap();
        let (mut r, notices) = ReadLanes::open(std::slice::from_ref(&p), 2, true).unwrap();
        assert!(!r.o_direct());
        assert!(
            notices.iter().any(|n| n.contains("cannot open with O_DIRECT") && n.contains("buffered")),
            "{notices:?}"
        );
        let len = expected.len().min(200);
        let region = Arc::new(Region::reserve(len).unwrap());
        let job = ReadJob {
            shard: 0,
            offset: 0,
            len,
            region: region.clone(),
            region_offset: 0,
            linear: false,
            repack: None,
            fixed: None,
            copy_into: None,
        };
        r.read_all(vec![job]).unwrap();
        region.fill_with(0, len, |s| assert!(s == &expected[..len])).unwrap();
    }

    #[test]
    fn reading_past_the_end_is_an_error_not_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = sample_file(dir.path(), 10_000);
        for lanes in [1, 2] {
            let (mut r, _) = ReadLanes::open(std::slice::from_ref(&p), lanes, true).unwrap();
            let region = Arc::new(Region::reserve(20_000).unwrap());
            let jobs = (0..2)
                .map(|i| ReadJob {
                    shard: 0,
                    offset: 9_000,
                    len: 2_000,
                    region: region.clone(),
                    region_offset: i * 2_000,
                    linear: false,
                    repack: None,
                    fixed: None,
                    copy_into: None,
                })
                .collect();
            let err = r.read_all(jobs).unwrap_err();
            assert!(err.to_string().contains("offset 9000"), "{err}");
        }
    }
}
