//! The GPU context: adapter and device selection, a device-memory budget that counts every
//! buffer, the pipeline cache, and blocking readback.

mod instance;
mod layout;
mod map;
pub mod pipeline;
pub mod profile;
pub mod softdriver;
pub mod staging;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

pub use instance::{list_adapters, parse_backends};
pub use layout::MatmulLayout;
pub use pipeline::{Defines, PipelineCache};

use instance::{backends_from, make_instance};

/// Errors from the GPU layer.
#[derive(Debug, Error)]
pub enum GpuError {
    #[error(
        "no GPU adapter found for backends {backends}; on Linux without a GPU driver install lavapipe (apt-get install mesa-vulkan-drivers libvulkan1), or pick another backend with --backend / WGPU_BACKEND"
    )]
    NoAdapter { backends: String },
    #[error("adapter {wanted:?} not found; available: {available}")]
    AdapterNotFound { wanted: String, available: String },
    #[error("could not open the GPU device: {0}")]
    RequestDevice(String),
    #[error("unknown backend {0:?} (expected vulkan, metal, dx12, gl, or a comma-separated list)")]
    UnknownBackend(String),
    #[error("shader {name} failed to compile: {message}")]
    Shader { name: String, message: String },
    #[error("GPU validation error: {0}")]
    Validation(String),
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),
    #[error("mapping a GPU buffer failed: {0}")]
    MapFailed(String),
    #[error(
        "device-memory budget exceeded: allocating {request} bytes for {label} with {in_use} in use would pass the budget of {budget} bytes"
    )]
    BudgetExceeded {
        label: String,
        request: u64,
        in_use: u64,
        budget: u64,
    },
    #[error(
        "buffer {label} of {size} bytes exceeds the adapter's limit of {limit} bytes per buffer"
    )]
    BufferTooLarge {
        label: String,
        size: u64,
        limit: u64,
    },
}

/// Counts device bytes: current use, peak and the budget.
#[derive(Debug)]
pub struct DeviceBudget {
    limit: u64,
    in_use: AtomicU64,
    peak: AtomicU64,
}

impl DeviceBudget {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Relaxed)
    }
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
    fn reserve(&self, label: &str, bytes: u64) -> Result<(), GpuError> {
        let mut cur = self.in_use.load(Ordering::Relaxed);
        loop {
            let next = cur.saturating_add(bytes);
            if next > self.limit {
                return Err(GpuError::BudgetExceeded {
                    label: label.to_string(),
                    request: bytes,
                    in_use: cur,
                    budget: self.limit,
                });
            }
            match self
                .in_use
                .compare_exchange(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) => cur = now,
            }
        }
    }
    fn release(&self, bytes: u64) {
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A device buffer whose bytes are counted by the budget while it lives.
#[derive(Debug)]
pub struct GpuBuffer {
    pub buffer: wgpu::Buffer,
    pub size: u64,
    budget: Arc<DeviceBudget>,
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        self.buffer.destroy();
        self.budget.release(self.size);
    }
}

impl std::ops::Deref for GpuBuffer {
    type Target = wgpu::Buffer;
    fn deref(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

/// How to choose the adapter.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Backends to consider, e.g. "vulkan" or "gl"; `None` reads `WGPU_BACKEND`, else all.
    pub backend: Option<String>,
    /// Substring of the adapter name to pick (`WGPU_ADAPTER_NAME` when `None`).
    pub adapter: Option<String>,
    /// Device-memory budget in bytes; `None` means what the adapter allows.
    pub budget: Option<u64>,
    /// Matrix kernel layout; `None` picks one from the adapter type.
    pub matmul_layout: Option<MatmulLayout>,
}

/// What a buffer from [`GpuContext::alloc_as`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferUsage {
    /// Read and written by kernels, copied to and from.
    Storage,
    /// Copied into, then mapped for reading on the host.
    Readback,
}

/// The device, queue, pipeline cache and memory budget.
pub struct GpuContext {
    /// Matrix kernel layout, chosen from the adapter type (tests switch it).
    pub matmul_layout: MatmulLayout,
    /// The device was opened with subgroup operations and its subgroups are always 8 wide.
    pub subgroups8: bool,
    /// Attention and RMSNorm run as workgroups of one 8-lane subgroup that combine their lanes
    /// with subgroup operations (decode attention: one per (KV head, row, split), the head dim
    /// across the lanes), with no workgroup memory or barriers: chosen on CPU rasterizers with
    /// 8-wide subgroups, where barriers cost more than the work (tests switch it).
    pub lane_kernels: bool,
    /// Timestamp queries inside compute passes are available (`--profile`).
    pub timestamps: bool,
    /// Shaders may use 64-bit integers (`SHADER_INT64`).
    pub int64: bool,
    /// Storage buffers can be mapped for writing (device memory is host memory): layer slots
    /// can be filled in place, without a staging copy.
    pub mappable: bool,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub pipelines: PipelineCache,
    pub budget: Arc<DeviceBudget>,
    lost: Arc<Mutex<Option<String>>>,
    errors: Arc<Mutex<Vec<String>>>,
    /// Bytes queued by `write` since the last submit.
    pending_writes: AtomicU64,
}

/// Queued `write_buffer` bytes after which the queue is flushed, so writes never pile up
/// unsubmitted.
const MAX_PENDING_WRITES: u64 = 32 << 20;

impl GpuContext {
    /// Pick an adapter and open a device.
    pub fn new(opts: &GpuOptions) -> Result<Self, GpuError> {
        let backends = backends_from(&opts.backend)?;
        let mut instance = make_instance(backends);
        let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
        if adapters.is_empty() && opts.backend.is_none() && std::env::var("WGPU_BACKEND").is_err() {
            instance = make_instance(wgpu::Backends::GL);
            adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::GL));
        }
        if adapters.is_empty() {
            return Err(GpuError::NoAdapter {
                backends: format!("{backends:?}"),
            });
        }
        let wanted = opts
            .adapter
            .clone()
            .or_else(|| std::env::var("WGPU_ADAPTER_NAME").ok());
        let adapter = if let Some(w) = wanted {
            let wl = w.to_lowercase();
            let pos = adapters
                .iter()
                .position(|a| a.get_info().name.to_lowercase().contains(&wl));
            match pos {
                Some(i) => adapters.swap_remove(i),
                None => {
                    let available = adapters
                        .iter()
                        .map(|a| a.get_info().name)
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(GpuError::AdapterNotFound {
                        wanted: w,
                        available,
                    });
                }
            }
        } else {
            // Prefer a discrete GPU, then integrated, then virtual, then the CPU.
            let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
                wgpu::DeviceType::DiscreteGpu => 0,
                wgpu::DeviceType::IntegratedGpu => 1,
                wgpu::DeviceType::VirtualGpu => 2,
                wgpu::DeviceType::Other => 3,
                wgpu::DeviceType::Cpu => 4,
            };
            let best = (0..adapters.len())
                .min_by_key(|&i| {
                    let a = &adapters[i];
                    // Among equals prefer Vulkan/Metal/DX12 over GL.
                    let gl = (a.get_info().backend == wgpu::Backend::Gl) as u32;
                    (rank(a), gl)
                })
                .unwrap_or(0);
            adapters.swap_remove(best)
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        // Subgroups are optional (the GL backend has none): request them only where offered.
        // Timestamps inside passes serve --profile. Buffers both mappable and usable as storage
        // serve zero-copy uploads where device memory is host memory. 64-bit integers serve
        // the roofline kernel's wide loads (`bench resident`).
        let unified = matches!(
            info.device_type,
            wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu
        );
        let ts = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let mut wanted = wgpu::Features::SUBGROUP | ts | wgpu::Features::SHADER_INT64;
        if unified {
            wanted |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        let features = adapter.features() & wanted;
        let timestamps = features.contains(ts);
        let int64 = features.contains(wgpu::Features::SHADER_INT64);
        let mappable = features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
        let subgroups8 = features.contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size == 8
            && info.subgroup_max_size == 8;
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("flashlm"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| GpuError::RequestDevice(e.to_string()))?;

        let lost = Arc::new(Mutex::new(None));
        let lost2 = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = lost2.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        let errors = Arc::new(Mutex::new(Vec::new()));
        let errors2 = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("wgpu: {e}");
            if let Ok(mut v) = errors2.lock() {
                v.push(e.to_string());
            }
        }));
        let budget_limit = opts.budget.unwrap_or(u64::MAX);
        let matmul_layout = if let Some(l) = opts.matmul_layout {
            l
        } else if info.device_type == wgpu::DeviceType::Cpu {
            MatmulLayout::CPU
        } else {
            MatmulLayout::GPU
        };
        // Without 64-bit integers the 64-bit loads are 32-bit ones (so `bench layouts` and
        // the tables name what runs).
        let matmul_layout = MatmulLayout {
            load64: matmul_layout.load64 && int64,
            ..matmul_layout
        };
        let lane_kernels = subgroups8 && info.device_type == wgpu::DeviceType::Cpu;
        Ok(Self {
            matmul_layout,
            subgroups8,
            lane_kernels,
            timestamps,
            int64,
            mappable,
            pipelines: PipelineCache::new(),
            device,
            queue,
            info,
            limits,
            budget: Arc::new(DeviceBudget::new(budget_limit)),
            lost,
            errors,
            pending_writes: AtomicU64::new(0),
        })
    }

    /// "llvmpipe (Vulkan)" style description.
    pub fn describe(&self) -> String {
        let threads = match softdriver::threads_set() {
            Some(n) if self.info.device_type == wgpu::DeviceType::Cpu => {
                format!(", {n} driver threads")
            }
            _ => String::new(),
        };
        format!("{} ({:?}{threads})", self.info.name, self.info.backend)
    }

    pub fn backend_name(&self) -> String {
        format!("{:?}", self.info.backend).to_lowercase()
    }

    /// Largest storage buffer binding the device allows.
    pub fn max_binding(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// Allocate a buffer, counted against the budget.
    pub fn buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<GpuBuffer, GpuError> {
        self.alloc(label, size, usage, false)
    }

    /// A buffer created mapped (for staging), counted against the budget.
    pub fn buffer_mapped(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<GpuBuffer, GpuError> {
        self.alloc(label, size, usage, true)
    }

    fn alloc(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        mapped_at_creation: bool,
    ) -> Result<GpuBuffer, GpuError> {
        // wgpu wants sizes that are multiples of 4; keep everything 16-byte rounded.
        let size = size.max(16).div_ceil(16) * 16;
        if size > self.limits.max_buffer_size {
            return Err(GpuError::BufferTooLarge {
                label: label.to_string(),
                size,
                limit: self.limits.max_buffer_size,
            });
        }
        self.budget.reserve(label, size)?;
        log::trace!("alloc {label}: {size}");
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation,
        });
        Ok(GpuBuffer {
            buffer,
            size,
            budget: self.budget.clone(),
        })
    }

    /// A storage buffer filled with `data` (padded to 4 bytes).
    pub fn storage_with(&self, label: &str, data: &[u8]) -> Result<GpuBuffer, GpuError> {
        let buf = self.buffer(
            label,
            data.len() as u64,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        )?;
        self.write(&buf, 0, data);
        Ok(buf)
    }

    /// A uniform buffer of `size` bytes.
    pub fn uniform(&self, label: &str, size: u64) -> Result<GpuBuffer, GpuError> {
        self.buffer(
            label,
            size,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        )
    }

    /// A buffer of `size` bytes for `use_`.
    pub fn alloc_as(
        &self,
        label: &str,
        size: u64,
        use_: BufferUsage,
    ) -> Result<GpuBuffer, GpuError> {
        match use_ {
            BufferUsage::Storage => self.storage(label, size),
            BufferUsage::Readback => self.buffer(
                label,
                size,
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
        }
    }

    /// A storage buffer the host can also map for writing (needs [`GpuContext::mappable`]).
    pub fn mappable_storage(&self, label: &str, size: u64) -> Result<GpuBuffer, GpuError> {
        self.buffer(
            label,
            size,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::MAP_WRITE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        )
    }

    /// A storage buffer of `size` bytes (contents zero).
    pub fn storage(&self, label: &str, size: u64) -> Result<GpuBuffer, GpuError> {
        self.buffer(
            label,
            size,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        )
    }

    /// Submit queued writes and wait for them.
    pub fn flush(&self) -> Result<(), GpuError> {
        self.pending_writes.store(0, Ordering::Relaxed);
        self.queue.submit([]);
        self.wait()
    }

    /// Queue a write; pads the tail to a multiple of 4 bytes. Large totals are flushed.
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let pending = self
            .pending_writes
            .fetch_add(data.len() as u64, Ordering::Relaxed)
            + data.len() as u64;
        if pending > MAX_PENDING_WRITES {
            self.pending_writes.store(0, Ordering::Relaxed);
            self.queue.submit([]);
            let _ = self.device.poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            });
        }
        if data.len().is_multiple_of(4) {
            self.queue.write_buffer(buf, offset, data);
        } else {
            let mut v = data.to_vec();
            v.resize(data.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(buf, offset, &v);
        }
    }

    /// Fail with the first recorded device loss or validation error, if any.
    pub fn check(&self) -> Result<(), GpuError> {
        if let Ok(l) = self.lost.lock()
            && let Some(m) = l.as_ref()
        {
            return Err(GpuError::DeviceLost(m.clone()));
        }
        if let Ok(mut e) = self.errors.lock()
            && !e.is_empty()
        {
            let all = e.drain(..).collect::<Vec<_>>().join("; ");
            return Err(GpuError::Validation(all));
        }
        Ok(())
    }

    /// Block until all submitted work is done.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| GpuError::DeviceLost(e.to_string()))?;
        self.check()
    }

    /// Copy a storage buffer's first `len` bytes back to the host (tests, debugging).
    pub fn read_buffer(&self, src: &wgpu::Buffer, len: u64) -> Result<Vec<u8>, GpuError> {
        let len4 = len.div_ceil(4) * 4;
        let staging = self.buffer(
            "readback",
            len4,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, 0, &staging, 0, len4);
        self.queue.submit([enc.finish()]);
        let mut v = self.read_mapped(&staging, len4)?;
        v.truncate(len as usize);
        Ok(v)
    }

    /// Read `n` f32 values from the start of a buffer.
    pub fn read_f32(&self, src: &wgpu::Buffer, n: usize) -> Result<Vec<f32>, GpuError> {
        let bytes = self.read_buffer(src, (n * 4) as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
