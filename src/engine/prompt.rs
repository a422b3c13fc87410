//! What a sequence is asked to continue: its tokens, and what else decides
//! whether another sequence's cached K/V may stand in for them.
//!
//! Two prompts with equal tokens can still differ: an image behind the same
//! placeholder tokens, or a client who must not share cache with others (a
//! cache salt, as vLLM's `cache_salt`). Both reach the prefix cache as
//! extra keys of the blocks they cover, so equal tokens alone never match.

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// A run of prompt positions `[start, start + len)` that stands for
/// content the tokens do not name (an image's embeddings), known by the
/// hash of that content. Its rows run in one step ([`media_aligned`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MediaSpan {
    pub start: usize,
    pub len: usize,
    pub hash: u64,
    /// What the model's encoder computes the span's input vectors from.
    pub pixels: Pixels,
}

/// An image's pixel values as its model's processor made them,
/// channel-major `[3, height, width]`; shared, not copied, by the
/// sequences of one request.
#[derive(Clone, Default, PartialEq)]
pub struct Pixels {
    pub values: Arc<[f32]>,
    pub height: usize,
    pub width: usize,
}

impl Pixels {
    pub fn new(values: Vec<f32>, height: usize, width: usize) -> Self {
        Pixels {
            values: values.into(),
            height,
            width,
        }
    }

    /// The hash of the values, which keys a span's blocks in the prefix
    /// cache and its encoder output.
    pub fn content_hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        (self.height, self.width).hash(&mut h);
        for v in self.values.iter() {
            v.to_bits().hash(&mut h);
        }
        h.finish()
    }
}

impl fmt::Debug for Pixels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Pixels({} x {} x {})",
            self.values.len() / (self.height * self.width).max(1),
            self.height,
            self.width
        )
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prompt {
    pub tokens: Vec<u32>,
    pub media: Vec<MediaSpan>,
    /// Sequences share cached blocks only with sequences of the same salt.
    pub cache_salt: Option<String>,
}

impl From<Vec<u32>> for Prompt {
    fn from(tokens: Vec<u32>) -> Self {
        Prompt {
            tokens,
            ..Prompt::default()
        }
    }
}

/// `chunk` prompt positions from `from`, moved so that it cuts no media
/// span and reaches no image whose features are not `ready`: an image's
/// tokens may attend to each other both ways, so the rows of a span run
/// in one step. A chunk stops before the first span not ready (at `from`,
/// so 0, where that span began before it). A chunk ending inside a span
/// ends before it instead; where the span begins at `from` (or began
/// before it, its start cached), the chunk takes the span to its end,
/// past the step's budget by less than one span.
pub fn media_aligned(
    media: &[MediaSpan],
    from: usize,
    chunk: usize,
    ready: &dyn Fn(u64) -> bool,
) -> usize {
    let unready = media
        .iter()
        .filter(|m| m.start + m.len > from && !ready(m.hash))
        .map(|m| m.start.max(from))
        .min();
    let chunk = unready.map_or(chunk, |start| chunk.min(start - from));
    let end = from + chunk;
    let cut = media
        .iter()
        .find(|m| m.start < end && end < m.start + m.len);
    match cut {
        _ if chunk == 0 => 0,
        None => chunk,
        Some(m) if m.start > from => m.start - from,
        Some(m) => m.start + m.len - from,
    }
}

/// What a prompt adds to its blocks' hashes, kept by its sequence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockKeys {
    media: Vec<MediaSpan>,
    /// The salt's hash, keyed into the first block: every later block's
    /// hash chains from it.
    salt: Option<u64>,
}

impl BlockKeys {
    pub fn new(media: Vec<MediaSpan>, cache_salt: Option<&str>) -> Self {
        let salt = cache_salt.map(|s| {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        });
        BlockKeys { media, salt }
    }

    /// The prompt's media spans.
    pub fn media(&self) -> &[MediaSpan] {
        &self.media
    }

    /// The extra keys of block `i` of `block_size` positions: the salt for
    /// the first, and the content hash of each media span it overlaps.
    /// Empty for a plain prompt, whose hashes are then its tokens' alone.
    pub fn of_block(&self, i: usize, block_size: usize) -> Vec<u64> {
        let (from, to) = (i * block_size, (i + 1) * block_size);
        let salt = self.salt.filter(|_| i == 0);
        let media = self
            .media
            .iter()
            .filter(|m| m.start < to && from < m.start + m.len)
            .map(|m| m.hash);
        salt.into_iter().chain(media).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_prompt_adds_no_keys() {
        let keys = BlockKeys::default();
        assert!((0..4).all(|i| keys.of_block(i, 16).is_empty()));
    }

    #[test]
    fn the_salt_keys_the_first_block_only() {
        let a = BlockKeys::new(Vec::new(), Some("tenant-a"));
        let b = BlockKeys::new(Vec::new(), Some("tenant-b"));
        assert_eq!(a.of_block(0, 16).len(), 1);
        assert_ne!(a.of_block(0, 16), b.of_block(0, 16));
        assert_eq!(
            a.of_block(0, 16),
            BlockKeys::new(Vec::new(), Some("tenant-a")).of_block(0, 16)
        );
        assert!(a.of_block(1, 16).is_empty());
    }

    fn span(start: usize, len: usize, hash: u64) -> MediaSpan {
        MediaSpan {
            start,
            len,
            hash,
            pixels: Pixels::default(),
        }
    }

    /// Chunks end before a span or take it whole; a span never ends up
    /// cut, whatever the chunk asked for.
    #[test]
    fn chunks_never_cut_a_span() {
        let media = [span(10, 8, 1), span(20, 4, 2)];
        let all = |_| true;
        // Clear of the spans, or ending at their edges: as asked.
        assert_eq!(media_aligned(&media, 0, 10, &all), 10);
        assert_eq!(media_aligned(&media, 0, 18, &all), 18);
        assert_eq!(media_aligned(&media, 0, 19, &all), 19);
        // Ending inside one: before it.
        assert_eq!(media_aligned(&media, 0, 12, &all), 10);
        assert_eq!(media_aligned(&media, 5, 17, &all), 15);
        // Starting at one, or inside one whose start is cached: to its end.
        assert_eq!(media_aligned(&media, 10, 3, &all), 8);
        assert_eq!(media_aligned(&media, 12, 1, &all), 6);
        assert_eq!(media_aligned(&media, 20, 1, &all), 4);
        // Sitting out stays sitting out.
        assert_eq!(media_aligned(&media, 10, 0, &all), 0);
        for from in 0..30 {
            for chunk in 1..30 {
                let end = from + media_aligned(&media, from, chunk, &all);
                assert!(
                    media
                        .iter()
                        .all(|m| end <= m.start || end >= m.start + m.len),
                    "{from} + {chunk} ends at {end}"
                );
            }
        }
    }

    /// A chunk stops before an image not encoded yet, and takes one that
    /// is as it would have.
    #[test]
    fn chunks_stop_before_an_image_not_ready() {
        let media = [span(10, 8, 1), span(20, 4, 2)];
        let first_ready = |h| h == 1;
        let none_ready = |_| false;
        // Text before the image runs; the image and past it wait.
        assert_eq!(media_aligned(&media, 0, 30, &none_ready), 10);
        assert_eq!(media_aligned(&media, 0, 6, &none_ready), 6);
        assert_eq!(media_aligned(&media, 10, 30, &none_ready), 0);
        // Inside a span whose start is cached: it waits whole.
        assert_eq!(media_aligned(&media, 12, 30, &none_ready), 0);
        // The first ready: through it, up to the second.
        assert_eq!(media_aligned(&media, 0, 30, &first_ready), 20);
        assert_eq!(media_aligned(&media, 10, 1, &first_ready), 8);
        assert_eq!(media_aligned(&media, 18, 30, &first_ready), 2);
        // Past both spans nothing waits.
        assert_eq!(media_aligned(&media, 24, 5, &none_ready), 5);
    }

    #[test]
    fn a_span_keys_every_block_it_overlaps() {
        let span = MediaSpan {
            start: 10,
            len: 20,
            hash: 99,
            pixels: Pixels::default(),
        };
        let keys = BlockKeys::new(vec![span], None);
        // Blocks of 8: positions 10..30 touch blocks 1, 2 and 3.
        let keyed: Vec<usize> = (0..5)
            .filter(|&i| !keys.of_block(i, 8).is_empty())
            .collect();
        assert_eq!(keyed, vec![1, 2, 3]);
        assert_eq!(keys.of_block(2, 8), vec![99]);
    }
}
