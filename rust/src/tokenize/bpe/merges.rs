//! The BPE merge loop over one pre-token's bytes, as the tokenizers library runs it (lowest
//! merge rank first, then leftmost, with its check for stale queue entries), and a bounded word
//! cache per thread.

use std::cell::RefCell;
use std::collections::BinaryHeap;

use crate::tokenize::fxhash::FxMap;

/// Words up to this many bytes are cached (the library caches under 256; longer words are
/// rare and would fill the cache with one-offs).
const CACHE_MAX_WORD: usize = 64;
/// Words per cache (per encoder and thread) before it is emptied and refilled.
const CACHE_CAPACITY: usize = 1 << 15;
/// Encoders whose caches one thread keeps.
const CACHES_PER_THREAD: usize = 4;

/// The merge table and the ids of single bytes.
pub struct Merges {
    /// The id of each byte's byte-level character; None: not in the vocabulary (the library
    /// then drops that byte, having no unknown token; `mod.rs` checks that).
    pub byte_ids: [Option<u32>; 256],
    /// (left id, right id) packed in a u64 -> (rank, merged id).
    pub ranks: FxMap<u64, (u32, u32)>,
    /// With `ignore_merges` (Llama 3): a whole pre-token that is in the vocabulary is that one
    /// token, by its bytes.
    pub whole_words: Option<FxMap<Box<[u8]>, u32>>,
    /// Identifies this table in the per-thread caches.
    pub id: u64,
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: i32,
    next: i32,
    /// 0: merged into the symbol on its left.
    live: bool,
}

/// Reused buffers of the merge loop.
#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<std::cmp::Reverse<(u32, u32, u32)>>,
}

#[derive(Default)]
struct WordCache {
    owner: u64,
    words: FxMap<Box<[u8]>, Box<[u32]>>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
    static CACHES: RefCell<Vec<WordCache>> = const { RefCell::new(Vec::new()) };
}

#[inline(always)]
fn pair(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

impl Merges {
    /// Appends the ids of one pre-token (its raw bytes) to `out`.
    pub fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if let Some(whole) = &self.whole_words {
            if let Some(&id) = whole.get(word) {
                out.push(id);
                return;
            }
        }
        if word.len() == 1 {
            out.extend(self.byte_ids[word[0] as usize]);
            return;
        }
        if word.len() > CACHE_MAX_WORD {
            self.merge(word, out);
            return;
        }
        CACHES.with(|caches| {
            let mut caches = caches.borrow_mut();
            let slot = match caches.iter().position(|c| c.owner == self.id) {
                Some(i) => i,
                None => {
                    if caches.len() >= CACHES_PER_THREAD {
                        caches.remove(0);
                    }
                    caches.push(WordCache {
                        owner: self.id,
                        words: FxMap::default(),
                    });
                    caches.len() - 1
                }
            };
            let cache = &mut caches[slot].words;
            if let Some(ids) = cache.get(word) {
                out.extend_from_slice(ids);
                return;
            }
            let start = out.len();
            self.merge(word, out);
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(word.into(), out[start..].into());
        })
    }

    /// The merge loop: the library's (`Word::merge_all`), lowest (rank, position) first; an
    /// entry is stale unless the pair now at its position still merges into its id.
    fn merge(&self, word: &[u8], out: &mut Vec<u32>) {
        SCRATCH.with(|scratch| {
            let mut guard = scratch.borrow_mut();
            let Scratch { symbols, heap } = &mut *guard;
            symbols.clear();
            heap.clear();
            for &b in word {
                if let Some(id) = self.byte_ids[b as usize] {
                    let i = symbols.len() as i32;
                    symbols.push(Symbol {
                        id,
                        prev: i - 1,
                        next: i + 1,
                        live: true,
                    });
                }
            }
            let n = symbols.len();
            if n == 0 {
                return;
            }
            symbols[n - 1].next = -1;
            for i in 0..n - 1 {
                if let Some(&(rank, new)) = self.ranks.get(&pair(symbols[i].id, symbols[i + 1].id))
                {
                    heap.push(std::cmp::Reverse((rank, i as u32, new)));
                }
            }
            while let Some(std::cmp::Reverse((_, pos, new))) = heap.pop() {
                let pos = pos as usize;
                let left = symbols[pos];
                if !left.live || left.next < 0 {
                    continue;
                }
                let next = left.next as usize;
                let right = symbols[next];
                match self.ranks.get(&pair(left.id, right.id)) {
                    Some(&(_, id)) if id == new => {}
                    _ => continue,
                }
                symbols[pos].id = new;
                symbols[pos].next = right.next;
                symbols[next].live = false;
                if right.next >= 0 {
                    symbols[right.next as usize].prev = pos as i32;
                }
                let current = symbols[pos];
                if current.prev >= 0 {
                    let prev = current.prev as usize;
                    if let Some(&(rank, id)) = self.ranks.get(&pair(symbols[prev].id, new)) {
                        heap.push(std::cmp::Reverse((rank, prev as u32, id)));
                    }
                }
                if current.next >= 0 {
                    let after = symbols[current.next as usize].id;
                    if let Some(&(rank, id)) = self.ranks.get(&pair(new, after)) {
                        heap.push(std::cmp::Reverse((rank, pos as u32, id)));
                    }
                }
            }
            out.extend(symbols.iter().filter(|s| s.live).map(|s| s.id));
        })
    }
}
