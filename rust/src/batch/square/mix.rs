//! Mixing of sources: a mixture's reader reads one merged stream per source and takes each
//! block's share of each, in source order, as the plan counted them (`plan::MixedStreams`).

use crate::batch::square::reader::{Item, MergedReader, StreamError};

/// A mixture reader's items: block after block, each source's share of the block in source
/// order, each source read as its own sequential stream.
pub(super) struct MixedReader {
    streams: Vec<MergedReader>,
    sources: usize,
    block_counts: Vec<u32>,
    /// Position in `block_counts`, and items still to take there.
    at: usize,
    left: u32,
}

impl MixedReader {
    /// The mixture of `streams` (one a source), `block_counts[b * sources + i]` items of
    /// source i in block b.
    pub(super) fn new(streams: Vec<MergedReader>, block_counts: Vec<u32>) -> Self {
        Self {
            sources: streams.len(),
            streams,
            block_counts,
            at: 0,
            left: 0,
        }
    }

    pub(super) fn next(&mut self) -> Result<Option<Item>, StreamError> {
        while self.left == 0 {
            let Some(&count) = self.block_counts.get(self.at) else {
                return Ok(None);
            };
            self.left = count;
            self.at += 1;
        }
        self.left -= 1;
        let source = (self.at - 1) % self.sources;
        match self.streams[source].next()? {
            Some(item) => Ok(Some(item)),
            // A planned stream holds exactly its blocks' counts (holes included): running out
            // early means its reader was lost.
            None => Err(StreamError::ReaderLost(Some(format!(
                "source {source}'s stream ended before its planned samples"
            )))),
        }
    }
}
