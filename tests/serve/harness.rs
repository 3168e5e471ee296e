//! Shared by the `serve_*` tests: a synthetic model on disk, a `flashlm serve` child process on
//! 127.0.0.1 with a free port, and a raw HTTP/1.1 client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flashlm::gguf::GgmlType;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};

/// Context of the synthetic model, in tokens.
pub const CTX: usize = 256;

/// A scratch directory for this test binary.
pub fn scratch(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("serve-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// Write the tiny synthetic llama (Q8_0, ChatML template, 256-token context) to `dir`.
pub fn model(dir: &Path) -> PathBuf {
    let spec = SyntheticSpec {
        ctx: CTX,
        ..SyntheticSpec::tiny(GgmlType::Q8_0)
    };
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, synthetic_llama(&spec, 7)).unwrap();
    path
}

/// A running `flashlm serve`; killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// Lines the server printed on stderr.
    pub log: std::sync::Mutex<mpsc::Receiver<String>>,
}

impl Server {
    /// Start the server on a free port with `extra` flags, and wait until `/health` is 200.
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flashlm"))
            .args([
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--io",
                "mmap",
                "-m",
            ])
            .arg(model)
            .args(extra)
            .env_remove("FLASHLM_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting flashlm serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                if tx.send(line).is_err() {
                    // Keep draining so the server never blocks on a full pipe.
                    continue;
                }
            }
        });
        let t0 = Instant::now();
        let addr = loop {
            let line = match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(l) => l,
                Err(e) => {
                    let _ = child.kill();
                    panic!("the server printed no address: {e}");
                }
            };
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.trim().parse::<SocketAddr>().unwrap();
            }
        };
        assert!(addr.ip().is_loopback());
        let mut s = Server {
            child,
            addr,
            log: std::sync::Mutex::new(rx),
        };
        loop {
            if let Ok(r) = s.try_request("GET", "/health", &[], b"")
                && r.status == 200
            {
                break;
            }
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("the server exited while loading: {status}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "the model never became ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        let mut s = TcpStream::connect(self.addr)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        // A server that refuses the body may answer before reading it all: read the answer
        // even when the rest cannot be written.
        let _ = s.write_all(body);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        Response::parse(&raw)
    }

    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Response {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed HTTP response (chunked bodies are joined).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn parse(raw: &[u8]) -> std::io::Result<Response> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| bad("no end of headers"))?;
        let head = std::str::from_utf8(&raw[..end]).map_err(|_| bad("headers not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().ok_or_else(|| bad("no status line"))?;
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut body = raw[end + 4..].to_vec();
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        if chunked {
            body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
        }
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// Asserts an OpenAI-style error with this status; returns the error object.
    pub fn expect_error(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status, status, "body: {}", self.text());
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e
    }
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol]).ok()?.trim(), 16).ok()?;
        b = &b[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}
