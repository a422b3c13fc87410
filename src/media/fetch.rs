//! Image bytes a request names by URL instead of carrying them: an
//! `http(s)` URL on a host the operator allows, or a `file:` URL under the
//! directory the operator allows (vLLM's `--allowed-media-domains` and
//! `--allowed-local-media-path`). Both are off unless configured. One
//! request's fetches share a deadline, each is capped in bytes, and a
//! redirect is followed only on the same host, so an allowed host cannot
//! send the server elsewhere.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use url::Url;

/// What was fetched for a request, by URL: its bytes, or why not (a
/// client error, read as the image's).
pub type Fetched = BTreeMap<String, Result<Vec<u8>, String>>;

/// A request that names no URL to fetch.
pub static NOTHING_FETCHED: Fetched = BTreeMap::new();

/// Redirects one fetch follows, each on the URL's own host.
const MAX_REDIRECTS: usize = 3;

/// Where images may be read from, beyond the request itself.
#[derive(Debug, Clone)]
pub struct MediaAccess {
    /// Hosts an `http(s)` URL may name, lower case; none: no fetching.
    domains: Vec<String>,
    /// The directory (canonical) a `file:` URL's file must be under.
    local_root: Option<PathBuf>,
    /// How long one request's fetches may take together.
    timeout: Duration,
    agent: ureq::Agent,
}

/// Where a URL's bytes come from, once it is known to be allowed.
enum Source {
    Http(Url),
    File(PathBuf),
}

impl MediaAccess {
    /// `domains` empty and `local_root` none: every URL but `data:` is
    /// refused. The root must exist.
    pub fn new(
        domains: &[String],
        local_root: Option<&Path>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let local_root = local_root
            .map(|root| {
                root.canonicalize()
                    .with_context(|| format!("--allowed-local-media-path {}", root.display()))
            })
            .transpose()?;
        let agent = ureq::AgentBuilder::new()
            // Followed by hand, after checking each target's host.
            .redirects(0)
            .user_agent(concat!("wick/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(MediaAccess {
            domains: domains
                .iter()
                .map(|d| d.trim().to_ascii_lowercase())
                .filter(|d| !d.is_empty())
                .collect(),
            local_root,
            timeout,
            agent,
        })
    }

    /// Refuses every URL but `data:`.
    pub fn none() -> Self {
        Self::new(&[], None, Duration::ZERO).expect("no root to check")
    }

    /// Fetches each URL (none a `data:` URL), within the request's
    /// deadline and `max_bytes` each. Blocks: run it off the async
    /// runtime.
    pub fn fetch_all(&self, urls: &[String], max_bytes: usize) -> Fetched {
        let deadline = Instant::now() + self.timeout;
        urls.iter()
            .map(|url| {
                let got = self
                    .source(url)
                    .and_then(|source| self.read(source, max_bytes, deadline));
                (url.clone(), got)
            })
            .collect()
    }

    /// The URL, if this server may read it; else why not.
    fn source(&self, url: &str) -> Result<Source, String> {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        let scheme = scheme.to_ascii_lowercase();
        let fetching = !self.domains.is_empty();
        match scheme.as_str() {
            "http" | "https" if !fetching => {
                return Err(
                    "fetching image URLs is not enabled on this server: send the \
                            image inline as a data: URL (data:image/png;base64,...)"
                        .into(),
                )
            }
            "file" if self.local_root.is_none() => {
                return Err(
                    "reading local image files is not enabled on this server: send \
                            the image inline as a data: URL (data:image/png;base64,...)"
                        .into(),
                )
            }
            "http" | "https" | "file" => {}
            _ => {
                let also = match (fetching, self.local_root.is_some()) {
                    (true, true) => ", an http(s): URL or a file: URL",
                    (true, false) => " or an http(s): URL",
                    (false, true) => " or a file: URL",
                    (false, false) => "",
                };
                return Err(format!(
                    "an image URL must be a data: URL (data:image/png;base64,...){also}"
                ));
            }
        }
        let parsed = Url::parse(url).map_err(|e| format!("the image URL is invalid: {e}"))?;
        if scheme == "file" {
            return self.local_path(&parsed).map(Source::File);
        }
        self.check_host(&parsed)?;
        Ok(Source::Http(parsed))
    }

    fn check_host(&self, url: &Url) -> Result<(), String> {
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        if self.domains.contains(&host) {
            return Ok(());
        }
        Err(format!(
            "this server does not fetch images from {host:?}; the hosts it fetches from are \
             set by --allowed-media-domains"
        ))
    }

    /// The file a `file:` URL names, if it is under the root: the path's
    /// `..` segments are resolved by URL parsing and its links by
    /// canonicalizing, and both forms must be under the root, so the
    /// answer tells nothing of files elsewhere.
    fn local_path(&self, url: &Url) -> Result<PathBuf, String> {
        let root = self.local_root.as_deref().unwrap_or(Path::new("/"));
        let outside = || {
            format!(
                "the file is not under {}, the directory this server reads images from",
                root.display()
            )
        };
        let path = url.to_file_path().map_err(|()| outside())?;
        if !path.starts_with(root) {
            return Err(outside());
        }
        let real = path
            .canonicalize()
            .map_err(|e| format!("the image file cannot be read: {e}"))?;
        if !real.starts_with(root) {
            return Err(outside());
        }
        Ok(real)
    }

    fn read(&self, source: Source, max_bytes: usize, deadline: Instant) -> Result<Vec<u8>, String> {
        match source {
            Source::File(path) => {
                // Checked before opening: opening a FIFO would wait for a
                // writer.
                if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                    return Err("the image URL names no regular file".into());
                }
                let file =
                    std::fs::File::open(&path).map_err(|e| format!("the image file: {e}"))?;
                capped(file, max_bytes).map_err(|e| format!("the image file: {e}"))
            }
            Source::Http(url) => self.http(url, max_bytes, deadline),
        }
    }

    fn http(&self, mut url: Url, max_bytes: usize, deadline: Instant) -> Result<Vec<u8>, String> {
        let asked = url.to_string();
        let failed = |why: String| format!("fetching the image from {asked} failed: {why}");
        for _ in 0..=MAX_REDIRECTS {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(failed(format!(
                    "the server's {} s for fetching a request's images ran out",
                    self.timeout.as_secs_f32()
                )));
            }
            let response = match self.agent.request_url("GET", &url).timeout(left).call() {
                Ok(r) => r,
                Err(ureq::Error::Status(code, _)) => {
                    return Err(failed(format!("it answered HTTP {code}")))
                }
                Err(e) => return Err(failed(e.to_string())),
            };
            if (300..400).contains(&response.status()) {
                let next = response
                    .header("location")
                    .and_then(|to| url.join(to).ok())
                    .ok_or_else(|| failed("a redirect without a valid Location".into()))?;
                if next.host_str() != url.host_str() {
                    return Err(failed(format!(
                        "it redirects to another host ({}), which this server does not follow",
                        next.host_str().unwrap_or_default()
                    )));
                }
                url = next;
                continue;
            }
            let declared = response.header("content-length");
            if declared.and_then(|n| n.parse::<u64>().ok()) > Some(max_bytes as u64) {
                return Err(too_big(max_bytes));
            }
            return capped(response.into_reader(), max_bytes).map_err(|e| failed(e.to_string()));
        }
        Err(failed(format!("more than {MAX_REDIRECTS} redirects")))
    }
}

/// Reads at most `max_bytes`; more is an error, found by reading one
/// byte past the cap, not the whole.
fn capped(reader: impl Read, max_bytes: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader.take(max_bytes as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max_bytes {
        return Err(std::io::Error::other(too_big(max_bytes)));
    }
    Ok(bytes)
}

fn too_big(max_bytes: usize) -> String {
    format!("the image is over the limit of {max_bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(access: &MediaAccess, url: &str) -> String {
        match access.source(url) {
            Ok(_) => panic!("{url} was allowed"),
            Err(e) => e,
        }
    }

    #[test]
    fn only_allowed_hosts_and_paths_are_read() {
        let none = MediaAccess::none();
        for (url, says) in [
            (
                "https://example.com/a.png",
                "fetching image URLs is not enabled",
            ),
            (
                "file:///etc/passwd",
                "reading local image files is not enabled",
            ),
            ("ftp://example.com/a.png", "must be a data: URL (data:"),
        ] {
            let e = refusal(&none, url);
            assert!(e.contains(says), "{url}: {e}");
        }

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("images");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("a.png"), b"png").unwrap();
        std::fs::write(dir.path().join("secret.png"), b"secret").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("secret.png"), root.join("link.png")).unwrap();
        let some = MediaAccess::new(
            &["Example.com".to_string()],
            Some(&root),
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(matches!(
            some.source("https://EXAMPLE.com:8443/a.png"),
            Ok(Source::Http(_))
        ));
        let root = root.canonicalize().unwrap();
        let file_url = |p: &Path| Url::from_file_path(p).unwrap().to_string();
        match some.source(&file_url(&root.join("a.png"))) {
            Ok(Source::File(p)) => assert_eq!(p, root.join("a.png")),
            _ => panic!("a file under the root was refused"),
        }
        let escapes = [
            format!("{}/../secret.png", file_url(&root)),
            file_url(&root.join("link.png")),
            "file:///etc/passwd".to_string(),
        ];
        for url in escapes.iter().filter(|u| cfg!(unix) || !u.contains("link")) {
            let e = refusal(&some, url);
            assert!(e.contains("is not under"), "{url}: {e}");
        }
        // Read: a file, capped; not a directory (nor a FIFO, which would
        // block the open).
        let read = |url: String| {
            some.fetch_all(std::slice::from_ref(&url), 4)
                .remove(&url)
                .unwrap()
        };
        assert_eq!(read(file_url(&root.join("a.png"))).unwrap(), b"png");
        let sub = root.join("sub");
        std::fs::create_dir(&sub).unwrap();
        let e = read(file_url(&sub)).unwrap_err();
        assert!(e.contains("no regular file"), "{e}");
        std::fs::write(root.join("big.png"), b"12345").unwrap();
        let e = read(file_url(&root.join("big.png"))).unwrap_err();
        assert!(e.contains("over the limit of 4 bytes"), "{e}");
        for (url, says) in [
            (
                "https://example.com.evil.net/a.png",
                "does not fetch images from",
            ),
            ("https://example.com@evil.net/a.png", "\"evil.net\""),
            (
                "https://evil.net/?example.com",
                "does not fetch images from",
            ),
            ("ftp://example.com/a.png", "an http(s): URL or a file: URL"),
        ] {
            let e = refusal(&some, url);
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn reads_are_capped() {
        assert_eq!(capped(&b"12345"[..], 5).unwrap(), b"12345");
        let e = capped(&b"123456"[..], 5).unwrap_err();
        assert!(e.to_string().contains("over the limit of 5 bytes"), "{e}");
    }
}
