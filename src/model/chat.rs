//! Chat prompts: renders a model's `tokenizer.chat_template` (Jinja) with minijinja.
//!
//! Templates written for Hugging Face expect `messages` (a list of `{role, content}` maps),
//! `add_generation_prompt`, `bos_token`, `eos_token` and a `raise_exception(message)` function,
//! and are rendered with `trim_blocks` and `lstrip_blocks`. A few common Python string and dict
//! methods (`strip`, `startswith`, `items`, ...) are provided because templates call them.
//!
//! A template comes from the model file, so it is untrusted code:
//! - it cannot reach anything outside the render: minijinja is built without `include`,
//!   `import` and `extends` (they do not parse), no loader is set, and no function or method
//!   touches files, the environment or the network;
//! - each render has a fuel budget ([`render_fuel`]) that bounds both the instructions run and
//!   the bytes created (loops, string repetition, concatenation, `replace`, ...), and a
//!   recursion limit ([`RECURSION_LIMIT`]); going past either fails with a typed error;
//! - the template source is at most [`MAX_TEMPLATE_BYTES`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use thiserror::Error;

use crate::gguf::{GgufError, GgufFile};

/// ChatML, used when a model has no `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// Deepest nesting of macro calls, loops and blocks a render may reach.
pub const RECURSION_LIMIT: usize = 100;
/// Largest accepted template source (real templates are a few KiB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;
/// Fuel every render gets whatever its input: about this many instructions, or 64 times this
/// many bytes of strings and lists created.
pub const BASE_FUEL: u64 = 200_000;
/// Extra fuel per 64 bytes of input (messages and the BOS/EOS texts): enough for a template to
/// copy its input this many times.
pub const FUEL_PER_INPUT_BLOCK: u64 = 32;

/// The fuel a render of `messages` gets: [`BASE_FUEL`] plus [`FUEL_PER_INPUT_BLOCK`] per 64
/// bytes of input.
pub fn render_fuel(messages: &[ChatMessage], bos_token: &str, eos_token: &str) -> u64 {
    let bytes = messages
        .iter()
        .map(|m| m.role.len() as u64 + m.content.len() as u64)
        .fold(
            bos_token.len() as u64 + eos_token.len() as u64,
            u64::saturating_add,
        );
    BASE_FUEL.saturating_add((bytes / 64 + 1).saturating_mul(FUEL_PER_INPUT_BLOCK))
}

/// Everything that can go wrong while preparing or rendering a chat prompt.
#[derive(Debug, Error)]
pub enum ChatError {
    #[error("reading chat template metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("the chat template does not compile: {0:#}")]
    Syntax(#[source] Error),
    #[error("rendering the chat template failed: {0:#}")]
    Render(#[source] Error),
    #[error("the chat template is {len} bytes, more than the {max} accepted")]
    TooLarge { len: usize, max: usize },
    #[error(
        "the chat template used up its fuel ({fuel}): it runs too long or builds too much text"
    )]
    OutOfFuel { fuel: u64 },
    #[error("the chat template nests deeper than {limit} levels")]
    TooDeep { limit: usize },
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `"system"`, `"user"` or `"assistant"` (templates may accept others).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A compiled chat template with the BOS/EOS texts it may refer to.
pub struct ChatTemplate {
    /// Locked while rendering: each render sets its own fuel.
    env: Mutex<Environment<'static>>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles a template. `bos_token`/`eos_token` are the texts of those tokens.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, ChatError> {
        let source = source.into();
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(ChatError::TooLarge {
                len: source.len(),
                max: MAX_TEMPLATE_BYTES,
            });
        }
        let mut env = Environment::new();
        env.set_recursion_limit(RECURSION_LIMIT);
        env.set_fuel(Some(BASE_FUEL));
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(ChatError::Syntax)?;
        env.set_syntax(syntax);
        env.add_function("raise_exception", raise_exception);
        env.set_unknown_method_callback(python_method);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(ChatError::Syntax)?;
        Ok(ChatTemplate {
            env: Mutex::new(env),
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// ChatML with the given BOS/EOS texts.
    pub fn chatml(
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, ChatError> {
        Self::new(CHATML_TEMPLATE, bos_token, eos_token)
    }

    /// The template of a GGUF file (`tokenizer.chat_template`, ChatML when absent), with the
    /// texts of its BOS and EOS tokens.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, ChatError> {
        let source = gguf
            .get_str("tokenizer.chat_template")?
            .unwrap_or(CHATML_TEMPLATE)
            .to_string();
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let text_of = |key: &str| -> Result<String, ChatError> {
            let id = gguf.get_u64(key)?;
            Ok(match (id, &tokens) {
                (Some(id), Some(tokens)) => usize::try_from(id)
                    .ok()
                    .and_then(|i| tokens.get(i))
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                _ => String::new(),
            })
        };
        let bos = text_of("tokenizer.ggml.bos_token_id")?;
        let eos = text_of("tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos, eos)
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders a conversation. With `add_generation_prompt`, the prompt ends with the opening
    /// of an assistant turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let fuel = render_fuel(messages, &self.bos_token, &self.eos_token);
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role", Value::from(m.role.as_str()));
                map.insert("content", Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let mut ctx = BTreeMap::new();
        ctx.insert("messages", Value::from(messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        ctx.insert("bos_token", Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token", Value::from(self.eos_token.as_str()));
        let mut env = self.env.lock().unwrap_or_else(|e| e.into_inner());
        env.set_fuel(Some(fuel));
        let template = env.get_template(TEMPLATE_NAME).map_err(ChatError::Render)?;
        template
            .render(Value::from(ctx))
            .map_err(|e| render_error(e, fuel))
    }
}

/// Names running out of fuel and recursing too deep (anywhere in the error's chain).
fn render_error(e: Error, fuel: u64) -> ChatError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cause {
        if let Some(m) = c.downcast_ref::<Error>() {
            if m.kind() == ErrorKind::OutOfFuel {
                return ChatError::OutOfFuel { fuel };
            }
            if m.kind() == ErrorKind::InvalidOperation
                && m.detail() == Some("recursion limit exceeded")
            {
                return ChatError::TooDeep {
                    limit: RECURSION_LIMIT,
                };
            }
        }
        cause = c.source();
    }
    ChatError::Render(e)
}

/// Charges the render for about `bytes` bytes it is about to create.
fn charge(state: &State, bytes: usize) -> Result<(), Error> {
    state.consume_fuel((bytes / 64) as u64 + 1)
}

/// `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised an exception: {message}"),
    ))
}

fn arg_str(args: &[Value], i: usize) -> Option<&str> {
    args.get(i).and_then(Value::as_str)
}

fn wrong_args(method: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("wrong arguments to .{method}()"),
    )
}

/// Python methods that chat templates call on strings and dicts.
fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        return string_method(state, s, method, args);
    }
    if value.kind() == ValueKind::Map {
        return map_method(value, method, args);
    }
    Err(Error::from(ErrorKind::UnknownMethod))
}

/// String methods. Those whose result can be much larger than their inputs (`replace`,
/// `split`, `join`) pay for it before building it.
fn string_method(state: &State, s: &str, method: &str, args: &[Value]) -> Result<Value, Error> {
    let strip_chars = |args: &[Value]| -> Option<Vec<char>> {
        arg_str(args, 0).map(|c| c.chars().collect::<Vec<char>>())
    };
    let prefix_test = |args: &[Value], f: &dyn Fn(&str) -> bool| -> Result<Value, Error> {
        let Some(arg) = args.first() else {
            return Err(wrong_args(method));
        };
        if let Some(p) = arg.as_str() {
            return Ok(Value::from(f(p)));
        }
        // A tuple or list of alternatives.
        for item in arg.try_iter()? {
            if item.as_str().is_some_and(f) {
                return Ok(Value::from(true));
            }
        }
        Ok(Value::from(false))
    };
    Ok(match method {
        "strip" => Value::from(match strip_chars(args) {
            Some(c) => s.trim_matches(&c[..]),
            None => s.trim(),
        }),
        "lstrip" => Value::from(match strip_chars(args) {
            Some(c) => s.trim_start_matches(&c[..]),
            None => s.trim_start(),
        }),
        "rstrip" => Value::from(match strip_chars(args) {
            Some(c) => s.trim_end_matches(&c[..]),
            None => s.trim_end(),
        }),
        "startswith" => return prefix_test(args, &|p| s.starts_with(p)),
        "endswith" => return prefix_test(args, &|p| s.ends_with(p)),
        "upper" => Value::from(s.to_uppercase()),
        "lower" => Value::from(s.to_lowercase()),
        "capitalize" => {
            let mut chars = s.chars();
            Value::from(match chars.next() {
                Some(first) => first
                    .to_uppercase()
                    .chain(chars.flat_map(char::to_lowercase))
                    .collect(),
                None => String::new(),
            })
        }
        "title" => {
            let mut out = String::with_capacity(s.len());
            let mut prev_cased = false;
            for c in s.chars() {
                if prev_cased {
                    out.extend(c.to_lowercase());
                } else {
                    out.extend(c.to_uppercase());
                }
                prev_cased = c.is_alphabetic();
            }
            Value::from(out)
        }
        "replace" => {
            let (Some(old), Some(new)) = (arg_str(args, 0), arg_str(args, 1)) else {
                return Err(wrong_args(method));
            };
            let limit = match args.get(2).and_then(|v| i64::try_from(v.clone()).ok()) {
                Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
                _ => usize::MAX,
            };
            // An empty pattern matches before every character and at the end.
            let matches = if old.is_empty() {
                s.chars().count().saturating_add(1)
            } else {
                s.matches(old).count()
            }
            .min(limit);
            charge(
                state,
                s.len().saturating_add(matches.saturating_mul(new.len())),
            )?;
            Value::from(s.replacen(old, new, limit))
        }
        "split" => {
            let sep = arg_str(args, 0);
            let n = match sep {
                Some("") => return Err(wrong_args(method)),
                Some(sep) => s.matches(sep).count().saturating_add(1),
                None => s.split_whitespace().count(),
            };
            charge(
                state,
                s.len()
                    .saturating_add(n.saturating_mul(std::mem::size_of::<Value>())),
            )?;
            let parts: Vec<Value> = match sep {
                Some(sep) => s.split(sep).map(Value::from).collect(),
                None => s.split_whitespace().map(Value::from).collect(),
            };
            Value::from(parts)
        }
        "join" => {
            let Some(items) = args.first() else {
                return Err(wrong_args(method));
            };
            let mut out = String::new();
            for (i, v) in items.try_iter()?.enumerate() {
                let part = v.to_string();
                let sep = if i > 0 { s } else { "" };
                charge(state, sep.len().saturating_add(part.len()))?;
                out.push_str(sep);
                out.push_str(&part);
            }
            Value::from(out)
        }
        "find" => {
            let Some(needle) = arg_str(args, 0) else {
                return Err(wrong_args(method));
            };
            Value::from(match s.find(needle) {
                Some(byte) => s[..byte].chars().count() as i64,
                None => -1,
            })
        }
        "count" => {
            let Some(needle) = arg_str(args, 0) else {
                return Err(wrong_args(method));
            };
            if needle.is_empty() {
                Value::from(s.chars().count() + 1)
            } else {
                Value::from(s.matches(needle).count())
            }
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    })
}

fn map_method(map: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    Ok(match method {
        "items" => {
            let mut pairs = Vec::new();
            for key in map.try_iter()? {
                let v = map.get_item(&key)?;
                pairs.push(Value::from(vec![key, v]));
            }
            Value::from(pairs)
        }
        "keys" => Value::from(map.try_iter()?.collect::<Vec<Value>>()),
        "values" => {
            let mut values = Vec::new();
            for key in map.try_iter()? {
                values.push(map.get_item(&key)?);
            }
            Value::from(values)
        }
        "get" => {
            let Some(key) = args.first() else {
                return Err(wrong_args(method));
            };
            let v = map.get_item(key)?;
            if v.is_undefined() {
                args.get(1).cloned().unwrap_or(Value::from(()))
            } else {
                v
            }
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template, as stored in its GGUF.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_single_turn() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t.render(&[ChatMessage::user("Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&[ChatMessage::user("Hi")], false).unwrap();
        assert!(out.ends_with("<|im_start|>user\nHi<|im_end|>\n"));
    }

    #[test]
    fn chatml_fallback_multi_turn() {
        let t = ChatTemplate::chatml("", "<|im_end|>").unwrap();
        let out = t
            .render(
                &[
                    ChatMessage::system("Be brief."),
                    ChatMessage::user("2+2?"),
                    ChatMessage::assistant("4"),
                    ChatMessage::user("Thanks"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    /// A Llama-2 style template: bos/eos variables, raise_exception, strip(), trim/lstrip blocks.
    const LLAMA2_STYLE: &str = "{% if messages[0]['role'] == 'system' %}
    {% set system = '<<SYS>>\\n' + messages[0]['content'].strip() + '\\n<</SYS>>\\n\\n' %}
    {% set messages = messages[1:] %}
{% else %}
    {% set system = '' %}
{% endif %}
{% for message in messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'].strip() + ' [/INST]' }}{% else %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}
{% endfor %}";

    #[test]
    fn llama2_style_template() {
        let t = ChatTemplate::new(LLAMA2_STYLE, "<s>", "</s>").unwrap();
        let out = t
            .render(
                &[
                    ChatMessage::system(" Be kind. "),
                    ChatMessage::user("Hi "),
                    ChatMessage::assistant("Hello!"),
                    ChatMessage::user("Bye"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<s>[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]"
        );
        let err = t
            .render(&[ChatMessage::user("a"), ChatMessage::user("b")], true)
            .unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn python_methods() {
        let src = "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'abc'.startswith(('z', 'a')) }}|\
{{ 'a,b'.split(',') | join('+') }}|{{ 'hi there'.title() }}|{{ 'aXa'.replace('a', 'b') }}|\
{{ messages[0].get('missing', 'd') }}|{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t.render(&[ChatMessage::user("q")], false).unwrap();
        assert_eq!(out, "a b|a|True|a+b|Hi There|bXb|d|content=q;role=user;");
    }

    #[test]
    fn from_gguf_falls_back_to_chatml() {
        use crate::gguf::MetaValue;
        use crate::gguf::writer::GgufWriter;
        let tokens = ["<unk>", "<s>", "</s>"];
        let mut w = GgufWriter::new();
        w.meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                tokens
                    .iter()
                    .map(|t| MetaValue::String(t.to_string()))
                    .collect(),
            ),
        );
        w.meta("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
        w.meta("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
        let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let t = ChatTemplate::from_gguf(&g).unwrap();
        assert_eq!(t.source(), CHATML_TEMPLATE);
        assert_eq!((t.bos_token(), t.eos_token()), ("<s>", "</s>"));
        assert_eq!(
            t.render(&[ChatMessage::user("Hi")], true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );

        w.meta(
            "tokenizer.chat_template",
            MetaValue::String("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".into()),
        );
        let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let t = ChatTemplate::from_gguf(&g).unwrap();
        assert_eq!(
            t.render(&[ChatMessage::user("x")], false).unwrap(),
            "<s>x</s>"
        );
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new("{% for x in %}", "", "").unwrap_err();
        assert!(matches!(err, ChatError::Syntax(_)));
    }
}
