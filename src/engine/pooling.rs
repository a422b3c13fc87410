//! Embeddings: an embedding request is a prompt that is prefilled like any
//! other (chunked, batched with generating rows) but samples nothing; the
//! final hidden states of its rows are pooled into one vector as its
//! chunks go by, and the vector is L2-normalised when the prompt is done.

use crate::models::LogitRows;

/// How a sequence's final hidden states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Pooling {
    /// The mean over every token.
    #[default]
    Mean,
    /// The last token's (what decoder embedding models such as
    /// Qwen3-Embedding are trained for).
    Last,
    /// The first token's (BERT's `[CLS]` convention).
    Cls,
}

/// A pooled vector in the making.
#[derive(Debug, Clone)]
pub struct Pool {
    pub pooling: Pooling,
    sum: Vec<f32>,
    rows: usize,
}

impl Pool {
    pub fn new(pooling: Pooling) -> Self {
        Pool {
            pooling,
            sum: Vec::new(),
            rows: 0,
        }
    }

    /// The hidden rows a chunk of `chunk` tokens from position `first`
    /// hands over, of a prompt of `len` tokens.
    pub fn rows_wanted(&self, first: usize, chunk: usize, len: usize) -> LogitRows {
        match self.pooling {
            Pooling::Mean => LogitRows::All,
            Pooling::Last if first + chunk == len => LogitRows::Last,
            Pooling::Cls if first == 0 => LogitRows::All,
            Pooling::Last | Pooling::Cls => LogitRows::None,
        }
    }

    /// Takes a chunk's rows (those [`Pool::rows_wanted`] asked for).
    pub fn add(&mut self, rows: &[Vec<f32>]) {
        let rows = match self.pooling {
            Pooling::Cls => &rows[..rows.len().min(1)],
            Pooling::Mean | Pooling::Last => rows,
        };
        for row in rows {
            if self.sum.is_empty() {
                self.sum = vec![0.0; row.len()];
            }
            self.sum.iter_mut().zip(row).for_each(|(s, x)| *s += x);
            self.rows += 1;
        }
    }

    /// The pooled vector, L2-normalised (the mean's scale cancels out).
    pub fn finish(self) -> Vec<f32> {
        let norm = self.sum.iter().map(|x| x * x).sum::<f32>().sqrt();
        let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        self.sum.into_iter().map(|x| x * inv).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt of 5 in chunks of 3 and 2: mean takes every row, last only
    /// the final chunk's last, cls only the first chunk's first; each ends
    /// normalised in the direction of its rows.
    #[test]
    fn pools_across_chunks() {
        let chunks = [
            vec![vec![1.0, 0.0], vec![1.0, 2.0], vec![0.0, 1.0]],
            vec![vec![3.0, 0.0], vec![0.0, 4.0]],
        ];
        let run = |pooling| {
            let mut p = Pool::new(pooling);
            for (first, rows) in [(0, &chunks[0]), (3, &chunks[1])] {
                let take = match p.rows_wanted(first, rows.len(), 5) {
                    LogitRows::All => rows.clone(),
                    LogitRows::Last => vec![rows.last().unwrap().clone()],
                    LogitRows::None => Vec::new(),
                };
                p.add(&take);
            }
            p.finish()
        };
        // Mean of all five: (5, 7) / 5, normalised.
        let n = (25.0f32 + 49.0).sqrt();
        assert_eq!(run(Pooling::Mean), vec![5.0 / n, 7.0 / n]);
        assert_eq!(run(Pooling::Last), vec![0.0, 1.0]);
        assert_eq!(run(Pooling::Cls), vec![1.0, 0.0]);
        assert!(Pool::new(Pooling::Mean).finish().is_empty());
    }
}
