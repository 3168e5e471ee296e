//! Choosing wgpu backends and creating the instance that lists adapters.

use super::GpuError;

/// Parse a backend list such as "vulkan", "gl" or "vulkan,metal".
pub fn parse_backends(s: &str) -> Result<wgpu::Backends, GpuError> {
    let mut out = wgpu::Backends::empty();
    for part in s.split(',').map(|p| p.trim().to_ascii_lowercase()) {
        out |= match part.as_str() {
            "vulkan" | "vk" => wgpu::Backends::VULKAN,
            "metal" | "mtl" => wgpu::Backends::METAL,
            "dx12" | "d3d12" => wgpu::Backends::DX12,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            "primary" => wgpu::Backends::PRIMARY,
            "all" => wgpu::Backends::all(),
            _ => return Err(GpuError::UnknownBackend(s.to_string())),
        };
    }
    Ok(out)
}

pub(super) fn backends_from(opts_backend: &Option<String>) -> Result<wgpu::Backends, GpuError> {
    match opts_backend {
        Some(b) => parse_backends(b),
        None => match std::env::var("WGPU_BACKEND") {
            Ok(b) if !b.is_empty() => parse_backends(&b),
            // Vulkan, Metal or DX12 first; GL only where none of them has an adapter.
            _ => Ok(wgpu::Backends::PRIMARY),
        },
    }
}

/// A wgpu instance for the given backends, without a display (flashlm draws nothing).
///
/// On a headless Linux machine, listing Vulkan devices used to print "error: XDG_RUNTIME_DIR is
/// invalid or not set in the environment." twice: wgpu enables the Wayland surface extension
/// whenever the driver has it, so Mesa's implicit device-select layer (and Mesa's EGL, when GL
/// is probed) tries to connect to a Wayland display during enumeration, and libwayland-client
/// reports the failed connection on stderr. Before the first instance, libwayland-client's
/// messages are routed to the debug log instead (only when the library is installed; nothing
/// else changes: no environment variable is set and no layer is disabled).
pub(super) fn make_instance(backends: wgpu::Backends) -> wgpu::Instance {
    #[cfg(all(target_os = "linux", not(target_os = "android")))]
    fn route_wayland_messages_to_the_log() {
        use std::ffi::{CStr, c_char, c_void};
        /// `wl_log_func_t`: `void (*)(const char *fmt, va_list args)`; `va_list` arrives as a
        /// pointer on the supported targets, and is not read.
        extern "C" fn to_debug_log(fmt: *const c_char, _args: *mut c_void) {
            if !fmt.is_null() {
                // SAFETY: libwayland passes a NUL-terminated format string.
                let text = unsafe { CStr::from_ptr(fmt) };
                log::debug!("libwayland: {}", text.to_string_lossy().trim_end());
            }
        }
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: dlopen/dlsym with NUL-terminated names; the library stays loaded (it is
            // never closed), and `wl_log_set_handler_client` has had this signature since
            // libwayland 1.0. Loading it again later (by the layer) reuses this copy, so the
            // handler applies there.
            unsafe {
                let lib = libc::dlopen(
                    c"libwayland-client.so.0".as_ptr(),
                    libc::RTLD_NOW | libc::RTLD_LOCAL,
                );
                if lib.is_null() {
                    return;
                }
                let sym = libc::dlsym(lib, c"wl_log_set_handler_client".as_ptr());
                if sym.is_null() {
                    return;
                }
                let set_handler: extern "C" fn(extern "C" fn(*const c_char, *mut c_void)) =
                    std::mem::transmute(sym);
                set_handler(to_debug_log);
            }
        });
    }
    #[cfg(all(target_os = "linux", not(target_os = "android")))]
    route_wayland_messages_to_the_log();

    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// All adapters the given backends expose.
pub fn list_adapters(backend: &Option<String>) -> Result<Vec<wgpu::AdapterInfo>, GpuError> {
    let backends = if backend.is_none() && std::env::var("WGPU_BACKEND").is_err() {
        wgpu::Backends::all()
    } else {
        backends_from(backend)?
    };
    let instance = make_instance(backends);
    let adapters = pollster::block_on(instance.enumerate_adapters(backends));
    Ok(adapters.iter().map(|a| a.get_info()).collect())
}
