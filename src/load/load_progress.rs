//! Load progress on a terminal: a 17 GiB GGUF takes minutes to read and
//! repack, and a silent terminal for that long looks hung.

use std::io::{self, IsTerminal, Read, Seek, SeekFrom};

use indicatif::{ProgressBar, ProgressStyle};

/// A GGUF reader that shows the bytes read and the tensors started on
/// stderr when it is a terminal (and nothing otherwise).
pub struct LoadProgress<R> {
    inner: R,
    bar: ProgressBar,
    tensors: usize,
    total_tensors: usize,
}

impl<R> LoadProgress<R> {
    /// `bytes`: the tensor data to read; `tensors`: how many tensors.
    pub fn new(inner: R, bytes: u64, tensors: usize) -> Self {
        let bar = match io::stderr().is_terminal() {
            true => ProgressBar::new(bytes),
            false => ProgressBar::hidden(),
        };
        if let Ok(style) = ProgressStyle::with_template(
            "loading {bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta}) {msg}",
        ) {
            bar.set_style(style);
        }
        LoadProgress {
            inner,
            bar,
            tensors: 0,
            total_tensors: tensors,
        }
    }
}

impl<R> Drop for LoadProgress<R> {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

impl<R: Read> Read for LoadProgress<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

/// The GGUF reader seeks once to each tensor's data before reading it, so
/// seeks count the tensors.
impl<R: Seek> Seek for LoadProgress<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.tensors = (self.tensors + 1).min(self.total_tensors);
        self.bar
            .set_message(format!("tensor {}/{}", self.tensors, self.total_tensors));
        self.inner.seek(pos)
    }
}
