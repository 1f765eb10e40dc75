//! A kind's read thread: the loop that walks a reader's visits (`kit::visits`), opens each
//! visited unit and sends its items to the consumer in chunks, so that I/O and decoding overlap
//! the consumer's work. What an item is, how a unit is opened and how big an item is are the
//! kind's (the closures it passes); the walk, the chunking and when it stops are written here
//! once.

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::Sender;

use super::visits::Visit;
use crate::error::Fault;

/// What the read thread sends for a visit (with the visit's index).
pub(crate) enum Chunk<T> {
    /// The unit's next items, in order.
    Items(Vec<T>),
    /// The unit's items ended (all read).
    End,
    /// The unit could not be opened or read on: the thread stops after sending it.
    Failed(Fault),
}

/// When a chunk is sent: at `items` items, or early once its items' sizes reach `bytes`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkBounds {
    pub items: usize,
    pub bytes: usize,
}

/// Walks `visits` in order: opens each visit's unit (`open` gives the unit's "next item"
/// closure), sends its items in chunks bounded by `bounds` (an item's size from `size`), then
/// `Chunk::End`. A visit the consumer has finished (`finished(i)`: it took every item it
/// wanted) is skipped, or left between chunks; `stop` ends the walk before the next unit or
/// chunk. A unit's fault is sent as `Chunk::Failed` and ends the walk, as does a consumer gone.
pub(crate) fn read_visits<T, N>(
    visits: &[Visit],
    bounds: ChunkBounds,
    mut open: impl FnMut(&Visit) -> Result<N, Fault>,
    size: impl Fn(&T) -> usize,
    finished: impl Fn(usize) -> bool,
    stop: &AtomicBool,
    out: &Sender<(usize, Chunk<T>)>,
) where
    N: FnMut() -> Option<Result<T, Fault>>,
{
    let stopped = || stop.load(Ordering::Relaxed);
    for (i, visit) in visits.iter().enumerate() {
        if stopped() {
            return;
        }
        // A visit the consumer finished without this thread (nothing of it left to take).
        if finished(i) {
            continue;
        }
        let mut next = match open(visit) {
            Ok(next) => next,
            Err(fault) => {
                let _ = out.send((i, Chunk::Failed(fault)));
                return;
            }
        };
        let (mut chunk, mut bytes) = (Vec::with_capacity(bounds.items), 0usize);
        loop {
            if stopped() {
                return;
            }
            if finished(i) {
                break;
            }
            match next() {
                Some(Ok(item)) => {
                    bytes += size(&item);
                    chunk.push(item);
                    if chunk.len() >= bounds.items || bytes >= bounds.bytes {
                        let full = std::mem::replace(&mut chunk, Vec::with_capacity(bounds.items));
                        bytes = 0;
                        if out.send((i, Chunk::Items(full))).is_err() {
                            return;
                        }
                    }
                }
                Some(Err(fault)) => {
                    let _ = out.send((i, Chunk::Failed(fault)));
                    return;
                }
                None => {
                    let last = (!chunk.is_empty()).then_some((i, Chunk::Items(chunk)));
                    if last
                        .into_iter()
                        .chain([(i, Chunk::End)])
                        .any(|c| out.send(c).is_err())
                    {
                        return;
                    }
                    break;
                }
            }
        }
    }
}
