//! Chat template renders in a child process with a memory limit and a deadline.
//!
//! In process, fuel bounds the instructions a template runs and every walk one instruction
//! makes over a value is paid for before it starts (see `bounded`). The sandbox is a second
//! wall around that, for what no in-process check can catch (a bug in the template engine, a
//! walk that was missed): a [`Sandbox`] renders in a separate process: it sends the template
//! and the conversation as JSON on the child's stdin, the child (see [`child_main`]) caps its
//! own address space and CPU time, renders with the same fuel and recursion limits as
//! [`ChatTemplate::render_here`], and answers as JSON on stdout; the parent kills it at the
//! deadline. A stopped render is a typed error ([`ChatError::Limit`]), never a hung or killed
//! server.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{ChatError, ChatMessage, ChatTemplate, RECURSION_LIMIT};

/// The first argument that makes the flashlm binary a sandbox child (see [`child_main`]).
pub const CHILD_ARG: &str = "__render-chat-template";

/// Default address-space limit of a sandboxed render (the render thread's stack reserve,
/// [`super::RENDER_STACK`], counts against it).
pub const DEFAULT_MEMORY: u64 = 1 << 30;
/// Default deadline of a sandboxed render (real templates render in milliseconds).
pub const DEFAULT_TIME: Duration = Duration::from_secs(10);
/// Largest answer read back from a child (a render's text is bounded by its fuel, far below).
const MAX_REPLY: u64 = 256 << 20;

/// How to start a sandbox child and the limits it runs under.
#[derive(Debug, Clone)]
pub struct Sandbox {
    program: PathBuf,
    args: Vec<OsString>,
    memory: u64,
    time: Duration,
}

#[derive(Serialize, Deserialize)]
struct Request {
    source: String,
    bos_token: String,
    eos_token: String,
    messages: Vec<(String, String)>,
    add_generation_prompt: bool,
}

#[derive(Serialize, Deserialize)]
enum Reply {
    Text(String),
    OutOfFuel(u64),
    TooDeep(usize),
    Failed(String),
}

impl Sandbox {
    /// Children run `program args... __render-chat-template MEMORY SECONDS`; the program must
    /// call [`child_main`] when it sees [`CHILD_ARG`] (the flashlm binary does, first thing).
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Sandbox {
            program: program.into(),
            args: Vec::new(),
            memory: DEFAULT_MEMORY,
            time: DEFAULT_TIME,
        }
    }

    /// The running flashlm binary as the child.
    pub fn current_exe() -> Result<Self, ChatError> {
        std::env::current_exe()
            .map(Self::new)
            .map_err(|e| ChatError::Sandbox(format!("finding this program: {e}")))
    }

    /// Arguments put before [`CHILD_ARG`].
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// The child's address-space limit in bytes (enforced on Unix).
    pub fn memory(mut self, bytes: u64) -> Self {
        self.memory = bytes;
        self
    }

    /// The render's deadline.
    pub fn time(mut self, time: Duration) -> Self {
        self.time = time;
        self
    }

    /// Renders `messages` with `template` in a child process.
    pub fn render(
        &self,
        template: &ChatTemplate,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let request = Request {
            source: template.source().to_string(),
            bos_token: template.bos_token().to_string(),
            eos_token: template.eos_token().to_string(),
            messages: messages
                .iter()
                .map(|m| (m.role.clone(), m.content.clone()))
                .collect(),
            add_generation_prompt,
        };
        let request = serde_json::to_vec(&request)
            .map_err(|e| ChatError::Sandbox(format!("encoding the request: {e}")))?;
        let secs = self.time.as_secs().max(1) + 1;
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .arg(CHILD_ARG)
            .arg(self.memory.to_string())
            .arg(secs.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ChatError::Sandbox(format!("starting {}: {e}", self.program.display())))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ChatError::Sandbox("the child's pipes are missing".into()));
        };
        // Pipes are fed and drained on threads so that no side blocks on a full pipe.
        let writer = std::thread::spawn(move || stdin.write_all(&request));
        let read_all = |pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = pipe.take(MAX_REPLY).read_to_end(&mut buf);
                buf
            })
        };
        let out = read_all(Box::new(stdout));
        let err = read_all(Box::new(stderr));
        let start = Instant::now();
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if start.elapsed() >= self.time => {
                    let _ = child.kill();
                    timed_out = true;
                    break child
                        .wait()
                        .map_err(|e| ChatError::Sandbox(format!("waiting for the child: {e}")))?;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ChatError::Sandbox(format!("waiting for the child: {e}")));
                }
            }
        };
        let _ = writer.join();
        let out = out.join().unwrap_or_default();
        let err = err.join().unwrap_or_default();
        if timed_out {
            return Err(ChatError::Limit(format!(
                "it ran longer than {:.1} s",
                self.time.as_secs_f64()
            )));
        }
        if !status.success() {
            return Err(self.failure(status, &err));
        }
        match serde_json::from_slice::<Reply>(&out) {
            Ok(Reply::Text(text)) => Ok(text),
            Ok(Reply::OutOfFuel(fuel)) => Err(ChatError::OutOfFuel { fuel }),
            Ok(Reply::TooDeep(limit)) => Err(ChatError::TooDeep { limit }),
            Ok(Reply::Failed(message)) => Err(ChatError::Sandboxed(message)),
            Err(e) => Err(ChatError::Sandbox(format!(
                "reading the child's answer: {e}"
            ))),
        }
    }

    /// Names why a child died.
    fn failure(&self, status: ExitStatus, stderr: &[u8]) -> ChatError {
        let stderr = String::from_utf8_lossy(stderr);
        let mib = self.memory >> 20;
        if stderr.contains("memory allocation of") || stderr.contains("out of memory") {
            return ChatError::Limit(format!("it needed more than {mib} MiB of memory"));
        }
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            match status.signal() {
                Some(libc::SIGXCPU) => {
                    return ChatError::Limit(format!(
                        "it ran longer than {:.1} s of CPU time",
                        self.time.as_secs_f64()
                    ));
                }
                Some(libc::SIGKILL) => {
                    return ChatError::Limit(format!(
                        "it was killed (past its CPU time or its {mib} MiB of memory)"
                    ));
                }
                // Allocation failures abort; so do stack overflows past the render stack.
                Some(libc::SIGABRT) | Some(libc::SIGSEGV) => {
                    return ChatError::Limit(format!(
                        "it needed more than {mib} MiB of memory or stack"
                    ));
                }
                _ => {}
            }
        }
        let last = stderr.lines().last().unwrap_or("").trim();
        ChatError::Sandbox(format!("the child exited with {status}: {last}"))
    }
}

/// The child side: `args` are what follows [`CHILD_ARG`] (the memory limit in bytes and the
/// CPU seconds). Caps this process, reads one request from stdin, renders it in-process and
/// writes the reply to stdout. Returns the process exit code.
pub fn child_main(args: &[String]) -> i32 {
    let limit = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok());
    let (Some(memory), Some(secs)) = (limit(0), limit(1)) else {
        eprintln!("usage: {CHILD_ARG} MEMORY_BYTES CPU_SECONDS");
        return 2;
    };
    if let Err(e) = cap_self(memory, secs) {
        eprintln!("setting the render's limits: {e}");
        return 3;
    }
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("reading the request: {e}");
        return 4;
    }
    let request: Request = match serde_json::from_slice(&input) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("decoding the request: {e}");
            return 4;
        }
    };
    drop(input);
    let messages: Vec<ChatMessage> = request
        .messages
        .into_iter()
        .map(|(role, content)| ChatMessage::new(role, content))
        .collect();
    let reply = match ChatTemplate::new(request.source, request.bos_token, request.eos_token)
        .and_then(|t| t.render_here(&messages, request.add_generation_prompt))
    {
        Ok(text) => Reply::Text(text),
        Err(ChatError::OutOfFuel { fuel }) => Reply::OutOfFuel(fuel),
        Err(ChatError::TooDeep { .. }) => Reply::TooDeep(RECURSION_LIMIT),
        Err(e) => Reply::Failed(e.to_string()),
    };
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &reply)
        .map_err(std::io::Error::from)
        .and_then(|()| out.flush());
    match written {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("writing the reply: {e}");
            5
        }
    }
}

/// Caps this process's address space, CPU time and core dumps.
#[cfg(unix)]
fn cap_self(memory: u64, secs: u64) -> std::io::Result<()> {
    let set = |resource, value: u64| {
        let lim = libc::rlimit {
            rlim_cur: value as libc::rlim_t,
            rlim_max: value as libc::rlim_t,
        };
        // SAFETY: setrlimit reads a valid, initialized rlimit struct.
        if unsafe { libc::setrlimit(resource, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    set(libc::RLIMIT_CORE, 0)?;
    set(libc::RLIMIT_CPU, secs)?;
    set(libc::RLIMIT_AS, memory)
}

#[cfg(not(unix))]
fn cap_self(_memory: u64, _secs: u64) -> std::io::Result<()> {
    // Only the parent's deadline applies here.
    Ok(())
}
