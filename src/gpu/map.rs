//! Mapping device buffers on the host: reading results back, and where a mappable buffer's
//! memory lies.

use std::sync::{Arc, Mutex};

use super::{GpuContext, GpuError};

impl GpuContext {
    /// Where a mappable buffer's memory sits on the host, modulo `modulo` bytes: its first bytes
    /// are mapped for writing once (the buffer must be idle) and the address is read. The
    /// address may differ at a later map: whoever relies on it checks again then.
    pub fn mapped_offset(&self, buf: &wgpu::Buffer, modulo: u64) -> Result<u64, GpuError> {
        let len = buf.size().min(16);
        let slot: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>> =
            Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        buf.map_async(wgpu::MapMode::Write, 0..len, move |r| {
            if let Ok(mut s) = s2.lock() {
                *s = Some(r);
            }
        });
        self.wait()?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while slot.lock().is_ok_and(|s| s.is_none()) && std::time::Instant::now() < deadline {
            let _ = self.device.poll(wgpu::PollType::Poll);
            std::thread::yield_now();
        }
        match slot.lock().ok().and_then(|mut s| s.take()) {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(GpuError::MapFailed(e.to_string())),
            None => return Err(GpuError::MapFailed("map callback never ran".into())),
        }
        let at = {
            let mut view = buf
                .get_mapped_range_mut(0..len)
                .map_err(|e| GpuError::MapFailed(e.to_string()))?;
            view.slice(..).as_raw_element_ptr().as_ptr() as u64
        };
        buf.unmap();
        Ok(at % modulo.max(1))
    }

    /// Map `buf` (MAP_READ) and copy `len` bytes out.
    pub fn read_mapped(&self, buf: &wgpu::Buffer, len: u64) -> Result<Vec<u8>, GpuError> {
        let len = len.div_ceil(4) * 4;
        let slot: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>> =
            Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        buf.map_async(wgpu::MapMode::Read, 0..len, move |r| {
            if let Ok(mut s) = s2.lock() {
                *s = Some(r);
            }
        });
        self.wait()?;
        // The upload thread's poll may have taken the callback and not run it yet.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while slot.lock().is_ok_and(|s| s.is_none()) && std::time::Instant::now() < deadline {
            let _ = self.device.poll(wgpu::PollType::Poll);
            std::thread::yield_now();
        }
        match slot.lock().ok().and_then(|mut s| s.take()) {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(GpuError::MapFailed(e.to_string())),
            None => return Err(GpuError::MapFailed("map callback never ran".into())),
        }
        let out = {
            let view = buf
                .get_mapped_range(0..len)
                .map_err(|e| GpuError::MapFailed(e.to_string()))?;
            view.to_vec()
        };
        buf.unmap();
        Ok(out)
    }
}
