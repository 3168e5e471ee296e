//! Shader sources, a small preprocessing step and one pipeline cache keyed by
//! (shader, entry point, defines).
//!
//! Shaders live in `shaders/*.wgsl`. Before compilation each define with a value becomes a
//! `const NAME = VALUE;` line at the top, `shaders/common.wgsl` (shared declarations) follows,
//! and `#ifdef NAME` / `#ifndef NAME` / `#else` / `#endif` lines keep or drop the lines between
//! them. `#include "name"` lines are first replaced by the named shader file (nested up to
//! [`MAX_INCLUDE_DEPTH`] deep), so included files may hold conditional blocks of their own.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::GpuError;

/// Declarations shared by every shader.
const COMMON_BUILT_IN: &str = include_str!("../../shaders/common.wgsl");

/// The shader files, embedded at build time; with `FLASHLM_SHADER_DIR` set (shader work), read
/// from `$FLASHLM_SHADER_DIR/NAME.wgsl` instead, once per process.
pub fn shader_source(name: &str) -> Option<&'static str> {
    let built_in = built_in_source(name)?;
    let Some(dir) = std::env::var_os("FLASHLM_SHADER_DIR") else {
        return Some(built_in);
    };
    static LOADED: std::sync::OnceLock<Mutex<HashMap<String, &'static str>>> =
        std::sync::OnceLock::new();
    let mut loaded = LOADED.get_or_init(Default::default).lock().ok()?;
    if let Some(s) = loaded.get(name) {
        return Some(s);
    }
    let path = std::path::Path::new(&dir).join(format!("{name}.wgsl"));
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => &*Box::leak(t.into_boxed_str()),
        Err(e) => {
            log::warn!("{}: {e}; using the built-in {name} shader", path.display());
            built_in
        }
    };
    loaded.insert(name.to_string(), text);
    Some(text)
}

fn built_in_source(name: &str) -> Option<&'static str> {
    Some(match name {
        "matmul" => include_str!("../../shaders/matmul.wgsl"),
        "rmsnorm" => include_str!("../../shaders/rmsnorm.wgsl"),
        "rope" => include_str!("../../shaders/rope.wgsl"),
        "rope_store" => include_str!("../../shaders/rope_store.wgsl"),
        "attention" => include_str!("../../shaders/attention.wgsl"),
        "attention_params" => include_str!("../../shaders/attention_params.wgsl"),
        "attention_tiled" => include_str!("../../shaders/attention_tiled.wgsl"),
        "elementwise" => include_str!("../../shaders/elementwise.wgsl"),
        "kv" => include_str!("../../shaders/kv.wgsl"),
        "roofline" => include_str!("../../shaders/roofline.wgsl"),
        "matmul_quant" => include_str!("../../shaders/matmul_quant.wgsl"),
        "matmul_blocks" => include_str!("../../shaders/matmul_blocks.wgsl"),
        "matmul_stream" => include_str!("../../shaders/matmul_stream.wgsl"),
        "common" => COMMON_BUILT_IN,
        _ => return None,
    })
}

/// Preprocessor defines: a flag (`value` empty) or a constant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Defines(BTreeMap<String, String>);

impl Defines {
    pub fn new() -> Self {
        Self::default()
    }
    /// A flag for `#ifdef`.
    pub fn flag(mut self, name: &str) -> Self {
        self.0.insert(name.to_string(), String::new());
        self
    }
    /// A constant, emitted as `const NAME = VALUE;` (VALUE is WGSL text, e.g. `64u`).
    pub fn val(mut self, name: &str, value: impl ToString) -> Self {
        self.0.insert(name.to_string(), value.to_string());
        self
    }
    fn key(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// How deep `#include`s may nest.
pub const MAX_INCLUDE_DEPTH: usize = 4;

/// Replace each `#include "name"` line of `src` by the shader file `name`, recursively.
fn expand_includes(src: &str, depth: usize) -> Result<String, String> {
    let mut out = String::with_capacity(src.len());
    for (i, line) in src.lines().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("#include") else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let name = rest
            .trim()
            .strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .ok_or_else(|| format!("line {}: expected #include \"name\"", i + 1))?;
        if depth >= MAX_INCLUDE_DEPTH {
            return Err(format!("line {}: #include nested too deep", i + 1));
        }
        let inc = shader_source(name)
            .ok_or_else(|| format!("line {}: no shader named {name:?} to include", i + 1))?;
        out.push_str(&expand_includes(inc, depth + 1)?);
    }
    Ok(out)
}

/// Apply `defines` to `src`: includes first, then constants, then conditional blocks.
pub fn preprocess(src: &str, defines: &Defines) -> Result<String, String> {
    let src = expand_includes(src, 0)?;
    let mut out = String::with_capacity(src.len() + 256);
    for (k, v) in &defines.0 {
        if !v.is_empty() {
            out.push_str(&format!("const {k} = {v};\n"));
        }
    }
    out.push_str(shader_source("common").unwrap_or(COMMON_BUILT_IN));
    // Stack of (this block active, some branch already taken).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |stack: &Vec<(bool, bool)>| stack.iter().all(|&(a, _)| a);
    for (i, line) in src.lines().enumerate() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#ifdef ") {
            let on = defines.0.contains_key(rest.trim());
            stack.push((on, on));
        } else if let Some(rest) = t.strip_prefix("#ifndef ") {
            let on = !defines.0.contains_key(rest.trim());
            stack.push((on, on));
        } else if t.starts_with("#else") {
            match stack.last_mut() {
                Some(top) => {
                    top.0 = !top.1;
                    top.1 = true;
                }
                None => return Err(format!("line {}: #else without #ifdef", i + 1)),
            }
        } else if t.starts_with("#endif") {
            if stack.pop().is_none() {
                return Err(format!("line {}: #endif without #ifdef", i + 1));
            }
        } else if active(&stack) {
            out.push_str(line);
            out.push('\n');
        } else {
            // Keep line numbers stable for compiler messages.
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err("unterminated #ifdef".into());
    }
    Ok(out)
}

type Key = (String, String, String);

/// Compiled pipelines, created once per (shader, entry, defines).
#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<Key, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of distinct pipelines compiled so far.
    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Get or compile a pipeline.
    pub fn get(
        &self,
        device: &wgpu::Device,
        shader: &str,
        entry: &str,
        defines: &Defines,
    ) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        let key = (shader.to_string(), entry.to_string(), defines.key());
        if let Ok(m) = self.map.lock()
            && let Some(p) = m.get(&key)
        {
            return Ok(p.clone());
        }
        let src = shader_source(shader).ok_or_else(|| GpuError::Shader {
            name: shader.to_string(),
            message: "no such shader".into(),
        })?;
        let code = preprocess(src, defines).map_err(|message| GpuError::Shader {
            name: shader.to_string(),
            message,
        })?;
        let label = format!("{shader}:{entry}[{}]", defines.key());
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(code.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Shader {
                name: label,
                message: err.to_string(),
            });
        }
        let p = Arc::new(pipeline);
        if let Ok(mut m) = self.map.lock() {
            m.insert(key, p.clone());
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preprocess_blocks_and_consts() {
        let src = "a\n#ifdef X\nb\n#else\nc\n#endif\n#ifndef Y\nd\n#endif\ne";
        let out = preprocess(src, &Defines::new().flag("X").val("N", "4u")).unwrap();
        let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        let common = COMMON_BUILT_IN.lines().filter(|l| !l.is_empty()).count();
        assert_eq!(lines[1 + common..], ["a", "b", "d", "e"]);
        assert_eq!(lines[0], "const N = 4u;");
        let out = preprocess(src, &Defines::new().flag("Y")).unwrap();
        let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines[common..], ["a", "c", "e"]);
        assert!(preprocess("#ifdef A\nx", &Defines::new()).is_err());
        assert!(preprocess("#endif", &Defines::new()).is_err());
    }

    #[test]
    fn preprocess_includes() {
        // The included file's conditional blocks see the same defines.
        let src = "a\n#include \"matmul_quant\"\nz";
        let on = preprocess(src, &Defines::new().flag("EXT").flag("Q4_K")).unwrap();
        let off = preprocess(src, &Defines::new()).unwrap();
        assert!(on.contains("fn k4_scale_min") && on.contains("fn ext_unit"));
        assert!(!off.contains("fn k4_scale_min"));
        assert!(on.trim_end().ends_with('z') && off.contains("\na\n"));
        assert!(preprocess("#include \"nope\"", &Defines::new()).is_err());
        assert!(preprocess("#include nope", &Defines::new()).is_err());
    }
}
