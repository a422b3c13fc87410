//! A GGUF published in parts by llama.cpp's `llama-gguf-split`
//! (`NAME-00001-of-00003.gguf`, ...), read as one file: the first part
//! holds the metadata, every part some of the tensors. The parts are laid
//! end to end in one address space ([`SplitReader`]), and each part's
//! tensor offsets are moved onto it (`Gguf::merge`), so the loaders read a
//! split model as they read a single file.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// `(part, parts)` of a split GGUF's file name, e.g. `(1, 3)`.
pub fn part_of(path: &Path) -> Option<(usize, usize)> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let stem = name.strip_suffix(".gguf")?;
    let (head, total) = stem.rsplit_once("-of-")?;
    let part = head.get(head.len().checked_sub(5)?..)?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(part) && digits(total) && head.as_bytes().get(head.len() - 6) == Some(&b'-'))
        .then(|| Some((part.parse().ok()?, total.parse().ok()?)))?
}

/// Every part's path, given the first's; `None` if `path` is not the
/// first part of a split GGUF. A missing part is an error naming it.
pub fn parts(path: &Path) -> Result<Option<Vec<PathBuf>>> {
    let Some((1, total)) = part_of(path) else {
        if let Some((part, total)) = part_of(path) {
            bail!(
                "{} is part {part} of {total} of a split GGUF: pass the first part, -00001-of-{total:05}",
                path.display()
            );
        }
        return Ok(None);
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .context("a file name")?;
    let first = format!("-00001-of-{total:05}");
    let at = name
        .to_ascii_lowercase()
        .rfind(&first)
        .context("the part number")?;
    let parts: Vec<PathBuf> = (1..=total)
        .map(|k| {
            let part = format!(
                "{}-{k:05}-of-{total:05}{}",
                &name[..at],
                &name[at + first.len()..]
            );
            path.with_file_name(part)
        })
        .collect();
    if let Some(missing) = parts.iter().find(|p| !p.is_file()) {
        bail!(
            "{} is split into {total} parts, and part {} is missing",
            path.display(),
            missing.display()
        );
    }
    Ok(Some(parts))
}

/// The parts as one file: part `k`'s bytes at `starts[k]..starts[k + 1]`.
/// A read stops at the end of a part: no tensor spans two.
pub struct SplitReader {
    files: Vec<BufReader<File>>,
    starts: Vec<u64>,
    pos: u64,
}

impl SplitReader {
    /// The parts, in order, each from its start.
    pub fn new(files: Vec<File>) -> io::Result<Self> {
        let mut starts = vec![0];
        for f in &files {
            starts.push(starts.last().copied().unwrap_or(0) + f.metadata()?.len());
        }
        Ok(SplitReader {
            files: files.into_iter().map(BufReader::new).collect(),
            starts,
            pos: 0,
        })
    }

    /// Where part `k` starts in the joined file.
    pub fn start(&self, k: usize) -> u64 {
        self.starts[k]
    }

    fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }
}

impl Read for SplitReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.len() || buf.is_empty() {
            return Ok(0);
        }
        // The part holding `pos`: the last that starts at or before it.
        let k = self.starts.partition_point(|&s| s <= self.pos) - 1;
        let left = (self.starts[k + 1] - self.pos).min(buf.len() as u64) as usize;
        let f = &mut self.files[k];
        f.seek(SeekFrom::Start(self.pos - self.starts[k]))?;
        let n = f.read(&mut buf[..left])?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for SplitReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len().checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::other("seek before the start"))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_are_llama_gguf_splits() {
        let p = |s: &str| part_of(Path::new(s));
        assert_eq!(p("m-Q4_K_M-00001-of-00003.gguf"), Some((1, 3)));
        assert_eq!(p("dir/M-00003-of-00003.GGUF"), Some((3, 3)));
        assert_eq!(p("m-Q4_K_M.gguf"), None);
        assert_eq!(p("m00001-of-00003.gguf"), None);
        assert_eq!(p("m-0001-of-00003.gguf"), None);
    }

    #[test]
    fn the_parts_read_as_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let cuts = [0, 300, 301, 1000];
        let files: Vec<File> = cuts
            .windows(2)
            .enumerate()
            .map(|(k, w)| {
                let path = dir.path().join(format!("m-{:05}-of-00003.gguf", k + 1));
                std::fs::write(&path, &data[w[0]..w[1]]).unwrap();
                File::open(path).unwrap()
            })
            .collect();
        let mut r = SplitReader::new(files).unwrap();
        let mut all = Vec::new();
        r.read_to_end(&mut all).unwrap();
        assert_eq!(all, data);
        r.seek(SeekFrom::Start(295)).unwrap();
        let mut span = [0u8; 10];
        r.read_exact(&mut span).unwrap();
        assert_eq!(span, data[295..305], "a read across parts");
        assert_eq!(r.start(2), 301);
        let first = dir.path().join("m-00001-of-00003.gguf");
        assert_eq!(parts(&first).unwrap().unwrap().len(), 3);
        std::fs::remove_file(dir.path().join("m-00002-of-00003.gguf")).unwrap();
        assert!(format!("{:#}", parts(&first).unwrap_err()).contains("00002-of-00003"));
        let second = dir.path().join("m-00003-of-00003.gguf");
        assert!(format!("{:#}", parts(&second).unwrap_err()).contains("pass the first part"));
    }
}
