//! Request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by field:
//! every field is known, of the right type and in range, or the request is refused with a
//! 400 naming the field.

use serde_json::{Map, Value};

use super::error::ApiError;
use crate::model::chat::ChatMessage;
use crate::sampling::SamplerParams;

/// Most stop sequences per request (as OpenAI allows).
pub const MAX_STOPS: usize = 4;
/// Longest stop sequence, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// Largest `top_k`.
pub const MAX_TOP_K: u64 = 1 << 20;

/// Fields both endpoints take.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// The model the client named (any name is served by the one loaded model).
    pub model: Option<String>,
    /// `max_tokens` / `max_completion_tokens`, already within the server's limit.
    pub max_tokens: Option<usize>,
    pub sampling: SamplerParams,
    /// Stop sequences, matched on the decoded text and not included in it.
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage`.
    pub include_usage: bool,
}

/// A completion prompt: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub common: Common,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    pub common: Common,
}

const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "user",
];

/// The body as a JSON object: valid UTF-8, well-formed JSON, an object, no unknown field.
fn object(body: &[u8], extra: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::invalid(format!(
            "the request body is not valid UTF-8 (at byte {})",
            e.valid_up_to()
        ))
    })?;
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(map) = v else {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    };
    if let Some(k) = map
        .keys()
        .find(|k| !COMMON_FIELDS.contains(&k.as_str()) && !extra.contains(&k.as_str()))
    {
        return Err(ApiError::invalid_param(
            k.clone(),
            format!("unknown field `{k}`"),
        ));
    }
    Ok(map)
}

/// A field's value; `null` counts as absent.
fn field<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).filter(|v| !v.is_null())
}

fn bad(param: &str, what: &str) -> ApiError {
    ApiError::invalid_param(param, format!("`{param}` must be {what}"))
}

fn uint(v: &Value, param: &str, lo: u64, hi: u64) -> Result<u64, ApiError> {
    let what = format!("an integer from {lo} to {hi}");
    match v.as_u64() {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(bad(param, &what)),
    }
}

fn number(v: &Value, param: &str, what: &str) -> Result<f64, ApiError> {
    v.as_f64()
        .filter(|x| x.is_finite())
        .ok_or_else(|| bad(param, what))
}

fn string<'a>(v: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    v.as_str().ok_or_else(|| bad(param, "a string"))
}

fn boolean(v: &Value, param: &str) -> Result<bool, ApiError> {
    v.as_bool().ok_or_else(|| bad(param, "true or false"))
}

/// A seed for requests that give none: different for every request.
pub(crate) fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut g = crate::sampling::SplitMix64(t ^ COUNTER.fetch_add(1, Ordering::Relaxed) << 32);
    g.next_u64()
}

fn common(map: &Map<String, Value>, max_tokens_limit: usize) -> Result<Common, ApiError> {
    let model = match field(map, "model") {
        Some(v) => Some(string(v, "model")?.to_string()),
        None => None,
    };
    if let Some(v) = field(map, "user") {
        string(v, "user")?;
    }
    let limit = max_tokens_limit as u64;
    let mt = match field(map, "max_tokens") {
        Some(v) => Some(uint(v, "max_tokens", 1, limit)?),
        None => None,
    };
    let mct = match field(map, "max_completion_tokens") {
        Some(v) => Some(uint(v, "max_completion_tokens", 1, limit)?),
        None => None,
    };
    let max_tokens = match (mt, mct) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid_param(
                "max_completion_tokens",
                "`max_tokens` and `max_completion_tokens` differ; give one of them",
            ));
        }
        (a, b) => b.or(a).map(|n| n as usize),
    };
    let temperature = match field(map, "temperature") {
        Some(v) => {
            let t = number(v, "temperature", "a number from 0 to 2")?;
            if !(0.0..=2.0).contains(&t) {
                return Err(bad("temperature", "a number from 0 to 2"));
            }
            t as f32
        }
        None => 1.0,
    };
    let top_p = match field(map, "top_p") {
        Some(v) => {
            let p = number(v, "top_p", "a number in (0, 1]")?;
            if !(p > 0.0 && p <= 1.0) {
                return Err(bad("top_p", "a number in (0, 1]"));
            }
            p as f32
        }
        None => 1.0,
    };
    let top_k = match field(map, "top_k") {
        Some(v) => uint(v, "top_k", 0, MAX_TOP_K)? as usize,
        None => 0,
    };
    let seed = match field(map, "seed") {
        // Any 64-bit integer, negative ones included (they keep their bits).
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(s), _) => s,
            (None, Some(s)) => s as u64,
            _ => return Err(bad("seed", "an integer")),
        },
        None => fresh_seed(),
    };
    if let Some(v) = field(map, "n") {
        uint(v, "n", 1, 1).map_err(|_| bad("n", "1 (one choice per request)"))?;
    }
    let stop = match field(map, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOPS {
                return Err(bad("stop", "at most 4 strings"));
            }
            a.iter()
                .map(|s| string(s, "stop").map(str::to_string))
                .collect::<Result<_, _>>()?
        }
        Some(_) => return Err(bad("stop", "a string or an array of up to 4 strings")),
    };
    if stop
        .iter()
        .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(bad(
            "stop",
            "made of non-empty strings of at most 256 bytes",
        ));
    }
    let stream = match field(map, "stream") {
        Some(v) => boolean(v, "stream")?,
        None => false,
    };
    let include_usage = match field(map, "stream_options") {
        None => false,
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| *k != "include_usage") {
                return Err(ApiError::invalid_param(
                    format!("stream_options.{k}"),
                    format!("unknown field `stream_options.{k}`"),
                ));
            }
            match field(o, "include_usage") {
                Some(v) => boolean(v, "stream_options.include_usage")?,
                None => false,
            }
        }
        Some(_) => return Err(bad("stream_options", "an object")),
    };
    Ok(Common {
        model,
        max_tokens,
        sampling: SamplerParams {
            temperature,
            top_k,
            top_p,
            repeat_penalty: 1.0,
            repeat_last_n: 0,
            seed,
        },
        stop,
        stream,
        include_usage,
    })
}

/// The text of a message's `content`: a string, or an array of `{"type": "text", "text"}`.
fn content(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let pp = format!("{param}[{j}]");
                let text = p
                    .as_object()
                    .filter(|o| o.get("type").and_then(Value::as_str) == Some("text"))
                    .filter(|o| o.keys().all(|k| k == "type" || k == "text"))
                    .and_then(|o| o.get("text"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        bad(&pp, "a text part: {\"type\": \"text\", \"text\": \"...\"}")
                    })?;
                out.push_str(text);
            }
            Ok(out)
        }
        _ => Err(bad(param, "a string or an array of text parts")),
    }
}

/// Parse a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8], max_tokens_limit: usize) -> Result<ChatRequest, ApiError> {
    let map = object(body, &["messages"])?;
    let msgs = match field(&map, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(_) => return Err(bad("messages", "a non-empty array of messages")),
        None => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` is required",
            ));
        }
    };
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let p = format!("messages[{i}]");
        let Value::Object(o) = m else {
            return Err(bad(&p, "an object with `role` and `content`"));
        };
        if let Some(k) = o
            .keys()
            .find(|k| !["role", "content", "name"].contains(&k.as_str()))
        {
            return Err(ApiError::invalid_param(
                format!("{p}.{k}"),
                format!("unknown field `{p}.{k}`"),
            ));
        }
        let rp = format!("{p}.role");
        let role = match o.get("role").map(|r| string(r, &rp)).transpose()? {
            Some("developer") => "system",
            Some(r @ ("system" | "user" | "assistant")) => r,
            _ => {
                return Err(bad(
                    &rp,
                    "\"system\", \"developer\", \"user\" or \"assistant\"",
                ));
            }
        };
        let cp = format!("{p}.content");
        let text = match o.get("content") {
            Some(Value::Null) | None if role == "assistant" => String::new(),
            Some(v) => content(v, &cp)?,
            None => {
                return Err(ApiError::invalid_param(
                    cp.clone(),
                    format!("`{cp}` is required"),
                ));
            }
        };
        if let Some(n) = o.get("name") {
            string(n, &format!("{p}.name"))?;
        }
        messages.push(ChatMessage::new(role, text));
    }
    Ok(ChatRequest {
        messages,
        common: common(&map, max_tokens_limit)?,
    })
}

fn token_ids(a: &[Value], param: &str) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(param, "a string, or an array of token ids"))
        })
        .collect()
}

/// Parse a `/v1/completions` body. One prompt per request: a string, an array holding one
/// string, an array of token ids, or an array holding one array of token ids.
pub fn parse_completion(
    body: &[u8],
    max_tokens_limit: usize,
) -> Result<CompletionRequest, ApiError> {
    let map = object(body, &["prompt"])?;
    let many = || {
        ApiError::invalid_param(
            "prompt",
            "only one prompt per request is supported (n = 1): send the prompts one at a time",
        )
    };
    let prompt = match field(&map, "prompt") {
        None => return Err(ApiError::invalid_param("prompt", "`prompt` is required")),
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [] => return Err(bad("prompt", "a non-empty string or array")),
            [Value::String(s)] => Prompt::Text(s.clone()),
            [Value::Array(ids)] => Prompt::Tokens(token_ids(ids, "prompt")?),
            [Value::Number(_), ..] => Prompt::Tokens(token_ids(a, "prompt")?),
            [Value::String(_) | Value::Array(_), ..] => return Err(many()),
            _ => return Err(bad("prompt", "a string, or an array of token ids")),
        },
        Some(_) => return Err(bad("prompt", "a string, or an array of token ids")),
    };
    Ok(CompletionRequest {
        prompt,
        common: common(&map, max_tokens_limit)?,
    })
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
