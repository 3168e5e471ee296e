//! Positional reads and writes for files that flashlm writes itself (the KV page file, saved
//! sessions): opening read-write with the page cache bypassed, and full-length `pwrite`/`pread`
//! loops that retry on interruption.
//!
//! Direct I/O needs 4 KiB-aligned offsets, lengths and addresses: callers pass
//! [`AlignedBuf`](super::AlignedBuf) memory and record-aligned offsets.

use std::fs::File;
use std::io;
use std::path::Path;

/// Open an existing file for reading and writing; with `direct`, bypassing the page cache
/// (O_DIRECT on Linux and FreeBSD, F_NOCACHE on macOS, FILE_FLAG_NO_BUFFERING and
/// FILE_FLAG_WRITE_THROUGH on Windows).
///
/// A filesystem that refuses direct I/O at open fails with [`io::ErrorKind::Unsupported`] or
/// the OS's invalid-argument error.
pub(crate) fn open_rw(path: &Path, direct: bool) -> io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true);
    if !direct {
        return o.open(path);
    }
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_DIRECT).open(path)
    }
    #[cfg(any(target_os = "macos", target_os = "ios"))]
    {
        use std::os::unix::io::AsRawFd;
        let f = o.open(path)?;
        // SAFETY: fcntl on a descriptor we own, with an integer argument.
        if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(f)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::OpenOptionsExt;
        const FILE_FLAG_NO_BUFFERING: u32 = 0x2000_0000;
        const FILE_FLAG_WRITE_THROUGH: u32 = 0x8000_0000;
        o.custom_flags(FILE_FLAG_NO_BUFFERING | FILE_FLAG_WRITE_THROUGH)
            .open(path)
    }
    #[cfg(not(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "macos",
        target_os = "ios",
        windows
    )))]
    {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "direct I/O is not implemented on this platform",
        ))
    }
}

/// Whether an I/O error means "the filesystem refuses direct I/O".
pub(crate) fn is_direct_refusal(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported || e.raw_os_error() == Some(super::einval())
}

fn write_at(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.write_at(buf, offset)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::FileExt;
        file.seek_write(buf, offset)
    }
}

/// Write all of `buf` at `offset` without moving a shared cursor (safe from many threads).
pub(crate) fn pwrite_all(file: &File, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match write_at(file, buf, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the file accepted no more bytes",
                ));
            }
            Ok(n) => {
                buf = &buf[n..];
                offset = offset.checked_add(n as u64).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "file offset overflows")
                })?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read into `buf` at `offset` until it is full or the file ends; returns the bytes read.
///
/// A read that ends off a 4 KiB boundary is taken as the end of the file (a direct read may
/// not go on from there, and regular files return short reads only at their end).
pub(crate) fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut got = 0usize;
    while got < buf.len() {
        let at = offset
            .checked_add(got as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "file offset overflows"))?;
        let n = super::pread(file, &mut buf[got..], at)?;
        got += n;
        if n == 0 || (got < buf.len() && n % super::DIRECT_ALIGN != 0) {
            break;
        }
    }
    Ok(got)
}
