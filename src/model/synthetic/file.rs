//! Writing a synthetic model to a file: into `FILE.part`, renamed to `FILE` once complete and
//! synced, the partial file removed on any error.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, ErrorKind};
use std::path::{Path, PathBuf};

use super::{SynthError, SyntheticSpec, synthetic_layout, write_laid_out};

/// Where the file is written before it is complete: `path` with `.part` appended.
pub fn part_path(path: &Path) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// Bytes free to an unprivileged user on the file system holding `dir`, when it can be asked.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path; `st` is written by statvfs before it is read.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // The field types differ between platforms.
    #[allow(clippy::unnecessary_cast)]
    let (blocks, block_size) = (st.f_bavail as u64, st.f_frsize as u64);
    blocks.checked_mul(block_size)
}

/// True for the errors that mean "no room left" (a full disk or an exhausted quota).
fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
        || matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The error for a failed write of `path` after `written` of `total` bytes.
fn write_error(path: &Path, e: std::io::Error, written: u64, total: u64) -> SynthError {
    let path = path.to_path_buf();
    if is_disk_full(&e) {
        SynthError::DiskFull {
            path,
            written,
            total,
        }
    } else {
        SynthError::Write {
            path,
            written,
            total,
            source: e,
        }
    }
}

/// Write the model for `spec` and `seed` to `path` (replacing it), `threads` blocks of rows at
/// a time, calling `progress(done, total)` as bytes are written. Returns the file size.
///
/// Fails before writing anything when the spec is invalid, the weight type has no quantizer or
/// the file system has less free space than the file needs.
pub fn write_synthetic_file(
    spec: &SyntheticSpec,
    seed: u64,
    threads: usize,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, SynthError> {
    let layout = synthetic_layout(spec)?;
    super::weights::check_quantizer(spec.weight_type)?;
    let total = layout.file_size;
    let part = part_path(path);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Some(available) = free_bytes(dir)
        && available < total
    {
        return Err(SynthError::NoSpace {
            path: path.to_path_buf(),
            needed: total,
            available,
        });
    }
    let file = File::create(&part).map_err(|source| SynthError::Create {
        path: part.clone(),
        source,
    })?;
    let mut written = 0u64;
    let result = (|| -> Result<(), SynthError> {
        let out = BufWriter::with_capacity(1 << 20, file);
        let out = write_laid_out(spec, &layout, seed, threads, out, &mut |done, total| {
            written = done;
            progress(done, total);
        })?;
        let file = out
            .into_inner()
            .map_err(|e| SynthError::Io(e.into_error()))?;
        file.sync_all().map_err(SynthError::Io)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        return Err(match e {
            SynthError::Io(e) => write_error(path, e, written, total),
            other => other,
        });
    }
    if let Err(source) = std::fs::rename(&part, path) {
        let _ = std::fs::remove_file(&part);
        return Err(SynthError::Rename {
            from: part,
            to: path.to_path_buf(),
            source,
        });
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_path_appends() {
        assert_eq!(part_path(Path::new("a/b.gguf")), Path::new("a/b.gguf.part"));
        assert_eq!(part_path(Path::new("m")), Path::new("m.part"));
    }

    #[test]
    fn full_disk_errors_say_so() {
        let p = Path::new("/x/m.gguf");
        for e in [
            std::io::Error::from_raw_os_error(libc::ENOSPC),
            std::io::Error::from_raw_os_error(libc::EDQUOT),
            std::io::Error::from(ErrorKind::StorageFull),
        ] {
            let msg = write_error(p, e, 1 << 20, 3 << 30).to_string();
            assert!(msg.contains("/x/m.gguf: the disk is full"), "{msg}");
            assert!(msg.contains("1 MiB") && msg.contains("3 GiB"), "{msg}");
            assert!(msg.contains("partial file was removed"), "{msg}");
        }
        let msg = write_error(p, std::io::Error::from_raw_os_error(libc::EIO), 0, 10).to_string();
        assert!(msg.starts_with("writing /x/m.gguf failed"), "{msg}");
    }

    #[test]
    fn free_space_is_known_here() {
        let dir = std::env::temp_dir();
        assert!(free_bytes(&dir).is_some_and(|n| n > 0));
        assert_eq!(free_bytes(Path::new("/no/such/dir/at/all")), None);
    }
}
