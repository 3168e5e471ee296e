//! Reading tensor bytes, checked against the file's current size.
//!
//! A memory map does not notice its file shrinking: touching a page past the new end raises
//! `SIGBUS`. Each checked accessor here first asks the open file for its current length
//! (`fstat`, cheap), and [`GgufFile::read_at`] reads with `pread`, which reports a short read
//! instead of faulting even when the file shrinks during the copy.

use super::{Bytes, GgufError, GgufFile, TensorInfo, quant};

impl GgufFile {
    /// Fails when the file on disk is now shorter than when it was opened (truncated or
    /// rewritten in place). Always succeeds for in-memory files.
    pub fn check_file(&self) -> Result<(), GgufError> {
        let Bytes::Mapped { file, path, .. } = &self.bytes else {
            return Ok(());
        };
        let found = file
            .metadata()
            .map_err(|source| GgufError::Io {
                path: path.clone(),
                source,
            })?
            .len();
        if found < self.file_len {
            return Err(GgufError::FileShrunk {
                path: path.clone(),
                expected: self.file_len,
                found,
            });
        }
        Ok(())
    }

    /// `[offset, offset + len)` of the file, or an error when it is not within the file.
    fn range(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>, GgufError> {
        let bad = || GgufError::ReadOutOfBounds {
            offset,
            len,
            file_len: self.file_len,
        };
        let end = offset.checked_add(len).ok_or_else(bad)?;
        if end > self.file_len {
            return Err(bad());
        }
        let start = usize::try_from(offset).map_err(|_| bad())?;
        let end = usize::try_from(end).map_err(|_| bad())?;
        Ok(start..end)
    }

    /// Copies `dst.len()` bytes of the file at `offset` into `dst`.
    ///
    /// A mapped file is read with `pread`, not through the map, so a file truncated while
    /// open (even during this call) gives [`GgufError::FileShrunk`] and never a signal.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), GgufError> {
        let r = self.range(offset, dst.len() as u64)?;
        match &self.bytes {
            Bytes::Owned(v) => {
                let src = v.get(r).ok_or(GgufError::ReadOutOfBounds {
                    offset,
                    len: dst.len() as u64,
                    file_len: self.file_len,
                })?;
                dst.copy_from_slice(src);
                Ok(())
            }
            Bytes::Mapped { file, path, .. } => {
                read_file_at(file, path, offset, dst).map_err(|e| match e {
                    GgufError::Io { source, .. }
                        if source.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        match self.check_file() {
                            Err(shrunk) => shrunk,
                            Ok(()) => GgufError::Io {
                                path: path.clone(),
                                source,
                            },
                        }
                    }
                    e => e,
                })
            }
        }
    }

    /// The stored bytes of a tensor, read with [`Self::read_at`].
    pub fn read_tensor(&self, t: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        let n = usize::try_from(t.n_bytes).map_err(|_| GgufError::ReadOutOfBounds {
            offset: t.offset,
            len: t.n_bytes,
            file_len: self.file_len,
        })?;
        // `range` bounds the length by the file before anything is allocated.
        self.range(t.offset, t.n_bytes)?;
        let mut out = vec![0u8; n];
        self.read_at(t.offset, &mut out)?;
        Ok(out)
    }

    /// The stored bytes of a tensor, as a slice of the map, after checking that the file still
    /// holds them ([`Self::check_file`]).
    ///
    /// The slice is only safe to read while the file is not truncated: a file shrinking after
    /// this check (while the slice is in use) still raises `SIGBUS`. [`Self::read_tensor`]
    /// has no such window.
    pub fn try_tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let r = self.range(t.offset, t.n_bytes)?;
        self.check_file()?;
        self.bytes().get(r).ok_or(GgufError::ReadOutOfBounds {
            offset: t.offset,
            len: t.n_bytes,
            file_len: self.file_len,
        })
    }

    /// The stored bytes of a tensor (bounds were checked at parse time), unchecked.
    ///
    /// **Hazard**: nothing checks that the file still holds these bytes; if it was truncated
    /// since [`Self::open`], reading the slice kills the process with `SIGBUS`. Use
    /// [`Self::try_tensor_data`] or [`Self::read_tensor`].
    ///
    /// # Panics
    /// If `t` does not describe a tensor of this file (it was not taken from [`Self::tensors`]).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        match self.range(t.offset, t.n_bytes) {
            Ok(r) => &self.bytes()[r],
            Err(_) => panic!(
                "tensor {:?} [{}, +{}) is not within this {}-byte file",
                t.name, t.offset, t.n_bytes, self.file_len
            ),
        }
    }

    /// The bytes before the tensor data (header, metadata, tensor table), after checking that
    /// the file still holds them.
    pub fn header_bytes(&self) -> Result<&[u8], GgufError> {
        let r = self.range(0, self.data_offset)?;
        self.check_file()?;
        self.bytes().get(r).ok_or(GgufError::ReadOutOfBounds {
            offset: 0,
            len: self.data_offset,
            file_len: self.file_len,
        })
    }

    /// The stored bytes of row `row` of a tensor (checked as [`Self::try_tensor_data`]);
    /// `Ok(None)` past the last row.
    pub fn tensor_row_data(&self, t: &TensorInfo, row: u64) -> Result<Option<&[u8]>, GgufError> {
        if row >= t.n_rows() {
            return Ok(None);
        }
        let rb = t.row_bytes();
        let offset = row
            .checked_mul(rb)
            .and_then(|o| o.checked_add(t.offset))
            .ok_or(GgufError::ReadOutOfBounds {
                offset: t.offset,
                len: rb,
                file_len: self.file_len,
            })?;
        let r = self.range(offset, rb)?;
        self.check_file()?;
        Ok(self.bytes().get(r))
    }

    /// The whole tensor as f32 (read as [`Self::try_tensor_data`]).
    pub fn dequantize_tensor(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let data = self.try_tensor_data(t)?;
        let n = usize::try_from(t.n_elements).unwrap_or(usize::MAX);
        Ok(quant::dequantize_to_vec(t.ty, data, n))
    }

    /// Row `row` of a tensor as f32; `Ok(None)` past the last row.
    pub fn dequantize_row(&self, t: &TensorInfo, row: u64) -> Result<Option<Vec<f32>>, GgufError> {
        let Some(data) = self.tensor_row_data(t, row)? else {
            return Ok(None);
        };
        let Ok(n) = usize::try_from(t.row_len()) else {
            return Ok(None);
        };
        Ok(Some(quant::dequantize_to_vec(t.ty, data, n)))
    }
}

/// `pread` until `dst` is full; a short file is an `UnexpectedEof` I/O error.
#[cfg(unix)]
fn read_file_at(
    file: &std::fs::File,
    path: &str,
    offset: u64,
    dst: &mut [u8],
) -> Result<(), GgufError> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(dst, offset)
        .map_err(|source| GgufError::Io {
            path: path.to_owned(),
            source,
        })
}

#[cfg(not(unix))]
fn read_file_at(
    file: &std::fs::File,
    path: &str,
    offset: u64,
    dst: &mut [u8],
) -> Result<(), GgufError> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |source| GgufError::Io {
        path: path.to_owned(),
        source,
    };
    let mut f = file;
    f.seek(SeekFrom::Start(offset)).map_err(io)?;
    f.read_exact(dst).map_err(io)
}
