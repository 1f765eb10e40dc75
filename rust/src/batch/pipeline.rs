//! The one pipeline every sample kind runs on: a batcher thread that drives a kind's batches,
//! one at a time, into buffers the caller lends, on a pool of work threads.
//!
//! ```text
//! caller ──lent buffers──▶ batcher thread (kind.next_batch on the pool) ──batches──▶ caller
//! ```
//!
//! Written once here, for every kind: the work pool and its thread names, the channels between
//! the caller and the batcher, lending and checking the caller's buffers, stop, drop and join,
//! and a panic anywhere in a kind's batching turned into a typed fault that fails the pass (a
//! bug met on some input must never end an epoch early: one rank stopping hangs the others in
//! DDP). A kind (`square`, `naflex`, `text`, `interleaved`) is a `Kind`: how its next batch is made
//! into a lent buffer, what it says of each batch, and what it counts.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::batch::panics::panic_fault;
use crate::error::Fault;

/// One writable region of a lent buffer: `bytes` at `ptr`.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub ptr: *mut u8,
    pub bytes: usize,
}

impl Region {
    /// No memory: a region the kind does not use in this configuration.
    pub const NONE: Region = Region {
        ptr: std::ptr::null_mut(),
        bytes: 0,
    };
}

/// A buffer the caller lends for one batch: the regions the kind writes (pixels, token ids,
/// positions, ...), in the order of the kind's `Needs`. The caller keeps the memory alive and
/// untouched until the batch filled into it comes back.
pub struct Lent {
    pub regions: Vec<Region>,
    /// Keeps the memory alive for as long as the pipeline may write to it (the binding puts a
    /// reference to the Python objects here), even if the caller stops waiting.
    pub owner: Option<Box<dyn Any + Send>>,
}

// SAFETY: a lent buffer is written by exactly one batch at a time; the caller keeps it untouched
// until that batch is handed back, and `owner` keeps it allocated.
unsafe impl Send for Lent {}

impl Lent {
    /// Region `i` as its first `n` values of `T`; None when the region is absent (not used in
    /// this configuration). The pipeline checked every region against the kind's needs when
    /// the buffer was lent.
    pub fn values<T>(&mut self, i: usize, n: usize) -> Option<&mut [T]> {
        // SAFETY: one region, borrowed through `&mut self`, so it is not handed out twice.
        unsafe { self.region(i, n) }
    }

    /// Two distinct regions at once (say ids and positions), as `values` gives each.
    pub fn pair<A, B>(
        &mut self,
        (i, n): (usize, usize),
        (j, m): (usize, usize),
    ) -> (Option<&mut [A]>, Option<&mut [B]>) {
        assert_ne!(i, j, "two borrows of one lent region");
        // SAFETY: two different regions (the caller lent disjoint memory for each), borrowed
        // together through `&mut self`.
        unsafe { (self.region(i, n), self.region(j, m)) }
    }

    /// # Safety
    /// The caller hands out each region at most once at a time.
    #[allow(clippy::mut_from_ref)] // the memory is the caller's lent buffer, not `self`'s
    unsafe fn region<T>(&self, i: usize, n: usize) -> Option<&mut [T]> {
        let r = self.regions.get(i).filter(|r| !r.ptr.is_null())?;
        assert!(
            r.bytes >= n * std::mem::size_of::<T>(),
            "lent region {i} of {} bytes cannot hold {n} values of {} bytes",
            r.bytes,
            std::mem::size_of::<T>()
        );
        assert!(
            (r.ptr as usize).is_multiple_of(std::mem::align_of::<T>()),
            "lent region {i} is not aligned for its values"
        );
        // SAFETY: the caller lent `bytes` writable, aligned bytes at `ptr` for this batch alone
        // and keeps them untouched until the batch comes back (see `Lent`).
        Some(unsafe { std::slice::from_raw_parts_mut(r.ptr as *mut T, n) })
    }
}

/// What one region of a lent buffer must hold: at least `bytes` (0: the region is not used and
/// may be absent), named for the error a caller sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    pub name: &'static str,
    pub bytes: usize,
}

/// What a kind counts while it runs, readable at any time from any thread.
pub trait KindStats: Send + Sync + 'static {
    fn snapshot(&self) -> serde_json::Value;
}

/// A sample kind's batching: its next batch into a lent buffer, on the pipeline's pool.
pub trait Kind: Send + 'static {
    /// What the kind says of each finished batch (its metadata; the tensors are in the buffer).
    type Meta: Send + 'static;

    /// The next batch: `lend` gives the caller's next buffer (None once the caller has gone),
    /// to be taken only when the batch is ready to be written. None at the end of the kind's
    /// share; Err fails the pass (nothing more is asked of the kind after it).
    fn next_batch(
        &mut self,
        lend: &mut dyn FnMut() -> Option<Lent>,
    ) -> Option<Result<Self::Meta, Fault>>;
}

/// How a pipeline runs its kind.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Work threads (decoding, tokenizing) of the pool the kind runs on.
    pub threads: usize,
    /// Names the threads and the stage in a panic's fault ("decode", "tokenize").
    pub stage: &'static str,
    /// The regions of every lent buffer.
    pub needs: Vec<Need>,
    /// Batches the kind will make from its position on, when its plan knows.
    pub batches_left: Option<u64>,
}

/// Buffers and batches in flight between the caller and the batcher.
const IN_FLIGHT: usize = 64;

/// How long `drop` waits for the batcher before leaving it to finish on its own (it may be
/// inside a network read with its own timeouts; the buffers it holds stay alive through
/// `Lent::owner`).
const DROP_WAIT: Duration = Duration::from_secs(10);

/// The running pipeline of one reader of a kind.
pub struct Pipeline<K: Kind, S: KindStats> {
    buffers: Option<Sender<Lent>>,
    batches: Receiver<Result<K::Meta, Fault>>,
    stop: Arc<AtomicBool>,
    pub stats: Arc<S>,
    batcher: Option<JoinHandle<()>>,
    setup: Setup,
}

impl<K: Kind, S: KindStats> Pipeline<K, S> {
    /// Starts the batcher thread, which builds its pool, makes the kind there (`make` is given
    /// the stop flag its own threads watch) and drives it until its share, the caller or a
    /// fault ends the pass.
    pub fn start<F>(setup: Setup, stats: Arc<S>, make: F) -> Self
    where
        F: FnOnce(Arc<AtomicBool>) -> K + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (buf_tx, buf_rx) = bounded::<Lent>(IN_FLIGHT);
        let (out_tx, out_rx) = bounded::<Result<K::Meta, Fault>>(IN_FLIGHT);
        let batcher = {
            let (stop, threads, stage) = (stop.clone(), setup.threads.max(1), setup.stage);
            std::thread::Builder::new()
                .name(format!("shardstream-{stage}-batcher"))
                .spawn(move || {
                    let faults = out_tx.clone();
                    let run = std::panic::AssertUnwindSafe(|| {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(threads)
                            .thread_name(move |i| format!("shardstream-{stage}-{i}"))
                            .build()
                            .expect("a work thread pool");
                        pool.install(|| drive(make(stop.clone()), &stop, &buf_rx, &out_tx))
                    });
                    if let Err(panic) = std::panic::catch_unwind(run) {
                        let _ = faults.send(Err(panic_fault(stage, panic.as_ref())));
                    }
                })
                .expect("a batcher thread")
        };
        Pipeline {
            buffers: Some(buf_tx),
            batches: out_rx,
            stop,
            stats,
            batcher: Some(batcher),
            setup,
        }
    }

    /// Lends a buffer for a later batch (batches are filled in the order buffers are lent).
    /// Ok(false) once the pipeline has ended; Err names the region too small for a batch.
    pub fn submit(&self, lent: Lent) -> Result<bool, String> {
        for (i, need) in self.setup.needs.iter().enumerate() {
            let region = lent.regions.get(i).copied().unwrap_or(Region::NONE);
            if need.bytes > 0 && (region.ptr.is_null() || region.bytes < need.bytes) {
                return Err(format!(
                    "{} buffer of {} bytes; a batch needs {}",
                    need.name, region.bytes, need.bytes
                ));
            }
        }
        Ok(self.buffers.as_ref().is_some_and(|b| b.send(lent).is_ok()))
    }

    /// The next finished batch; None at the end of the pass.
    pub fn next_batch(&self) -> Option<Result<K::Meta, Fault>> {
        self.batches.recv().ok()
    }

    /// The regions every lent buffer must hold.
    pub fn needs(&self) -> &[Need] {
        &self.setup.needs
    }

    /// Batches this reader makes from its position on, when its plan knows.
    pub fn batches_left(&self) -> Option<u64> {
        self.setup.batches_left
    }
}

/// Runs `kind` until it ends, fails, the caller goes away or the pipeline stops.
fn drive<K: Kind>(
    mut kind: K,
    stop: &AtomicBool,
    buffers: &Receiver<Lent>,
    out: &Sender<Result<K::Meta, Fault>>,
) {
    let mut lend = || buffers.recv().ok();
    while !stop.load(Ordering::Relaxed) {
        match kind.next_batch(&mut lend) {
            None => return,
            Some(Ok(meta)) => {
                if out.send(Ok(meta)).is_err() {
                    return;
                }
            }
            Some(Err(fault)) => {
                let _ = out.send(Err(fault));
                return;
            }
        }
    }
}

impl<K: Kind, S: KindStats> Drop for Pipeline<K, S> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.buffers.take();
        // A kind's own threads end on their own once the batcher drops their queues. The
        // batcher is waited for (draining its output so it never blocks), so that normally no
        // thread touches a lent buffer after this returns.
        let Some(batcher) = self.batcher.take() else {
            return;
        };
        let deadline = Instant::now() + DROP_WAIT;
        while !batcher.is_finished() && Instant::now() < deadline {
            while self.batches.try_recv().is_ok() {}
            std::thread::sleep(Duration::from_millis(1));
        }
        if batcher.is_finished() {
            let _ = batcher.join();
        }
    }
}
