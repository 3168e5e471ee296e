//! Platform primitives under the flash reader: the direct-I/O alignment ([`DIRECT_ALIGN`]) and
//! aligned bounce buffers ([`AlignedBuf`], reused through an [`AlignedPool`]), file identity (to notice a replaced file),
//! positional `pread`, and opening a file with the page cache bypassed.

use std::fs::File;
use std::io;
use std::path::Path;

use super::FlashError;

/// Alignment of offsets, lengths and addresses for direct I/O.
pub const DIRECT_ALIGN: usize = 4096;

/// A heap buffer aligned for direct I/O.
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain owned memory; access goes through &self / &mut self.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> io::Result<Self> {
        let len = len.max(DIRECT_ALIGN).next_multiple_of(DIRECT_ALIGN);
        let layout = std::alloc::Layout::from_size_align(len, DIRECT_ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("allocating a {len}-byte bounce buffer failed"),
            )
        })?;
        Ok(Self { ptr, layout })
    }
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `len` initialized (zeroed) bytes, borrowed mutably through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Aligned buffers kept for reuse, so that hot paths neither allocate nor zero one per use:
/// [`AlignedPool::take`] hands out one of at least the asked length (its contents stale: the
/// caller overwrites what it reads), and it comes back when the [`PooledBuf`] drops. The pool
/// keeps the `keep` largest.
#[derive(Clone)]
pub(crate) struct AlignedPool {
    bufs: std::sync::Arc<std::sync::Mutex<Vec<AlignedBuf>>>,
    keep: usize,
}

impl AlignedPool {
    pub(crate) fn new(keep: usize) -> Self {
        Self {
            bufs: Default::default(),
            keep,
        }
    }

    pub(crate) fn take(&self, len: usize) -> io::Result<PooledBuf> {
        let mut bufs = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        let found = bufs
            .iter()
            .position(|b| b.len() >= len)
            .map(|i| bufs.swap_remove(i));
        drop(bufs);
        let buf = match found {
            Some(b) => b,
            None => AlignedBuf::new(len)?,
        };
        Ok(PooledBuf {
            buf: Some(buf),
            pool: self.clone(),
        })
    }

    fn give(&self, b: AlignedBuf) {
        let mut bufs = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        if bufs.len() < self.keep {
            bufs.push(b);
        } else if let Some(i) = (0..bufs.len()).min_by_key(|&i| bufs[i].len())
            && bufs[i].len() < b.len()
        {
            bufs[i] = b;
        }
    }
}

/// A buffer of an [`AlignedPool`], back in it when dropped.
pub(crate) struct PooledBuf {
    buf: Option<AlignedBuf>,
    pool: AlignedPool,
}

impl PooledBuf {
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_mut().map_or(&mut [], |b| b.as_mut_slice())
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give(b);
        }
    }
}

/// File identity at open time, to notice replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    dev: u64,
    ino: u64,
}

pub(super) fn identity(m: &std::fs::Metadata) -> Option<Identity> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some(Identity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        None
    }
}

/// Positional read that does not move a shared file cursor (safe from many threads).
pub(super) fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    loop {
        #[cfg(unix)]
        let r = {
            use std::os::unix::fs::FileExt;
            file.read_at(buf, offset)
        };
        #[cfg(windows)]
        let r = {
            use std::os::windows::fs::FileExt;
            file.seek_read(buf, offset)
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

pub(super) fn einval() -> i32 {
    #[cfg(unix)]
    {
        libc::EINVAL
    }
    #[cfg(not(unix))]
    {
        // ERROR_INVALID_PARAMETER
        87
    }
}

/// Open for reading with the page cache bypassed.
pub(super) fn open_direct(path: &Path) -> Result<File, FlashError> {
    let unsupported = |reason: String| FlashError::DirectUnsupported {
        path: path.to_path_buf(),
        reason,
    };
    let io_err = |source: io::Error| FlashError::Io {
        op: "opening",
        path: path.to_path_buf(),
        offset: 0,
        source,
    };
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => Ok(f),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                Err(unsupported(format!("opening with O_DIRECT failed: {e}")))
            }
            Err(e) => Err(io_err(e)),
        }
    }
    #[cfg(any(target_os = "macos", target_os = "ios"))]
    {
        use std::os::unix::io::AsRawFd;
        let f = File::open(path).map_err(io_err)?;
        // SAFETY: fcntl on a descriptor we own, with an integer argument.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) };
        if r == -1 {
            return Err(unsupported(format!(
                "fcntl(F_NOCACHE) failed: {}",
                io::Error::last_os_error()
            )));
        }
        Ok(f)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::OpenOptionsExt;
        const FILE_FLAG_NO_BUFFERING: u32 = 0x2000_0000;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(FILE_FLAG_NO_BUFFERING)
            .open(path)
        {
            Ok(f) => Ok(f),
            Err(e) if e.raw_os_error() == Some(87) => Err(unsupported(format!(
                "opening with FILE_FLAG_NO_BUFFERING failed: {e}"
            ))),
            Err(e) => Err(io_err(e)),
        }
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
        let _ = io_err;
        Err(unsupported("not implemented on this platform".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        let mut b = AlignedBuf::new(5000).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_mut_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
    }

    #[test]
    fn pooled_buffers_are_aligned_reused_and_bounded() {
        let pool = AlignedPool::new(2);
        let mut a = pool.take(100_000).unwrap();
        assert!(a.as_mut_slice().len() >= 100_000);
        assert_eq!(a.as_mut_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
        a.as_mut_slice()[0] = 7;
        let pa = a.as_mut_slice().as_ptr() as usize;
        drop(a);
        // A smaller request reuses the buffer (its bytes are stale, not zeroed).
        let mut b = pool.take(5000).unwrap();
        assert_eq!(b.as_mut_slice().as_ptr() as usize, pa);
        assert_eq!(b.as_mut_slice()[0], 7);
        // A larger one allocates.
        let mut c = pool.take(300_000).unwrap();
        assert!(c.as_mut_slice().len() >= 300_000);
        let d = pool.take(10).unwrap();
        drop((b, c, d));
        // The pool keeps its two largest.
        let kept: Vec<usize> = pool.bufs.lock().unwrap().iter().map(|b| b.len()).collect();
        assert_eq!(kept.len(), 2);
        assert!(kept.iter().any(|&n| n >= 300_000));
        assert!(kept.iter().all(|&n| n >= 100_000));
    }
}
